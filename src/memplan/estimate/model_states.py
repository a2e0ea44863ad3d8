"""Per-rank model-state items: parameters, gradients, optimizer states, master weights and the
ZeRO/FSDP/DDP communication buffers that scale with them.

Conventions (README "Conventions" has the long form):
- ZeRO >= 1 follows DeepSpeed: 16-bit model + fp32 master under mixed precision; stage 1 shards
  optimizer states and master weights, stage 2 also gradients, stage 3 also parameters, over
  ``recipe.parallelism.shard_degree`` ranks (expert tensors over ``expert_shard_degree``).
- Offload moves master weights and optimizer states (and with ``params+optimizer``/``nvme`` the
  parameter shards) to the host or NVMe pool; they stay in the breakdown, off the GPU.
"""

from __future__ import annotations

import math
from ..breakdown import ALL_PHASES, Category, Item, Phase, Pool
from ..facts import Dtypes
from ..facts.constants import constant
from ..recipe import Recipe
from ..units import dtype_bytes
from .deepspeed_buffers import deepspeed_buffer_lines
from .fsdp1_flat import flat_grad_holds, largest_grad_unit, mixes_frozen
from .fsdp1_units import fsdp1_per_moment
from .fsdp2_units import fsdp2_per_moment
from .layout import Held, Stage
from .lines import Line
from .states import optimizer_state_bytes, quantized_bytes
from .zero3_live import zero3_live_applies

__all__ = ["model_state_items"]

F, B, O = Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER


def _sum(pairs: list[tuple[Held, float]], recipe: Recipe, shard: bool) -> int:
    """Add per-tensor bytes; when ``shard``, divide each by its ZeRO shard degree (expert
    tensors by the expert-data-parallel degree)."""
    out = 0.0
    if shard:
        dense, expert = recipe.parallelism.shard_degree, recipe.parallelism.expert_shard_degree
        for h, b in pairs:
            out += b / (expert if h.expert else dense)
    else:
        for _, b in pairs:
            out += b
    return math.ceil(out)


_ADAPTER_NAME = {"lora": "LoRA adapters", "qlora": "LoRA adapters", "dora": "DoRA adapters",
                 "lora-fa": "LoRA-FA lora_B", "vera": "VeRA scaling vectors",
                 "ia3": "IA3 vectors", "prompt-tuning": "prompt embedding",
                 "prefix-tuning": "prefix embedding", "adapter": "adapter parameters"}


def _cast_note(recipe: Recipe, dt: Dtypes) -> str:
    """Said beside the adapters when the engine, not the recipe, set their dtype
    (``adapter_dtype = auto``; ``facts.adapter_dtypes``)."""
    if str(recipe.method.adapter_dtype) != "auto" or not dt.adapter_by:
        return ""
    return f", {dt.adapter_by}; adapter_dtype=auto"


