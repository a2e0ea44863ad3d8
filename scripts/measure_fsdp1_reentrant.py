"""FSDP1 + PEFT's wrap policy + the HF Trainer's *reentrant* gradient checkpointing, the setup
of PEFT's own QLoRA/LoRA + FSDP example (issue #11 item 3, golden rows GT136/GT138/GT140: PEFT
``examples/sft``, ``--gradient_checkpointing True --use_reentrant True``, accelerate FSDP1 with
``fsdp_use_orig_params: false``): does it hold more than memplan's estimate for the same recipe
(which models torch's non-reentrant checkpointing)?

torchrun, 2 ranks, gloo, CPU (torch 2.13): the tiny Llama of validate/tiny/llama.json with
memplan's LoRA (fp32), ``model.gradient_checkpointing_enable(use_reentrant=...)`` and
``enable_input_require_grads()`` (what the HF Trainer and PEFT's
``prepare_model_for_kbit_training`` do for reentrant checkpointing), then
``FullyShardedDataParallel`` exactly as ``memplan validate --nproc`` configures FSDP1
(``dist_worker._fsdp1``: PEFT's ``fsdp_auto_wrap_policy``, ``use_orig_params=False``), two
steps measured by ``dist_worker.measure``. Rank 0 writes ``validation/fsdp1_reentrant.json``
with the measured and estimated peaks, for ``use_reentrant`` True and False.

Usage: ``PYTHONPATH=src python -m torch.distributed.run --nproc-per-node=2
scripts/measure_fsdp1_reentrant.py``
"""

from __future__ import annotations

import gc
import json
from pathlib import Path

import torch
import torch.distributed as dist

from memplan.estimate import estimate
from memplan.hardware import cpu_device
from memplan.model import load_model
from memplan.recipe import Recipe
from memplan.runtime.workload import build_model
from memplan.units import GIB
from memplan.validate.dist_worker import _fsdp1, _live_tensors, measure

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "src/memplan/validate/tiny/llama.json")
KEYS = {"method": "lora", "precision": "32-true", "micro_batch": 2, "seq_len": 128,
        "engine": "fsdp1", "zero": 3, "fsdp1_wrap": "peft", "use_orig_params": False,
        "checkpointing": "full", "device": "cpu"}
CFG = {"fsdp_config": {"fsdp_version": 1, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                       "fsdp_reshard_after_forward": "FULL_SHARD",
                       "fsdp_use_orig_params": False}, "mixed_precision": "no"}


def _run(reentrant: bool) -> dict:
    recipe = Recipe.from_dict({**KEYS, "gpus": dist.get_world_size()})
    before = {id(t) for t in _live_tensors()}
    model = build_model(TINY, recipe.with_keys(gpus=1, zero=0, engine="auto",
                                               checkpointing="none"), device="cpu",
                        seed=0).model
    model.train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    model.enable_input_require_grads()
    eng = _fsdp1(model, CFG, recipe)
    torch.manual_seed(1 + dist.get_rank())
    ids = torch.randint(0, model.config.vocab_size, (2, 128))
    steps = measure(eng, {"input_ids": ids, "labels": ids.clone()}, 2, before)
    est = estimate(load_model(TINY), recipe, cpu_device(16 * GIB)).worst
    peak = max(s["peak_bytes"] for s in steps)
    out = {"use_reentrant": reentrant, "rank": dist.get_rank(),
           "measured_peak_bytes": peak, "measured_peak_phase": steps[-1]["peak_phase"],
           "estimated_peak_bytes": est.peak_allocated_bytes,
           "error_pct": round((est.peak_allocated_bytes - peak) / peak * 100, 3)}
    del eng, model
    gc.collect()
    return out


def main() -> None:
    dist.init_process_group("gloo")
    rows = [_run(r) for r in (False, True)]
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, rows)
    if dist.get_rank() == 0:
        out = {"torch": torch.__version__, "world_size": dist.get_world_size(), "recipe": KEYS,
               "runs": [r for per_rank in gathered for r in per_rank]}
        (ROOT / "validation" / "fsdp1_reentrant.json").write_text(json.dumps(out, indent=1) + "\n")
        for r in out["runs"]:
            print(r)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
