"""One rank of a distributed validation case: ``torchrun ... -m memplan.validate.dist_worker``.

Started by ``memplan.validate.distributed`` (``memplan validate --nproc N``) on the gloo backend
on CPU. The rank builds the tiny model, applies the engine **from the config file memplan
exported** for the recipe (``memplan.export``), runs two real training steps under the storage
tracker of ``memplan.runtime`` and writes ``rank<R>.json``: its engine, rank, world size, the
config it ran and every step's peaks per phase and moment.

- ``fsdp2``: the accelerate YAML (``export --to accelerate``); its ``fsdp_config`` is applied the
  way accelerate applies FSDP2 (``fully_shard`` on each transformer block, then on the root;
  ``mixed_precision: bf16`` -> ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16,
  output_dtype=bf16)``, accelerate 1.15 ``FullyShardedDataParallelPlugin.set_mixed_precision``;
  ``fsdp_reshard_after_forward``; ``fsdp_activation_checkpointing`` -> non-reentrant
  checkpointing of each block). ``accelerate launch`` itself cannot be used: on CPU it starts
  unsharded processes (``shared/facts/engines-on-cpu.md``).
- ``fsdp1``: the accelerate YAML with ``fsdp_version: 1``, applied as accelerate 1.15's
  ``Accelerator.prepare_model`` does: one ``FullyShardedDataParallel`` over the model with
  ``sharding_strategy`` from ``fsdp_reshard_after_forward``, ``use_orig_params`` from
  ``fsdp_use_orig_params``, ``mixed_precision: bf16`` -> ``MixedPrecision(param_dtype=bf16,
  reduce_dtype=bf16, buffer_dtype=bf16)`` (``set_mixed_precision``, fsdp_version 1), the
  plugin's defaults ``limit_all_gathers=True``, ``forward_prefetch=False``,
  ``backward_prefetch`` from ``fsdp_backward_prefetch`` (``NO_PREFETCH``: None); the auto-wrap policy is the recipe's ``fsdp1_wrap``,
  which the YAML cannot say: ``layers`` = ``TRANSFORMER_BASED_WRAP`` (``transformer_auto_wrap_
  policy`` on ``_no_split_modules``), ``peft`` = PEFT's ``fsdp_auto_wrap_policy(model)``, which
  the HF Trainer installs for a PEFT model (transformers ``update_fsdp_plugin_peft``).
  ``fsdp_activation_checkpointing`` -> ``apply_activation_checkpointing`` with the non-reentrant
  ``checkpoint_wrapper`` on the same policy. Neither FSDP harness wraps the forward in
  accelerate's autocast (the parameters are already in the compute dtype).
- ``deepspeed``: the ds_config JSON (``export --to deepspeed``) is passed to
  ``deepspeed.initialize`` as written, with two overrides recorded in the output:
  ``optimizer.params.torch_adam = true`` (no fused CPU Adam is built on this machine), and
  DeepSpeed's CPU shared-memory all-reduce op is not built (``dist_deepspeed.SHM_OVERRIDE``);
  at ZeRO-0 with a 16-bit config the engine is made to take ``FP16_Optimizer`` as on a GPU
  (``dist_deepspeed.fp16_optimizer_on_cpu``). With a PEFT method under ZeRO-3 the base is
  first partitioned as ``zero.Init`` leaves it (``dist_deepspeed.zero_init_base``).

Counting: every distinct storage once (``DTensor.to_local()`` views and FSDP's padded shards share
storages; the tracker keys storages, not tensors). Storages FSDP2 frees and re-allocates with
``UntypedStorage.resize_`` are re-counted at each resize (``resize_counted``). Tensors alive
before a step that no op has touched yet (flat buffers, master copies) are found by a sweep of
the garbage collector's objects at the step's start, so step 0 sees them from its first instant;
``gc.collect()`` runs first, so that garbage held by reference cycles (freed whenever Python's
collector happens to run, at a different moment on each rank) is not counted. Storages on the
``meta`` device are not counted: they hold no memory. DeepSpeed ZeRO-1/2 keeps a meta tensor of
every parameter's shape (``round_robin_bit16_meta``, stage_1_and_2.py
``DeepSpeedZeroOptimizer.__init__``, 0.19.8), which counting ``nbytes()`` took for a second
16-bit copy of the model (1,115,392 B on the tiny Llama).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..breakdown import Phase
from ..recipe import Recipe
from ..runtime.book import (close_step, end_forward, mark_grads, mark_optimizer_state,
                            mark_params, open_step, step_measurement, tensors_of)
from ..runtime.labels import BATCH, OPTIMIZER, ROOT, ModuleLabeller, layer_stack
from ..runtime.steps import step_record
from ..runtime.tracker import StorageTracker
from .dist_deepspeed import (FUSED_OVERRIDE, SHM_OVERRIDE, fp16_optimizer_on_cpu, skip_shm_op,
                             zero0_16bit, zero_init_base)

__all__ = ["main", "measure", "resize_counted", "run_case"]


@contextlib.contextmanager
def resize_counted(tracker: StorageTracker) -> Iterator[None]:
    """Count ``UntypedStorage.resize_`` (FSDP2's ``free_storage``/``alloc_storage``) as a free
    and a new allocation of the storage."""
    orig = torch.UntypedStorage.resize_

    def resize_(self: Any, size: int) -> Any:
        out = orig(self, size)
        tracker.resized(self)
        return out

    torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.UntypedStorage.resize_ = orig  # type: ignore[method-assign]


def _live_tensors() -> list[torch.Tensor]:
    with warnings.catch_warnings():  # isinstance on lazy module attributes warns
        warnings.simplefilter("ignore")
        return [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]


class _Engine:
    """What the step loop needs from an engine."""

    def __init__(self, *, module: Any, optimizer: Any, forward: Callable[[dict], Any],
                 backward: Callable[[Any], None], step: Callable[[], None],
                 zero_grad: Callable[[], None], extra_params: Callable[[], list[torch.Tensor]],
                 extra_opt: Callable[[], list[torch.Tensor]]) -> None:
        self.module, self.optimizer = module, optimizer
        self.forward, self.backward, self.step, self.zero_grad = forward, backward, step, zero_grad
        self.extra_params, self.extra_opt = extra_params, extra_opt


def _blocks(model: Any) -> list[Any]:
    stack = layer_stack(model)
    return list(model.get_submodule(stack)) if stack else []


def _fsdp2(model: Any, cfg: dict[str, Any], optimizer_name: str) -> _Engine:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    fsdp = cfg["fsdp_config"]
    if fsdp.get("fsdp_version") != 2:
        raise SystemExit(f"fsdp_version={fsdp.get('fsdp_version')}: this harness runs FSDP2")
    if fsdp.get("fsdp_activation_checkpointing"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.get("mixed_precision", "no"))
    # accelerate 1.15 utils/dataclasses.py FullyShardedDataParallelPlugin.set_mixed_precision:
    # {"param_dtype": dtype, "reduce_dtype": dtype, "output_dtype": dtype} for fsdp_version 2
    policy = (MixedPrecisionPolicy(param_dtype=mp, reduce_dtype=mp, output_dtype=mp) if mp
              else MixedPrecisionPolicy())
    reshard = bool(fsdp.get("fsdp_reshard_after_forward", True))
    for block in _blocks(model):
        fully_shard(block, mp_policy=policy, reshard_after_forward=reshard)
    fully_shard(model, mp_policy=policy, reshard_after_forward=reshard)
    return _torch_engine(model, optimizer_name)


def _torch_engine(module: Any, optimizer_name: str) -> _Engine:
    """A wrapped module trained by a torch optimizer over its trainable parameters (FSDP1/2)."""
    from ..runtime.workload import _optimizer

    opt = _optimizer(torch, optimizer_name, [p for p in module.parameters() if p.requires_grad])

    def forward(batch: dict) -> Any:
        return module(**batch).loss

    return _Engine(module=module, optimizer=opt, forward=forward,
                   backward=lambda loss: loss.backward(), step=opt.step,
                   zero_grad=lambda: opt.zero_grad(set_to_none=True),
                   extra_params=lambda: [], extra_opt=lambda: [])


def _backward_prefetch(name: Any) -> Any:
    """accelerate's ``fsdp_backward_prefetch`` as torch's ``BackwardPrefetch`` (``NO_PREFETCH``
    or absent: None, accelerate 1.15 ``FullyShardedDataParallelPlugin.__post_init__``)."""
    from torch.distributed.fsdp import BackwardPrefetch

    name = str(name or "NO_PREFETCH").upper()
    return None if name == "NO_PREFETCH" else BackwardPrefetch[name]


def _fsdp1(model: Any, cfg: dict[str, Any], recipe: Recipe) -> _Engine:
    import functools

    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    fsdp = cfg["fsdp_config"]
    if fsdp.get("fsdp_version") != 1:
        raise SystemExit(f"fsdp_version={fsdp.get('fsdp_version')}: this harness runs FSDP1")
    if fsdp.get("fsdp_auto_wrap_policy") != "TRANSFORMER_BASED_WRAP":
        raise SystemExit(f"fsdp_auto_wrap_policy={fsdp.get('fsdp_auto_wrap_policy')}: this "
                         "harness runs TRANSFORMER_BASED_WRAP")
    from peft import PeftModel

    if str(recipe.engine.fsdp1_wrap) == "peft" and isinstance(model, PeftModel):
        # transformers update_fsdp_plugin_peft: only for a PEFT model (on a plain one PEFT's
        # lambda policy would make every leaf module with a trainable weight a unit)
        from peft.utils.other import fsdp_auto_wrap_policy

        policy = fsdp_auto_wrap_policy(model)
    else:
        names = set(getattr(model, "_no_split_modules", None) or [])
        classes = {type(m) for m in model.modules() if type(m).__name__ in names}
        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=classes)
    mp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.get("mixed_precision", "no"))
    m = FSDP(model, sharding_strategy=ShardingStrategy[fsdp["fsdp_reshard_after_forward"]],
             auto_wrap_policy=policy, device_id=torch.device("cpu"),
             mixed_precision=(MixedPrecision(param_dtype=mp, reduce_dtype=mp, buffer_dtype=mp)
                              if mp else None),
             use_orig_params=bool(fsdp.get("fsdp_use_orig_params", False)),
             limit_all_gathers=True, forward_prefetch=False,
             backward_prefetch=_backward_prefetch(fsdp.get("fsdp_backward_prefetch")))
    if fsdp.get("fsdp_activation_checkpointing"):
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)

        apply_activation_checkpointing(m, checkpoint_wrapper_fn=functools.partial(
            checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
            auto_wrap_policy=policy)
    return _torch_engine(m, str(recipe.optimizer.kind))


def _deepspeed(model: Any, cfg: dict[str, Any], zero3_init: bool = True) -> _Engine:
    import deepspeed

    zero_init_base(model, cfg, zero3_init)
    if "activation_checkpointing" in cfg:  # what the HF Trainer does with checkpointing on
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    with fp16_optimizer_on_cpu(cfg):
        engine, opt, _, _ = deepspeed.initialize(model=model, config=cfg,
                                                 model_parameters=[p for p in model.parameters()
                                                                   if p.requires_grad])
    inner = getattr(opt, "optimizer", opt)

    def extra_params() -> list[torch.Tensor]:
        return [p.ds_tensor for p in engine.module.parameters() if hasattr(p, "ds_tensor")]

    def extra_opt() -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        for name in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat",
                     "fp32_groups_flat"):
            out += [t for t in getattr(opt, name, []) or [] if isinstance(t, torch.Tensor)]
        return out

    def forward(batch: dict) -> Any:
        return engine(**batch).loss

    return _Engine(module=engine.module, optimizer=inner, forward=forward,
                   backward=engine.backward, step=engine.step, zero_grad=engine.zero_grad,
                   extra_params=extra_params, extra_opt=extra_opt)


def measure(eng: _Engine, batch: dict, steps: int, before: set[int]) -> list[dict[str, Any]]:
    """``steps`` training steps of ``eng`` under the storage tracker; one ``step_record`` each.
    Tensors whose ``id`` is in ``before`` (alive before the case was built) are not swept in."""
    tracker = StorageTracker(real_only=True)
    labeller = ModuleLabeller(eng.module, tracker)
    owners = labeller.owner_of_tensor
    out = []
    try:
        with tracker, resize_counted(tracker), torch.autograd.graph.saved_tensors_hooks(
                tracker.pack_hook, tracker.unpack_hook):
            for step in range(steps):
                tracker.set_phase(None)
                gc.collect()  # cycle garbage from the last step: freed now, on every rank alike
                eng.zero_grad()
                params = list(eng.module.parameters()) + list(eng.module.buffers())
                mark_params(tracker, params + eng.extra_params(), owners)
                mark_grads(tracker, params, owners)
                mark_optimizer_state(tracker, eng.optimizer, owners)
                for t in eng.extra_opt():
                    for rec in tracker.see(t):
                        rec.opt = True
                tracker.owner = BATCH
                for t in tensors_of(batch):
                    tracker.see(t)
                tracker.owner = ROOT
                tracker.see_before_step([t for t in _live_tensors() if id(t) not in before])
                open_step(tracker, step)
                tracker.set_phase(Phase.FORWARD)
                loss = eng.forward(batch)
                end_forward(tracker)
                eng.backward(loss)
                mark_grads(tracker, params, owners)
                tracker.set_phase(Phase.OPTIMIZER)
                tracker.owner = OPTIMIZER
                eng.step()
                mark_optimizer_state(tracker, eng.optimizer, owners)
                mark_grads(tracker, params, owners)
                w = close_step(tracker)
                assert w is not None
                del loss
                out.append(step_record(step_measurement(tracker, w)))
    finally:
        tracker.close()
        labeller.detach()
    return out


def run_case(case: dict[str, Any], rank: int) -> dict[str, Any]:
    """Build, wrap and measure one case of the plan on this rank. ``F.linear`` is restored
    after the case: DeepSpeed ZeRO-3 replaces it for the whole process ("This will persist
    unless manually reset", ``partition_parameters.py`` ``_enable_mem_efficient_linear``,
    0.19.8), and its ``LinearFunctionForZeroStage3`` saves a frozen linear's input, which put
    131,072 B more on the FSDP1 LoRA cases that ran after it in one launch."""
    linear = torch.nn.functional.linear
    try:
        return _run_case(case, rank)
    finally:
        torch.nn.functional.linear = linear


def _run_case(case: dict[str, Any], rank: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    recipe = Recipe.from_dict(case["recipe"])
    engine = str(recipe.engine_kind)
    text = Path(case["config"]).read_text()
    overrides: list[str] = []
    if engine == "deepspeed":
        cfg = json.loads(text)
        cfg.setdefault("optimizer", {}).setdefault("params", {})["torch_adam"] = True
        overrides.append("optimizer.params.torch_adam = true (no fused CPU Adam on this machine)")
        overrides.append(SHM_OVERRIDE)
        if zero0_16bit(cfg):
            overrides.append(FUSED_OVERRIDE)
    else:
        import yaml

        cfg = yaml.safe_load(text)
    from ..runtime.workload import build_model

    single = recipe.with_keys(gpus=1, zero=0, offload="none", engine="auto",
                              precision="32-true", checkpointing="none", frozen_dtype="auto")
    before = {id(t) for t in _live_tensors()}
    model = build_model(case["model"], single, device="cpu", seed=0).model
    model.train()
    eng = (_deepspeed(model, cfg, recipe.engine.zero3_init) if engine == "deepspeed"
           else _fsdp1(model, cfg, recipe) if engine == "fsdp1"
           else _fsdp2(model, cfg, str(recipe.optimizer.kind)))
    torch.manual_seed(1 + rank)
    ids = torch.randint(0, model.config.vocab_size, (recipe.batch.micro_batch,
                                                     recipe.batch.seq_len))
    batch = {"input_ids": ids, "labels": ids.clone()}
    steps = measure(eng, batch, int(case.get("steps", 2)), before)
    del eng, model, batch
    gc.collect()
    return {"name": case["name"], "engine": engine, "rank": rank,
            "world_size": dist.get_world_size(), "config_file": case["config"], "config": cfg,
            "overrides": overrides, "steps": steps, "torch": torch.__version__,
            "seconds": round(time.perf_counter() - t0, 3)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="One rank of memplan's distributed validation.")
    ap.add_argument("--plan", required=True,
                    help="JSON list of cases: name, model, recipe, config, out")
    a = ap.parse_args(argv)
    plan = json.loads(Path(a.plan).read_text())
    engines = {str(Recipe.from_dict(c["recipe"]).engine_kind) for c in plan}
    if "deepspeed" in engines:
        import deepspeed

        skip_shm_op()
        deepspeed.init_distributed(dist_backend="gloo")
    else:
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    for case in plan:
        try:
            record = run_case(case, rank)
        except Exception as e:  # noqa: BLE001 - reported per case; the other ranks see it too
            record = {"name": case["name"], "rank": rank, "error": f"{type(e).__name__}: {e}"}
        Path(case["out"]).parent.mkdir(parents=True, exist_ok=True)
        Path(f"{case['out']}.rank{rank}.json").write_text(json.dumps(record, indent=1))
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