def model_state_items(stage: Stage, recipe: Recipe, dt: Dtypes) -> list[Line]:
    """Lines for one rank of ``stage``. Reads of ``recipe`` only parallelism, offload,
    method, engine, precision, optimizer, loop and whether ``batch.grad_accum > 1``: the
    estimator's memo keys these lines by exactly that (``estimate._states``); a new read
    must join that key."""
    items: list[Line] = []
    trainable = [h for h in stage.held if h.trainable]
    base = [h for h in trainable if not h.adapter]
    adapters = [h for h in trainable if h.adapter]
    frozen = [h for h in stage.held if not h.trainable and not h.quantized and not h.adapter]
    frozen_adapters = [h for h in stage.held if not h.trainable and h.adapter]
    quantized = [h for h in stage.held if h.quantized]
    z = recipe.parallelism.zero
    off = recipe.offload.kind
    param_pool = {"params+optimizer": Pool.HOST, "nvme": Pool.NVME}.get(off, Pool.ALLOCATED)
    state_pool = {"optimizer": Pool.HOST, "params+optimizer": Pool.HOST, "nvme": Pool.NVME}.get(
        off, Pool.ALLOCATED)
    shard_note = f" / {recipe.parallelism.shard_degree} (ZeRO-{z})" if z else ""

    def add(category: Category, name: str, pairs: list[tuple[Held, float]], *, shard: bool,
            formula: str, phases: tuple[Phase, ...] = ALL_PHASES, pool: Pool = Pool.ALLOCATED,
            lazy: bool = False, grows: bool = False, stepping: str = ""):
        n = _sum(pairs, recipe, shard)
        if n:
            items.append(Line(Item(category=category, name=name, bytes=n, pool=pool,
                                   formula=formula + (shard_note if shard else "")), phases,
                              lazy=lazy, grows=grows, stepping=stepping))

    # -- parameters ------------------------------------------------------------------------
    pb, fb = dtype_bytes(dt.param), dtype_bytes(dt.frozen)
    add(Category.PARAMS, f"trainable parameters ({dt.param})", [(h, h.numel * pb) for h in base],
        shard=z == 3, pool=param_pool, formula=f"trainable elements x {pb:g} B")
    ab = dtype_bytes(dt.adapter)
    add(Category.PARAMS, f"{_ADAPTER_NAME.get(recipe.method.kind, 'PEFT adapters')} "
        f"({dt.adapter}{_cast_note(recipe, dt)})",
        [(h, h.numel * ab) for h in adapters], shard=z == 3, pool=param_pool,
        formula=(f"r x (in + out) per adapted linear x {ab:g} B (Hu et al. 2021)"
                 if recipe.method.kind in ("lora", "qlora")
                 else f"trained adapter elements (estimate/peft.py) x {ab:g} B"))
    add(Category.PARAMS, f"frozen parameters ({dt.frozen})", [(h, h.numel * fb) for h in frozen],
        shard=z == 3, pool=param_pool, formula=f"frozen elements x {fb:g} B")
    add(Category.PARAMS, f"frozen adapter tensors ({dt.adapter})",
        [(h, h.numel * ab) for h in frozen_adapters], shard=z == 3, pool=param_pool,
        formula=f"LoRA-FA's lora_A, VeRA's shared vera_A/vera_B x {ab:g} B")
    add(Category.PARAMS, f"quantized base ({recipe.method.quant})",
        [(h, quantized_bytes(h.numel, h.tensor.shape[0], recipe.method.quant)) for h in quantized],
        shard=z == 3, pool=param_pool,
        formula="packed storage incl. quantization constants (QLoRA paper §3; GPTQ: "
        "auto-gptq QuantLinear buffers)")
    if z == 3 and recipe.engine_kind == "deepspeed" and recipe.parallelism.shard_degree > 1:
        limit = recipe.engine.stage3_param_persistence_threshold
        small = [h for h in stage.held if not h.quantized and h.numel <= limit]
        add(Category.PARAMS, "ZeRO-3 persistent parameters (kept gathered)",
            [(h, h.numel * (ab if h.adapter else pb if h.trainable else fb)) for h in small],
            shard=False,
            formula=f"DeepSpeed keeps every parameter of <= {limit:,} elements "
            "(stage3_param_persistence_threshold) gathered on each rank beside its partition "
            "(deepspeed/runtime/zero/parameter_offload.py mark_persistent_parameters, 0.19.8)")
    if recipe.precision.kind == "fp8-mixed" and z < 3:
        linear = [(h, h.numel * 2.0) for h in base if h.tensor.is_linear]
        add(Category.PARAMS, "fp8 weight cache (+ transpose)", linear, shard=False,
            phases=(F, B), formula="1 B fp8 weight + 1 B fp8 transpose per linear element, cached "
            "for the step (Transformer Engine, Hopper FP8 GEMMs need both layouts)")

    # -- gradients -------------------------------------------------------------------------
    gb = dtype_bytes(dt.grad)
    persistent = (recipe.batch.grad_accum > 1 or recipe.precision.grad_dtype == "fp32"
                  or not recipe.loop.set_to_none)
    grad_phases = ALL_PHASES if persistent else (B, O)
    why = (" kept across micro-batches (grad_accum > 1)" if recipe.batch.grad_accum > 1
           else " kept across steps (zero_grad(set_to_none=False))"
           if not recipe.loop.set_to_none else "")
    # torch gives a gradient its parameter's dtype: LoRA adapters keep the adapter dtype.
    grads = [(h, h.numel * (ab if h.adapter else gb)) for h in trainable]
    flat_mix = mixes_frozen(stage, recipe)
    if flat_mix:
        # FSDP1: a unit's flat gradient covers its frozen tensors too, in the flat parameter's
        # one dtype (fsdp1_flat.py; torch _flat_param.py _use_unsharded_views)
        grads = [(h, h.numel * (ab if h.adapter or not h.trainable else gb))
                 for h in flat_grad_holds(stage, recipe)]
        why += f" (FSDP1 flat gradients, fsdp1_wrap={recipe.engine.fsdp1_wrap}: frozen " \
               "parameters of mixed units included)"
    # DeepSpeed ZeRO-3 reduces each gradient into a flat partition buffer made at init
    # (deepspeed_buffers.py), which replaces the gradients that grow during the backward
    flat_grads = z == 3 and recipe.engine_kind == "deepspeed"
    if off != "none" and z >= 2:
        add(Category.GRADIENTS, "fp32 gradient partition (offloaded)",
            [(h, h.numel * 4.0) for h in trainable], shard=True, pool=state_pool,
            formula="ZeRO-Offload copies each reduced gradient partition to pinned host memory "
            "in fp32 (Ren et al. 2021, arXiv 2101.06840, §4)")
    elif recipe.optimizer.in_backward:
        big = max(grads, key=lambda g: g[1])
        add(Category.GRADIENTS, "gradient of one parameter (optimizer in backward)", [big],
            shard=False, phases=(B,), stepping="",
            formula=f"the largest trainable tensor x {gb:g} B: each "
            "gradient is stepped and freed by its post-accumulate-grad hook (torchtune "
            "training/_memory.py register_optim_in_bwd_hooks) before the next one is made")
    elif not flat_grads and (fsdp2_per_moment(recipe) or fsdp1_per_moment(recipe)) \
            and not persistent:
        # FSDP2 and FSDP1 write a block's sharded gradient at its post-backward, the root's at
        # the end: fsdp2_units / fsdp1_units add them per backward instant
        add(Category.GRADIENTS, f"gradients{why}", grads, shard=True, phases=(O,),
            formula=(f"elements of the FSDP1 units with a trainable parameter x {gb:g} B"
                     if flat_mix else f"trainable elements x {gb:g} B")
            + " (in the backward: fsdp2_units.py / fsdp1_units.py)")
    elif not flat_grads and z == 1 and recipe.engine_kind == "deepspeed":
        # ZeRO-1 keeps every 16-bit gradient through the backward; its step frees those outside
        # the rank's partition before flattening the rest for the fp32 cast
        # (DeepSpeedZeroOptimizer.step: "free_grad_in_param_list(self.params_not_in_partition[i])",
        # stage_1_and_2.py, v0.12.3 and 0.19.8), so the step holds the partition's only
        add(Category.GRADIENTS, f"gradients{why}", grads, shard=False,
            phases=tuple(p for p in grad_phases if p is not O), grows=not persistent,
            formula=f"trainable elements x {gb:g} B")
        add(Category.GRADIENTS, f"gradients{why}", grads, shard=True, phases=(O,),
            formula=f"trainable elements x {gb:g} B, the rank's partition (ZeRO-1 step frees "
            "the others, stage_1_and_2.py)")
    elif not flat_grads:
        add(Category.GRADIENTS, f"gradients{why}", grads, shard=z >= 2,
            phases=grad_phases, grows=not persistent,
            formula=(f"elements of the FSDP1 units with a trainable parameter x {gb:g} B"
                     if flat_mix else f"trainable elements x {gb:g} B"))
    if recipe.deepspeed_16bit:
        items += _fp16_optimizer_step(trainable)
    if dt.master and z >= 1 and off == "none" and gb < 4:
        # DeepSpeed ZeRO-3 sub_group_size: the optimizer steps this many elements at a time
        limit = int(constant("ds_sub_group_elements")) if z == 3 else None
        fp32 = [(h, h.numel * 4.0) for h in trainable]
        n = _sum(fp32, recipe, True)
        if limit is not None:
            n = min(n, limit * 4)
        items.append(Line(Item(
            category=Category.GRADIENTS, name="fp32 gradient partition (optimizer step)",
            bytes=n,
            formula="DeepSpeed casts the 16-bit gradient partition to fp32 for the step "
            "(stage_1_and_2.py; ZeRO-3 one sub_group of 1e9 elements at a time)" + shard_note),
            (O,)))
        if recipe.engine_kind == "deepspeed":
            # the cast's input is a flattened 16-bit copy of the gradients, alive while the
            # fp32 one is made. ZeRO-3: "single_grad_partition = self.flatten(
            # self.averaged_gradients[sub_group_id]).to(...)" (flatten = torch.cat, a copy of
            # the narrows of grad_partitions_flat_buffer), stage3.py
            # _prepare_fp32_grad_for_sub_group (DeepSpeed 0.19.8). ZeRO-1/2: the same line over
            # the rank's whole partition of a parameter group, DeepSpeedZeroOptimizer.step
            # (stage_1_and_2.py at v0.12.3: "self.flatten(self.averaged_gradients[i]).to(
            # self.single_partition_of_fp32_groups[i].dtype)"; 0.19.8: flat_grad_partition =
            # self.flatten(...), then .to(...), then del flat_grad_partition), although the
            # 16-bit gradients already sit in one buffer (grads_in_partition)
            what = "one sub_group" if z == 3 else "the gradient partition"
            where = ("stage3.py _prepare_fp32_grad_for_sub_group" if z == 3
                     else "stage_1_and_2.py DeepSpeedZeroOptimizer.step")
            items.append(Line(Item(
                category=Category.TEMPORARY,
                name=f"flattened {dt.grad} gradients of {what} (cast input)",
                bytes=math.ceil(n / 4 * gb),
                formula=f"{what} x {gb:g} B (DeepSpeed {where}: "
                "self.flatten(...).to(fp32))" + shard_note),
                (O,)))

    # -- optimizer states and master weights ---------------------------------------------------
    # torch optimizers allocate states like the parameter: fp32 adapters get fp32 states.
    # A torch optimizer (DDP, and FSDP1/FSDP2/torchtitan over their shards) creates them in
    # the first step() (torch/optim/adam.py _init_group); DeepSpeed builds them at init
    # (stage_1_and_2.py / stage3.py initialize_optimizer_states; ZeRO-0's FP16_Optimizer
    # steps once on zero gradients in its initialize_optimizer_states).
    torch_opt = (z == 0 and not recipe.deepspeed_16bit) \
        or str(recipe.engine_kind) in ("fsdp1", "fsdp2", "torchtitan")
    adapter_state = "fp32" if dt.state == "fp32" else dt.adapter
    # bitsandbytes' paged optimizers keep their states in CUDA managed memory (functional.py
    # get_paged: cget_managed_ptr, cudaMallocManaged): on the GPU while resident, outside
    # torch's caching allocator, so nvidia-smi sees them and torch's counters do not
    paged = str(recipe.optimizer.kind).startswith("paged-") and state_pool is Pool.ALLOCATED
    add(Category.OPTIMIZER, f"{recipe.optimizer.kind} states" + (
        " (CUDA managed memory)" if paged else ""),
        [(h, optimizer_state_bytes(h, recipe.optimizer.kind,
                                   adapter_state if h.adapter else dt.state))
         for h in trainable],
        shard=z >= 1, pool=Pool.DEVICE if paged else state_pool, lazy=torch_opt and not paged,
        formula="see estimate/states.py:optimizer_state_bytes" + (
            "; bitsandbytes allocates them with cudaMallocManaged (get_paged), which torch's "
            "memory counters do not see" if paged else
            "; torch creates them inside the first optimizer.step()" if torch_opt else ""))
    if dt.master:
        add(Category.OPTIMIZER, "fp32 master weights", [(h, h.numel * 4.0) for h in base],
            shard=z >= 1, pool=state_pool,
            formula="4 B per trainable element (ZeRO paper, Rajbhandari et al. 2020, §3)")
    if dt.adapter_master:
        add(Category.OPTIMIZER, "fp32 master of the adapters", [(h, h.numel * 4.0)
                                                                 for h in adapters],
            shard=z >= 1, pool=state_pool,
            formula="4 B per trainable adapter element: DeepSpeed's optimizer clones "
            "every trainable parameter to fp32, PEFT's adapters as well "
            "(facts.adapter_dtypes)")

    items += deepspeed_buffer_lines(recipe, dt, trainable,
                                    _sum([(h, float(h.numel)) for h in trainable], recipe, True))
    items += _comm_items(stage, recipe, dt, trainable)
    return items


