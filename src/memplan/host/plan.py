"""``estimate_host``: host RAM and local NVMe of the busiest node of a job, from its parts.

Inputs are the GPU ``Breakdown`` (offloaded bytes per rank, read through ``off_gpu_bytes``), the
model, the recipe, the node and the ``HostSetup``. Output: a ``HostEstimate`` (categories,
moments, peak, verdict) and an ``NvmeEstimate``. Pure arithmetic; no torch.

**Known limitations**: the per-process baseline is a published CUDA-process figure that varies
0.5-2.5 GB with driver and libraries; the worst node is assumed to hold ranks of the heaviest
pipeline stage only; checkpoint state sizes follow the optimizer-state table below, not the
GPU estimator's items; page cache of memory-mapped data is not counted (reclaimable).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..breakdown import Breakdown, Pool
from ..facts import dtypes, optimizer_facts
from ..facts.constants import constant
from ..hardware.node_hardware import NodeHardware
from ..model.spec import ModelSpec
from ..recipe import Recipe
from ..recipe.engine import host_adam
from ..recipe.host import HostSetup
from ..results import HostEstimate, HostLine, NvmeEstimate
from ..units import dtype_bytes
from . import categories as c

__all__ = ["estimate_host", "host_of", "GpuSide", "optimizer_state_bytes_per_element",
           "RULE_OF_THUMB"]

RULE_OF_THUMB = ("the rule of thumb 'host RAM = 3-5x GPU memory' has no measurement behind it; "
                 "shipped 8-GPU nodes have 1.0x (8x MI300X, MLCommons inference v4.1) to about 4x "
                 "(AWS p3.16xlarge: 488 GiB for 8x 16 GB, torchx named_resources_aws.py) of their "
                 "GPU memory; see `memplan nodes`")

STEADY = ("steady step", "checkpoint save")


def optimizer_state_bytes_per_element(recipe: Recipe) -> float:
    """Optimizer states + fp32 master per trainable element, as a checkpoint stores them:
    Adam 2 states (fp32 unless ``*-true``; 1 B for bitsandbytes 8-bit) + 4 B master under
    mixed precision with ZeRO (ZeRO paper §3: 12 B/param with Adam)."""
    dt = dtypes(recipe)
    facts = optimizer_facts(recipe.optimizer.kind)
    per_state = 1.0 if facts.layout == "blockwise-8bit" else dtype_bytes(dt.state)
    return facts.full_states * per_state + (4.0 if dt.master else 0.0)


def _offload_pinned(per_rank: int, elements: int, rounding: bool) -> int:
    """Pinned bytes of one rank's offloaded states: DeepSpeed allocates one flat buffer per
    state kind per sub-group (<= 1e9 elements); fp32 kinds are 4 B/element, a 16-bit parameter
    kind 2 B/element."""
    if per_rank <= 0 or elements <= 0:
        return 0
    per_elem = per_rank / elements
    n_fp32 = int(per_elem // 4)
    rest = round(per_elem - 4 * n_fp32)
    sub = int(constant("ds_sub_group_elements"))
    buffers: list[int] = []
    for size in c.offload_buffers(elements, sub):
        buffers += [size * 4] * n_fp32 + ([size * rest] if rest else [])
    return c.pinned_bytes(buffers, rounding)


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuSide:
    """What the host estimate reads of the GPU estimate (``GpuSide.of`` a ``Breakdown``)."""

    trainable_params: int
    """Trainable parameters of the whole model."""
    host_bytes_per_rank: int
    """The largest offloaded bytes in host RAM of one rank (``off_gpu_bytes(Pool.HOST)``)."""
    nvme_bytes_per_rank: int
    """The largest offloaded bytes on NVMe of one rank (``off_gpu_bytes(Pool.NVME)``)."""
    capacity_bytes: int
    """Usable memory of one GPU."""

    @classmethod
    def of(cls, b: Breakdown) -> GpuSide:
        return cls(trainable_params=b.model.trainable_params,
                   host_bytes_per_rank=max(r.off_gpu_bytes(Pool.HOST) for r in b.ranks),
                   nvme_bytes_per_rank=max(r.off_gpu_bytes(Pool.NVME) for r in b.ranks),
                   capacity_bytes=b.capacity_bytes)


def estimate_host(b: Breakdown, model: ModelSpec, recipe: Recipe, hw: NodeHardware,
                  setup: HostSetup) -> tuple[HostEstimate, NvmeEstimate]:
    """Host RAM and NVMe of the busiest node (see the module docstring)."""
    return host_of(GpuSide.of(b), model, recipe, hw, setup)


def host_of(gpu: GpuSide, model: ModelSpec, recipe: Recipe, hw: NodeHardware,
            setup: HostSetup) -> tuple[HostEstimate, NvmeEstimate]:
    """``estimate_host`` from the numbers it reads of the GPU estimate (``memplan plan`` has
    them without building a ``Breakdown``). Of the recipe it reads the parallelism, method,
    precision, engine, optimizer, offload and the batch's micro-batch and sequence length."""
    local = recipe.parallelism.local_gpus
    nodes = math.ceil(recipe.parallelism.gpus / local)
    dt = dtypes(recipe)
    w_elem = dtype_bytes(dt.param if recipe.method.kind == "full" else dt.frozen)
    weights = math.ceil(model.num_params * w_elem)
    trainable = gpu.trainable_params
    model_par = recipe.parallelism.tp * recipe.parallelism.pp
    shard = recipe.parallelism.shard_degree
    par = recipe.parallelism
    largest = max(t.numel_per_rank(par.tp_of(t.experts), par.ep) for t in model.tensors)
    lines: list[HostLine] = []
    notes: list[str] = []

    def add(name: str, n: int, moments: tuple[str, ...], formula: str) -> None:
        if n:
            lines.append(HostLine(name=name, bytes=int(n), moments=moments, formula=formula))

    add("process baseline", c.process_baseline(local), ("load", *STEADY),
        f"{local} ranks x 2.06 GB (torch + CUDA process RSS, pytorch/pytorch#113326)")
    shards = model_par * (shard if recipe.parallelism.zero == 3 else 1)
    add(f"model loading ({setup.load})",
        c.loading_bytes(setup.load, local_ranks=local, weights_bytes=weights, model_shards=shards,
                        unit_bytes=math.ceil(model.largest_layer_numel() * w_elem),
                        init_copy=setup.init_copy),
        ("load",), _LOAD_FORMULA[setup.load] + ("" if setup.load == "meta" else
                                                f", x{2 if setup.init_copy else 1} copies"))

    host_per_rank = gpu.host_bytes_per_rank
    if host_per_rank:
        raw = local * host_per_rank
        add("offloaded states", raw, STEADY,
            f"{local} ranks x offloaded bytes per rank (ZeRO-Offload / FSDP CPU offload, "
            "from the GPU breakdown)")
        if setup.pinned and setup.pinned_rounding:
            elems = math.ceil(trainable / (model_par * shard))
            pinned = local * _offload_pinned(host_per_rank, elems, True)
            add("pinned rounding", max(0, pinned - raw), STEADY,
                "each pinned flat buffer (one per state and 1e9-element sub-group) rounded up to "
                "a power of two (pytorch/pytorch#95823)")
        if setup.pinned:
            notes.append("offloaded states are pinned: they count against `ulimit -l` and cannot "
                         "be swapped (DeepSpeed offload_config.py)")
        if recipe.offload.kind in ("optimizer", "params+optimizer"):
            impl = host_adam(recipe.engine_kind, recipe.optimizer_impl)
            temp_elems = math.ceil(largest / (shard if recipe.parallelism.zero == 3 else 1))
            add("CPU optimizer temporaries", local * c.cpu_optimizer_temp_bytes(
                impl, temp_elems, math.ceil(trainable / (model_par * shard))),
                ("steady step",), _CPU_STEP_FORMULA.get(impl.removesuffix("-torch2.0"), ""))
    if recipe.offload.kind == "nvme":
        sub = min(int(constant("ds_sub_group_elements")),
                  math.ceil(trainable / (model_par * shard)))
        add("NVMe swap buffers (pinned)",
            local * c.nvme_swap_buffer_bytes(params_on_nvme=True, sub_group_elements=sub), STEADY,
            "optimizer 4 x sub-group x 4 B + params 5 x 1e8 x 2 B + max_in_cpu 1e9 x 2 B per "
            "rank, pinned (DeepSpeed offload_config.py defaults)")

    data = c.dataloader_bytes(setup, recipe.batch.micro_batch, recipe.batch.seq_len)
    add("data loading", local * sum(data.values()), STEADY,
        f"{local} ranks x (" + ", ".join(f"{k} {v:,} B" for k, v in data.items() if v) + ")")

    opt_elem = optimizer_state_bytes_per_element(recipe) if setup.save_optimizer else 0.0
    state = weights + math.ceil(trainable * opt_elem)
    opt_shards = model_par * (shard if recipe.parallelism.zero >= 1 else 1)
    rank_state = math.ceil(weights / shards + trainable * opt_elem / opt_shards)
    add(f"checkpoint save ({setup.checkpoint}{', async' if setup.async_save else ''})",
        c.checkpoint_save_bytes(setup, local_ranks=local,
                                state_bytes=state if setup.checkpoint != "sharded" else rank_state,
                                shards=1, largest_tensor_bytes=largest * 4),
        ("checkpoint save",), _SAVE_FORMULA[setup.checkpoint])
    if hw.host_ram_bytes is None:
        notes.append("host RAM of the node is unknown: give --node or --host-ram for a verdict")
    host = HostEstimate(node=hw.name, local_ranks=local, nodes=nodes, lines=tuple(lines),
                        capacity_bytes=hw.host_ram_bytes,
                        gpu_memory_per_node_bytes=local * gpu.capacity_bytes, notes=tuple(notes))
    return host, _nvme(gpu.nvme_bytes_per_rank, recipe, hw, setup, local, state)


