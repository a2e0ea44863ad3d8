"""Child process for tests/test_host_measure.py: does one host-side job and prints, as JSON,
the peak RSS above its post-import baseline (Linux VmHWM, reset through /proc/self/clear_refs)
and psutil's view. Run as ``python probe.py MODE ARGS_JSON``; never imported by memplan."""

from __future__ import annotations

import json
import sys
import tempfile
import time


def _hwm() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def _reset_hwm() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _model(layers: int, width: int, device: str = "cpu"):
    import torch

    with torch.device(device):
        return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


def main() -> None:
    import psutil
    import torch

    mode, args = sys.argv[1], json.loads(sys.argv[2])
    me = psutil.Process()
    base = me.memory_info().rss
    _reset_hwm()
    out: dict = {}
    if mode == "load-full":            # random init, then a full state dict next to it
        m = _model(args["layers"], args["width"])
        sd = torch.load(args["path"], weights_only=True)
        m.load_state_dict(sd)
        out["checksum"] = float(sum(p.detach().sum() for p in m.parameters()))
    elif mode == "load-meta-idle":     # a non-zero rank under rank0 loading: meta, no weights
        m = _model(args["layers"], args["width"], "meta")
        out["checksum"] = 0.0
    elif mode == "load-assign":        # meta init + mmap + assign: one copy (low_cpu_mem_usage)
        m = _model(args["layers"], args["width"], "meta")
        sd = torch.load(args["path"], weights_only=True, mmap=True)
        m.load_state_dict(sd, assign=True)
        out["checksum"] = float(sum(p.detach().sum() for p in m.parameters()))
    elif mode in ("ckpt-async", "ckpt-sync"):
        import warnings

        import torch.distributed.checkpoint as dcp

        m = _model(args["layers"], args["width"])
        opt = torch.optim.AdamW(m.parameters())
        m(torch.randn(2, args["width"])).sum().backward()
        opt.step()
        state = {"model": m.state_dict(), "optim": opt.state_dict()}
        out["state_bytes"] = sum(t.numel() * t.element_size() for t in m.parameters()) + sum(
            v.numel() * v.element_size() for s in opt.state.values() for v in s.values()
            if torch.is_tensor(v) and v.dim() > 0)
        base = me.memory_info().rss
        _reset_hwm()
        with tempfile.TemporaryDirectory() as d, warnings.catch_warnings():
            warnings.simplefilter("ignore")   # DCP warns that no process group is initialised
            if mode == "ckpt-async":
                dcp.async_save(state, checkpoint_id=d).result()
            else:
                dcp.save(state, checkpoint_id=d)
    elif mode == "adamw-step":         # transient bytes of a CPU AdamW step (states exist)
        m = _model(args["layers"], args["width"])
        impl = args.get("impl", "for-loop")
        opt = torch.optim.AdamW(m.parameters(), foreach=impl == "foreach", fused=impl == "fused")
        m(torch.randn(2, args["width"])).sum().backward()
        opt.step()
        base = me.memory_info().rss
        _reset_hwm()
        opt.step()
    elif mode == "dataloader":         # tree PSS of a DataLoader with prefetching workers
        import numpy as np
        from torch.utils.data import DataLoader

        class Tokens(torch.utils.data.Dataset):
            def __init__(self, n: int, seq: int):
                self.data = np.arange(n * seq, dtype=np.int64).reshape(n, seq) % 50_000

            def __len__(self) -> int:
                return len(self.data)

            def __getitem__(self, i: int):
                x = torch.from_numpy(self.data[i])
                return {"input_ids": x, "attention_mask": torch.ones_like(x), "labels": x.clone()}

        ds = Tokens(args["samples"], args["seq"])

        def tree_pss() -> int:
            procs = [me, *me.children(recursive=True)]
            return sum(p.memory_full_info().pss for p in procs)

        def used() -> int:   # system-wide committed memory: private pages + /dev/shm batches
            info = dict(line.split(":", 1) for line in open("/proc/meminfo"))
            kib = {k: int(v.split()[0]) for k, v in info.items() if k in ("MemTotal",
                                                                           "MemAvailable")}
            return (kib["MemTotal"] - kib["MemAvailable"]) * 1024

        import ctypes
        import gc

        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        time.sleep(0.5)
        before, before_used = tree_pss(), used()
        dl = DataLoader(ds, batch_size=args["batch"], num_workers=args["workers"],
                        prefetch_factor=args["prefetch"], pin_memory=False, shuffle=True)
        it = iter(dl)
        batch = next(it)
        time.sleep(args.get("settle_s", 2.0))   # let the workers fill their prefetch queues
        out["tree_pss_delta"] = tree_pss() - before
        out["used_delta"] = used() - before_used
        out["workers_seen"] = len(me.children(recursive=True))
        out["worker_uss"] = [c.memory_full_info().uss for c in me.children(recursive=True)]
        out["batch_bytes"] = sum(v.numel() * v.element_size() for v in batch.values())
        del it
    out["peak_delta"] = _hwm() - base
    out["rss_delta"] = me.memory_info().rss - base
    time.sleep(args.get("hold_s", 0))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