def _comm_items(stage: Stage, recipe: Recipe, dt: Dtypes, trainable: list[Held]) -> list[Line]:
    """Buffers that exist because of data parallelism."""
    out: list[Line] = []
    cb, gb = dtype_bytes(dt.compute), dtype_bytes(dt.grad)
    t_numel = sum(h.numel for h in trainable)
    deepspeed = recipe.engine_kind == "deepspeed"
    # FSDP1's unsharded flat gradient is a whole unit, frozen elements included (fsdp1_flat.py)
    g_unit = largest_grad_unit(stage, recipe) if mixes_frozen(stage, recipe) else None
    # DeepSpeed allocates its contiguous_gradients buckets whatever the world size: ZeRO-3 in
    # DeepSpeedZeroOptimizer_Stage3.__init__, ZeRO-1/2 in setup_buckets, called by the gradient
    # hooks that contiguous_gradients registers (stage_1_and_2.py __init__: "if
    # (self.partition_gradients or ... or self.contiguous_gradients):
    # self.create_gradient_handling_hooks()"), so a one-GPU DeepSpeed run holds them too.
    if recipe.parallelism.zero == 3 and deepspeed \
            and recipe.engine.contiguous_gradients and t_numel:
        out.append(_line(
            category=Category.COMMUNICATION, name="ZeRO-3 gradient bucket (contiguous_gradients)",
            bytes=recipe.engine.reduce_bucket_size * gb,
            formula=f"reduce_bucket_size = {recipe.engine.reduce_bucket_size:,} elements of the "
            "gradient dtype, allocated once and kept (DeepSpeedZeroOptimizer_Stage3.__init__, "
            "deepspeed/runtime/zero/stage3.py, 0.19.8: 'if self.contiguous_gradients: "
            "bucket.buffer = torch.empty(self.reduce_bucket_size, ...)')"))
    if fsdp2_per_moment(recipe) or fsdp1_per_moment(recipe):
        pass  # gathered units and unit gradients per instant: fsdp2_units.py, fsdp1_units.py
    elif recipe.parallelism.zero == 3 and recipe.parallelism.shard_degree > 1:
        unit = stage.largest_unit_numel
        if zero3_live_applies(recipe):
            pass  # gathered parameters per instant: zero3_live.py
        else:
            gathered = max((sum(quantized_bytes(h.numel, h.tensor.shape[0], recipe.method.quant)
                                if h.quantized else h.numel * cb for h in u)
                            for u in stage.units), default=0)
            out.append(_line(
                category=Category.COMMUNICATION,
                name="ZeRO-3/FSDP all-gathered parameters (2 units)",
                bytes=math.ceil(2 * gathered), phases=(F, B),
                formula="current + prefetched unit, unsharded as stored: compute dtype, packed "
                "4/8-bit for a QLoRA base (FSDP limit_all_gathers keeps two units; PyTorch "
                "FSDP notes)"))
        if t_numel and not zero3_live_applies(recipe):
            # DeepSpeed ZeRO-3's 16-bit gradients are per parameter, per moment (zero3_live.py
            # rule 7); FSDP computes the unit's gradients in param_dtype and reduce-scatters them in
            # reduce_dtype (default: param_dtype), casting only the shard to fp32
            # (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py foreach_reduce);
            # DeepSpeed's 16-bit model has 16-bit gradients already (gb).
            ub = cb if str(recipe.engine_kind) in ("fsdp1", "fsdp2", "torchtitan") else gb
            out.append(_line(
                category=Category.COMMUNICATION, name="unsharded gradients of one unit",
                bytes=math.ceil((min(unit, t_numel) if g_unit is None else g_unit) * ub),
                phases=(B,),
                formula="reduce-scatter input of the unit in backward (PyTorch FSDP notes)"))
    elif recipe.parallelism.zero in (1, 2) and recipe.parallelism.dp == 1 and deepspeed \
            and recipe.engine.contiguous_gradients and t_numel:
        out.append(_reduce_bucket(recipe, gb))
    elif recipe.parallelism.zero == 0 and deepspeed and t_numel:
        out.append(_deepspeed_allreduce_bucket(trainable, gb))  # also on one rank
    elif recipe.parallelism.dp > 1 and t_numel:
        if recipe.parallelism.zero == 0:
            out.append(_line(
                category=Category.COMMUNICATION, name="DDP gradient buckets",
                bytes=math.ceil(t_numel * gb),
                formula="gradient_as_bucket_view=False (default) keeps a second full copy of the "
                "gradients in buckets (torch DistributedDataParallel docstring)"))
        else:
            # the recipe's DeepSpeed knobs (defaults = DeepSpeedZeroConfig's 5e8 elements);
            # stage_1_and_2.py DeepSpeedZeroOptimizer.reduce_ipg_grads fills one bucket of
            # reduce_bucket_size, all_gather_dp_groups gathers allgather_bucket_size at a time
            eng = recipe.engine
            if eng.contiguous_gradients:
                out.append(_reduce_bucket(recipe, gb))
            else:
                n, how = min(eng.reduce_bucket_size, t_numel), (
                    f"reduce_bucket_size = {eng.reduce_bucket_size:.3g} elements of gradients "
                    "flattened for the reduce (DeepSpeed stage_1_and_2.py reduce_ipg_grads)")
                out.append(_line(
                    category=Category.COMMUNICATION, name="ZeRO reduce bucket",
                    bytes=math.ceil(n * gb), phases=(B,), formula=how))
            # the optimizer's 16-bit groups hold the trainable parameters only (a PEFT
            # method's frozen base is not in them): all_gather_dp_groups(partitioned_param_
            # groups=self.parallel_partitioned_bit16_groups), stage_1_and_2.py step, 0.19.8;
            # measured: the ZeRO-2 LoRA case of validation/dist_nproc2.json
            out.append(_line(
                category=Category.COMMUNICATION, name="ZeRO all-gather bucket",
                bytes=math.ceil(min(eng.allgather_bucket_size, t_numel) * cb), phases=(O,),
                formula=f"allgather_bucket_size = {eng.allgather_bucket_size:.3g} elements for "
                "the updated trainable parameters (DeepSpeed all_gather_dp_groups)"))
    return out