def _nvme(swap: int, recipe: Recipe, hw: NodeHardware, setup: HostSetup, local: int,
          state: int) -> NvmeEstimate:
    lines = []
    if swap:
        lines.append(HostLine(name="ZeRO-Infinity swap files", bytes=local * swap,
                              moments=STEADY, formula=f"{local} ranks x NVMe-offloaded bytes per "
                              "rank (parameters and optimizer states, from the GPU breakdown)"))
    if setup.checkpoint != "none" and setup.keep_checkpoints:
        gpus = recipe.parallelism.gpus
        per_node = (math.ceil(state * local / gpus) if setup.checkpoint == "sharded"
                    else state)
        lines.append(HostLine(
            name=f"checkpoints kept ({setup.keep_checkpoints})",
            bytes=setup.keep_checkpoints * per_node, moments=STEADY,
            formula="keep x training state on this node (sharded: state x local / world; full: "
                    "the whole state, written by rank 0)"))
    return NvmeEstimate(lines=tuple(lines), capacity_bytes=hw.nvme_bytes)


_LOAD_FORMULA = {
    "full": "every local rank materialises the whole model (DeepSpeedExamples#498, "
            "pytorch/pytorch#105840)",
    "rank0": "rank 0 only, others on meta + broadcast (accelerate cpu_ram_efficient_loading)",
    "sharded": "each rank reads its shard (tp x pp x ZeRO-3 shards) of a distributed checkpoint",
    "meta": "meta-device init, one layer at a time streamed to the GPU (zero.Init, torchtitan)",
}
_CPU_STEP_FORMULA = {
    "for-loop": "2 fp32 temporaries of the largest parameter shard per rank (torch's CPU "
                "default, _single_tensor_adam denom)",
    "foreach": "an fp32 copy of every state tensor of the rank (torch _multi_tensor_adam "
               "_foreach_sqrt; two before torch 2.1)",
}
"""What the host's Adam step allocates; DeepSpeed's CPU Adam and torch's fused AdamW none
(``categories.cpu_optimizer_temp_bytes``), so they have no line."""
_SAVE_FORMULA = {
    "full-rank0": "full training state gathered on rank 0's host (FSDP FullStateDictConfig "
                  "offload_to_cpu + rank0_only)",
    "full-all-ranks": "full training state on every local rank (facebookresearch/fairscale#844)",
    "sharded": "per rank: one tensor copied to the host at a time (sync) or its whole shard "
               "staged (async_save)",
    "none": "",
}
