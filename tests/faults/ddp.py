"""Two-rank DDP training on gloo (CPU) for tests/test_measure_faults.py: rank KILL_RANK SIGKILLs
itself in the forward of step 2; the other rank is then stopped by torchrun."""

import os
import signal

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
kill_rank = int(os.environ.get("KILL_RANK", "1"))
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32)))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(50):
    loss = model(torch.randn(8, 32)).pow(2).mean()
    if step == 2 and rank == kill_rank:
        os.kill(os.getpid(), signal.SIGKILL)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
dist.destroy_process_group()