def _fp16_optimizer_step(trainable: list[Held]) -> list[Line]:
    """DeepSpeed ZeRO-0 with a 16-bit config (``Recipe.deepspeed_16bit``): ``FP16_Optimizer.step``
    (deepspeed/runtime/fp16/fused_optimizer.py, 0.19.8; the wrapper of FusedAdam, which an
    ``optimizer.type`` of Adam/AdamW builds) makes, per parameter group, ``grads_groups_flat =
    _flatten_dense_tensors([p.grad.to(fp32) for p in group])``: an fp32 copy of every 16-bit
    gradient, then their concatenation, while the 16-bit gradients are still held (``p.grad =
    None`` follows). The flat fp32 gradient is the basic optimizer's ``.grad`` through its step
    and dropped after it. Known deviation: ``FP16_UnfusedOptimizer`` (any other optimizer, e.g.
    ``torch_adam``) converts each gradient to fp32 without the concatenation, 4 B per element
    less than counted here."""
    n = sum(h.numel for h in trainable) * 4
    if not n:
        return []
    src = "(DeepSpeed ZeRO-0 FP16_Optimizer.step, runtime/fp16/fused_optimizer.py)"
    return [Line(Item(category=Category.GRADIENTS, name="fp32 flat gradients (optimizer step)",
                      bytes=n, formula="trainable elements x 4 B: torch.cat of the fp32 copies, "
                      f"the fp32 master's .grad through the step {src}"), (O,)),
            Line(Item(category=Category.TEMPORARY,
                      name="fp32 copies of the 16-bit gradients (flatten input)", bytes=n,
                      formula="trainable elements x 4 B: p.grad.to(fp32) for every trainable "
                      f"tensor, alive until the cat {src}"), (O,))]


