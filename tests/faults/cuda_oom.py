"""A tiny model on the GPU whose forward in step 1 asks for twice the device's memory: a real
CUDA out-of-memory, for tests/test_measure_oom.py::test_real_cuda_oom_under_measure (CUDA only)."""

import torch

model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                            torch.nn.Linear(1024, 256)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
total = torch.cuda.get_device_properties(0).total_memory
step = 0


def strike(module, args):
    if step == 1:
        torch.empty(2 * total, dtype=torch.uint8, device="cuda")  # the line the report names


model[2].register_forward_pre_hook(strike)
for step in range(3):
    model(torch.randn(64, 256, device="cuda")).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
