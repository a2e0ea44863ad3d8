"""Measure, on CPU, the 16-bit copy DeepSpeed ZeRO-1/2 makes of a rank's gradient partition in
``optimizer.step()`` before casting it to fp32 (``estimate/model_states.py``, "flattened ...
gradients of the gradient partition (cast input)").

``DeepSpeedZeroOptimizer.step`` (deepspeed/runtime/zero/stage_1_and_2.py) builds the fp32
gradient as ``self.flatten(self.averaged_gradients[i]).to(fp32)`` (``flatten_dense_tensors_aligned``
on the last rank, which pads and then calls ``self.flatten``). This script runs one process
(gloo, CPU, bf16, the optimizer DeepSpeed builds with ``torch_adam``), wraps the optimizer's
``flatten`` during ``step()`` and records, for every call: the elements and bytes of the result,
whether its storage is one of the gradients' storages (a view) or a new allocation (a copy), and
the partition size. Result: ``validation/zero12_cast_copy.json``.

    PYTHONPATH=src python scripts/measure_zero12_cast_copy.py
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "validation" / "zero12_cast_copy.json"


def _run(stage: int) -> dict:
    import deepspeed
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(3)])
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
              "bf16": {"enabled": True},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
              "zero_optimization": {"stage": stage, "contiguous_gradients": True,
                                    "overlap_comm": False}}
    engine, opt, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                             config=config)
    calls: list[dict] = []
    original = opt.flatten
    in_step = {"on": False}

    def flatten(tensors):
        out = original(tensors)
        if in_step["on"]:
            grads = {t.untyped_storage().data_ptr() for t in tensors}
            calls.append({"elements": out.numel(), "dtype": str(out.dtype).removeprefix("torch."),
                          "bytes": out.numel() * out.element_size(),
                          "new_storage": out.untyped_storage().data_ptr() not in grads})
        return out

    opt.flatten = flatten
    step = opt.step

    def traced_step(*a, **k):
        in_step["on"] = True
        try:
            return step(*a, **k)
        finally:
            in_step["on"] = False

    opt.step = traced_step
    for _ in range(2 * engine.gradient_accumulation_steps()):
        x = torch.randn(2, 256, dtype=torch.bfloat16)
        engine.backward(engine(x).float().pow(2).mean())
        engine.step()
    partition = sum(int(p) for p in opt.partition_size)
    return {"zero_stage": stage, "trainable_elements": sum(p.numel() for p in model.parameters()),
            "partition_elements": partition, "steps": 2, "flatten_calls_in_step": calls}


def main() -> int:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29613")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    import deepspeed
    import torch

    deepspeed.init_distributed(dist_backend="gloo")
    runs = [_run(stage) for stage in (1, 2)]
    data = {"command": "PYTHONPATH=src python scripts/measure_zero12_cast_copy.py",
            "versions": {"torch": torch.__version__, "deepspeed": deepspeed.__version__},
            "device": "cpu", "world_size": 1, "runs": runs}
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    for r in runs:
        print(f"ZeRO-{r['zero_stage']}: partition {r['partition_elements']} elements; "
              f"flatten in step: {r['flatten_calls_in_step']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