def _deepspeed_allreduce_bucket(trainable: list[Held], gb: float) -> Line:
    """DeepSpeed ZeRO-0's gradient all-reduce at the end of the backward (``engine.backward``
    -> ``allreduce_gradients`` -> ``buffered_allreduce_fallback``, deepspeed/runtime/engine.py
    0.19.8): ``allreduce_bucket`` flattens a bucket of gradients (``self.flatten``, a copy),
    reduces it and copies it back, bucket by bucket, on any number of ranks. No gradient
    bucket is kept, unlike torch DDP's: the copy exists at the backward's end only, when the
    activations are freed (``stepping = "after"``; measured on the ZeRO-0 cases of
    ``validation/dist_nproc2.json``: counted through the whole backward it put the backward
    peak 2 B per trainable element too high)."""
    limit = int(constant("ds_allreduce_bucket_elements"))
    numel = [h.numel for h in trainable]
    n = min(sum(numel), limit + max(numel))
    return Line(Item(category=Category.COMMUNICATION, name="DeepSpeed all-reduce bucket (ZeRO-0)",
                     bytes=math.ceil(n * gb),
                     formula=f"min(trainable elements, {limit:.3g} + the largest tensor) x "
                     f"{gb:g} B: the gradients flattened for the all-reduce after the backward "
                     "(DeepSpeed engine.py allreduce_no_retain, MEMORY_OPT_ALLREDUCE_SIZE)"),
                (B,), stepping="after")


def _reduce_bucket(recipe: Recipe, gb: float) -> Line:
    """ZeRO-1/2 ``contiguous_gradients`` buckets: ``torch.empty(reduce_bucket_size)`` in the
    16-bit gradient dtype, whatever the model's size, and a second one under ``overlap_comm``
    ("double buffers to avoid data access conflict"), deepspeed/runtime/zero/stage_1_and_2.py
    ``DeepSpeedZeroOptimizer.setup_buckets`` (0.19.8)."""
    eng = recipe.engine
    k = 2 if eng.overlap_comm else 1
    return _line(
        category=Category.COMMUNICATION, name="ZeRO reduce bucket",
        bytes=math.ceil(k * eng.reduce_bucket_size * gb), phases=(B,),
        formula=f"{k} x reduce_bucket_size = {eng.reduce_bucket_size:.3g} elements, allocated "
        "whole (contiguous_gradients" + (" + overlap_comm" if eng.overlap_comm else "")
        + "; DeepSpeed stage_1_and_2.py setup_buckets)")


def _line(*, phases: tuple[Phase, ...] = ALL_PHASES, **kw) -> Line:
    return Line(Item(**kw), phases)

