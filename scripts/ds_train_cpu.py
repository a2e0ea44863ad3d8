"""Launch a ds_config written by ``memplan export --to deepspeed`` on CPU (torchrun + gloo): a
tiny MLP, two training steps, and each rank's parameter and optimizer-state bytes counted from
the tensors (the CPU accelerator's memory counter is process RSS, facts/engines-on-cpu.md).

    memplan export MODEL --to deepspeed --zero 3 --gpus 2 -o ds_config.json
    torchrun --nproc-per-node 2 scripts/ds_train_cpu.py --deepspeed ds_config.json

The file is used as written, with one CPU-only addition: ``optimizer.params.torch_adam = true``,
since DeepSpeed's fused Adam is not built without a GPU toolchain.
"""

from __future__ import annotations

import argparse
import json
import os

import deepspeed
import torch
import torch.distributed as dist


def _bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        key = t.untyped_storage().data_ptr()
        if t.numel() and key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--deepspeed", required=True, help="ds_config.json from memplan export")
    ap.add_argument("--hidden", type=int, default=512)
    args = ap.parse_args()
    with open(args.deepspeed) as f:
        config = json.load(f)
    if "optimizer" in config:
        config["optimizer"].setdefault("params", {})["torch_adam"] = True
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(args.hidden, args.hidden) for _ in range(4)])
    engine, opt, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                             config=config)
    micro = config["train_micro_batch_size_per_gpu"]
    dtype = torch.bfloat16 if config.get("bf16", {}).get("enabled") else torch.float32
    for _ in range(2 * engine.gradient_accumulation_steps()):
        x = torch.randn(micro, args.hidden, dtype=dtype)
        loss = engine(x).float().pow(2).mean()
        engine.backward(loss)
        engine.step()
    params = list(engine.module.parameters())
    local = [getattr(p, "ds_tensor", p) for p in params]  # ZeRO-3: this rank's shard
    states = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    row = {"rank": dist.get_rank(), "world": dist.get_world_size(),
           "zero": engine.zero_optimization_stage(),
           "param_elements": sum(getattr(p, "ds_numel", p.numel()) for p in params),
           "param_bytes": _bytes(local), "optimizer_state_bytes": _bytes(states),
           "loss": round(loss.item(), 6)}
    rows = [None] * dist.get_world_size()
    dist.all_gather_object(rows, row)  # rank 0 prints every row: the ranks' own prints interleave
    if dist.get_rank() == 0:
        print("\n".join(json.dumps(r) for r in rows), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    main()
