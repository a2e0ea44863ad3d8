"""A tiny training loop that fails on purpose, for tests/test_measure_faults.py.

FAULT (environment): none | sigkill | sigterm | keyboard | exception | oom | workers | enospc;
AT_STEP: the step it strikes in; AT_PHASE: forward | backward | optimizer (where in the step).
"""

import errno
import os
import signal

import torch

FAULT = os.environ.get("FAULT", "none")
AT_STEP = int(os.environ.get("AT_STEP", "2"))
AT_PHASE = os.environ.get("AT_PHASE", "forward")
STEPS = 4
OOM = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB "
       "of which 1.50 GiB is free. Of the allocated memory 75.00 GiB is allocated by PyTorch, "
       "and 1.20 GiB is reserved by PyTorch but unallocated.")


def strike() -> None:
    if FAULT == "sigkill" or FAULT == "workers":
        os.kill(os.getpid(), signal.SIGKILL)
    elif FAULT == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
    elif FAULT == "keyboard":
        raise KeyboardInterrupt
    elif FAULT == "exception":
        raise RuntimeError("boom in the forward")
    elif FAULT == "oom":
        raise torch.OutOfMemoryError(OOM)


def disk_full() -> None:
    """Every later write of the stream and of the child's own report fails with ENOSPC."""
    import memplan.measure.aggregate as agg
    import memplan.measure.stream as st

    class Full:
        def write(self, s):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def flush(self):
            pass

        def close(self):
            pass

    original = st.Stream.flush

    def flush(self):
        self._f = Full()
        original(self)

    def write_json(path, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    st.Stream.flush = flush
    agg.write_json = write_json


torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.utils.data.TensorDataset(torch.randn(64, 64))
loader = torch.utils.data.DataLoader(data, batch_size=8, num_workers=2 if FAULT == "workers" else 0)
step = 0


def maybe(phase: str) -> None:
    if step == AT_STEP and AT_PHASE == phase:
        strike()


model[1].register_forward_hook(lambda m, a, o: maybe("forward"))
opt.register_step_pre_hook(lambda o, a, k: maybe("optimizer"))
for (x,) in loader:
    if step == STEPS:
        break
    if FAULT == "enospc" and step == AT_STEP:
        disk_full()
    y = model(x)
    y.register_hook(lambda g: maybe("backward"))
    loss = (y * y).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    step += 1
