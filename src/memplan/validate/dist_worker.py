"""One rank of a distributed validation run (``memplan validate --nproc N``), started by
torchrun on the gloo backend on CPU. Not imported by memplan: torchrun runs it as a script.

It builds the case's tiny model from its config.json (fp32, fixed seed), wraps it the way the
engine does, trains ``--steps`` steps on random tokens and, after each step's ``zero_grad``,
counts every live tensor byte of the process: all ``torch.Tensor`` objects the garbage
collector can see, de-duplicated by storage (DTensor views and ``to_local()`` share storages;
summing tensors instead of storages over-counts several times). That counter is independent of
memplan's own tracker and of the estimator. Each rank writes ``rank<R>.json`` into ``--out``.

Engines:
- ``deepspeed``: ``deepspeed.initialize`` with the ds_config that ``memplan export --to
  deepspeed`` wrote for the case's recipe (``--ds-config``), plus ``"torch_adam": true`` in the
  optimizer's params: no fused CPU Adam is built on a CPU-only machine.
- ``fsdp2``: ``fully_shard`` on every decoder layer and then on the root, with
  ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` under bf16-mixed, and torch
  AdamW (its default implementation on the device).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
from pathlib import Path


def live_tensor_bytes() -> int:
    """Bytes of every distinct storage behind a live tensor of this process."""
    import torch

    gc.collect()
    seen: dict[int, int] = {}
    for obj in gc.get_objects():
        try:
            if not isinstance(obj, torch.Tensor) or obj.is_meta:
                continue
            local = getattr(obj, "_local_tensor", None)  # DTensor: its shard is the storage
            t = local if isinstance(local, torch.Tensor) else obj
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError, ReferenceError):
            continue
        if st.data_ptr() and st.nbytes():
            seen[st.data_ptr()] = max(seen.get(st.data_ptr(), 0), st.nbytes())
    return sum(seen.values())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--engine", choices=("deepspeed", "fsdp2"), required=True)
    ap.add_argument("--ds-config", default="")
    ap.add_argument("--precision", default="bf16-mixed")
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    import torch
    import torch.distributed as dist
    from transformers import AutoConfig, AutoModelForCausalLM

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.manual_seed(0)
    baseline = live_tensor_bytes()
    cfg = AutoConfig.for_model(**json.loads(Path(a.config).read_text()))
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.config.use_cache = False
    bf16 = a.precision == "bf16-mixed"
    if a.engine == "deepspeed":
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
        ds = json.loads(Path(a.ds_config).read_text())
        ds.setdefault("optimizer", {"type": "AdamW"}).setdefault("params", {})
        ds["optimizer"]["params"].update({"lr": 1e-4, "torch_adam": True})
        engine, *_ = deepspeed.initialize(model=model, config=ds,
                                          model_parameters=model.parameters())

        def step(ids: torch.Tensor) -> None:
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
    else:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        dist.init_process_group("gloo")
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None,
                                  reduce_dtype=torch.float32)
        for layer in model.model.layers:
            fully_shard(layer, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(ids: torch.Tensor) -> None:
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    after: list[int] = []
    gen = torch.Generator().manual_seed(1 + rank)
    for _ in range(a.steps):
        ids = torch.randint(0, cfg.vocab_size, (a.micro_batch, a.seq_len), generator=gen)
        step(ids)
        del ids
        after.append(live_tensor_bytes() - baseline)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps(
        {"rank": rank, "world_size": world, "engine": a.engine,
         "between_steps_bytes": after}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
