"""Activation and temporary memory of one micro-batch, moment by moment.

``stage_points`` writes the stage's forward as ops (``families.py`` from ``blocks.py``) and
replays forward and backward with the autograd simulator (``graph.py``). The result is one
``Point`` per region (embedding, each layer, head, loss) and phase, at the region's largest
instant: saved activations, temporaries, and the parameter gradients produced so far.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from ...model.spec import ModelSpec
from ...recipe import Recipe
from ...units import dtype_bytes
from ..layout import Stage
from ...facts import Dtypes
from ...recipe.engine import fsdp1_mixes
from ..peft import LORA_LIKE, adapted_roles
from ...model.peft_targets import ia3_roles, ln_tuning_leaves
from .blocks import Ctx
from .context import kept, zero3_linear
from ...recipe.memo import kept_by_parts
from .compose import compose, short_lengths, signatures
from .families import stage_graph
from .events import Event, record
from .graph import Graph, Point, simulate
from .lanes import Lanes, Split, lane, simulate_lanes
from .policy import host_checkpoint_bytes, policy_of
from .traffic import Traffic, graph_traffic

__all__ = ["Event", "Point", "Traffic", "LANE_SHAPES", "points_key", "stage_events", "stage_points",
           "stage_traffic",
           "cpu_checkpoint_bytes", "graph_attention", "held_bytes"]


def _context(spec: ModelSpec, recipe: Recipe, dt: Dtypes) -> Ctx:
    """Sizes and dtypes of one micro-batch on one rank (context parallelism splits the
    sequence; prompt tuning lengthens it by its virtual tokens)."""
    m = recipe.method
    full = m.kind == "full"
    half = dtype_bytes(dt.compute)
    # FSDP1/FSDP2/torchtitan run forward and backward on the all-gathered copy, cast to
    # param_dtype (MixedPrecisionPolicy): no autocast weight copies, though the shard is fp32
    gathered = str(recipe.engine_kind) in ("fsdp1", "fsdp2", "torchtitan") \
        and recipe.parallelism.zero >= 1
    pbytes = half if gathered else dtype_bytes(dt.param)
    # gathered engines compute on param_dtype copies whatever the stored (frozen) dtype
    act = pbytes if full or gathered else dtype_bytes(dt.frozen)
    # FSDP1 units that hold a layer's adapters with its frozen weights (fsdp1_flat.py): one
    # flat parameter, cast to param_dtype as a whole (torch _flat_param.py), adapters included
    flat_layers = str(recipe.engine_kind) == "fsdp1" and fsdp1_mixes(
        str(m.kind), str(recipe.engine.fsdp1_wrap))
    lora = m.kind in ("lora", "qlora")
    adapted = m.kind in LORA_LIKE or m.kind == "ia3"
    seq = recipe.batch.seq_len + (m.virtual_tokens if m.kind == "prompt-tuning" else 0)
    # torch.autocast: mixed precision with fp32 parameters (ZeRO >= 1 / fp8 keep a 16-bit model)
    amp = recipe.precision.kind.endswith("-mixed") and pbytes == 4 and half < 4
    par = recipe.parallelism
    return Ctx(batch=recipe.batch.micro_batch, seq=-(-seq // par.cp),
               act=int(act), half=int(half), amp=amp,
               trained=full, cpu=recipe.platform.device == "cpu",
               lora_rank=m.lora_rank if adapted else 0,
               lora_dropout=float(m.lora_dropout) if adapted else 0.0,
               qkv_dropout_shared=m.lora_dropout_qkv_shared,
               lora_targets=adapted_roles(spec, recipe) if adapted else frozenset(),
               method=("lora" if lora else str(m.kind)) if adapted else "",
               ia3_ff=ia3_roles(spec.model_type)[1] if m.kind == "ia3" else frozenset(),
               bias_trained=m.kind == "bitfit", norms_trained=m.kind == "ln-tuning",
               norm_leaves=ln_tuning_leaves(spec.model_type) if m.kind == "ln-tuning"
               else frozenset(),
               prefix=m.virtual_tokens if m.kind == "prefix-tuning" else 0,
               prompt=m.virtual_tokens if m.kind == "prompt-tuning" else 0,
               input_grad=m.kind == "adapter",
               embed_trained="embed" in m.modules_to_save and m.kind != "full",
               head_trained="lm_head" in m.modules_to_save and m.kind != "full",
               adapter=int(half if flat_layers and gathered
                           else dtype_bytes(dt.adapter)),
               train_act=int(pbytes), loss=recipe.loss.kind,
               upcast_in_model=recipe.loss.logits_upcast == "model",
               upcast_in_loss=recipe.loss.logits_upcast != "none",
               gptq=m.kind == "qlora" and m.quant == "gptq-int4",
               sp=par.tp if par.sequence_parallel else 1, etp=par.expert_tp,
               capacity=float(par.moe_capacity_factor),
               layer_weight_grads=flat_layers, linear_saves_input=zero3_linear(recipe),
               compile=str(recipe.platform.compile_scope) if recipe.platform.compile else "",
               embeds_held=str(recipe.engine_kind) not in ("megatron", "torchtitan")
               and recipe.loss.kind in ("standard", "fused")
               and recipe.loss.logits_upcast != "model",
               **_bnb_4bit(recipe, dt, int(half)))


def _bnb_4bit(recipe: Recipe, dt: Dtypes, half: int) -> dict[str, object]:
    """``Ctx.dequant`` and its companions for a bitsandbytes 4-bit base (``qlora`` with ``nf4`` /
    ``nf4-dq``): ``quant_state.dtype`` is the dtype the weight was quantised from, the loaded
    frozen dtype for transformers (``Params4bit._quantize``: ``self.data.contiguous().to(
    device)``), fp16 for Lightning (``BitsandbytesPrecision`` ``_Linear4bit.quantize``:
    ``weight.contiguous().to(device=device, dtype=torch.half)``, lightning 2.4), whose bf16
    compute then copies it (``.to(A.dtype)``)."""
    m = recipe.method
    lightning = m.quantizer == "lightning-bnb"
    if m.kind != "qlora" or str(m.quant) not in ("nf4", "nf4-dq") or str(m.quantizer) not in (
            "bitsandbytes", "lightning-bnb"):
        return {}
    src = 2 if lightning else int(dtype_bytes(dt.frozen))
    copies = src != half or (lightning and recipe.precision.kind.startswith("bf16"))
    return {"dequant": (src, half if copies else 0), "dequant_saves_input": lightning,
            "quant_head": lightning}


def cpu_checkpoint_bytes(spec: ModelSpec, stage: Stage, recipe: Recipe, dt: Dtypes,
                         inflight: float) -> int:
    """Host bytes per rank of DeepSpeed ``cpu_checkpointing`` (``policy.host_checkpoint_bytes``):
    a layer's input is the residual stream, ``tokens / sp x hidden`` in the model's activation
    dtype (``Ctx.act``, the dtype the graph gives it)."""
    c = recipe.checkpointing
    if c.kind != "full" or not c.cpu_checkpointing:  # host_checkpoint_bytes is 0
        return 0
    ctx = _context(spec, recipe, dt)
    per_layer = ctx.tokens // ctx.sp * spec.hidden_size * ctx.act
    return host_checkpoint_bytes(recipe.checkpointing, len(stage.layers), per_layer,
                                 recipe.parallelism.tp, inflight)


def held_bytes(spec: ModelSpec, stage: Stage, recipe: Recipe, dt: Dtypes) -> int:
    """Bytes the stage's autograd graph keeps on custom Functions' ``ctx`` (``Tensor.held``:
    bitsandbytes < 0.43.2's 4-bit inputs, ``Ctx.dequant_saves_input``) and so past the
    backward, for as long as the loop keeps the graph's outputs (``estimate/loop.py``). Known
    deviation: inside checkpointed layers they are not counted (the recompute's graph)."""
    ctx, args = _graph_args(spec, stage, recipe, dt)
    if not ctx.dequant_saves_input:
        return 0
    g = stage_graph(spec, stage.layers, ctx, **args)  # type: ignore[arg-type]
    held = {t for op in g.ops for t in op.saves if t.held}
    return sum(t.nbytes for t in held)


def accumulates(recipe: Recipe) -> bool:
    """Whether the backward adds into gradients that already exist: torch's ``AccumulateGrad``
    (torch/csrc/autograd/functions/accumulate_grad.h, ``accumulateGrad``) steals the computed
    gradient when ``.grad`` is None and otherwise adds it in place (``variable_grad +=
    new_grad``), so the computed gradient is a temporary. That happens in every micro-batch
    but the first under gradient accumulation, and in every step under
    ``zero_grad(set_to_none=False)``. Only where torch.optim's parameters own their ``.grad``
    (no ZeRO sharding, no pipeline engine): DeepSpeed, FSDP and Megatron keep their own
    gradient buffers."""
    par = recipe.parallelism
    return ((recipe.batch.grad_accum > 1 or not recipe.loop.set_to_none)
            and par.zero == 0 and par.pp == 1 and str(recipe.engine_kind) == "ddp")


def stage_points(spec: ModelSpec, stage: Stage, recipe: Recipe, dt: Dtypes,
                 memo: dict[object, object] | None = None) -> tuple[list[Point], int]:
    """Points of one micro-batch through ``stage``; and the parameter-gradient bytes the
    simulated graph produces in total (to scale the gradient lines by progress).

    ``memo``: a dict the caller keeps for one ``spec`` (``memplan.plan`` evaluating many
    recipes of one model); results are stored under exactly the arguments the graph is built
    from, so a hit returns what the simulation would (the points are shared: read only)."""
    if memo is None:
        g = _whole_graph(spec, stage, recipe, dt)
        return simulate(g), g.param_grad_bytes
    ctx, args, key = _recipe_args(spec, stage, recipe, dt, memo)
    got = memo.get(key)
    if got is None:
        got = memo[key] = _composed(spec, stage.layers, key[2], args, memo, key[3])
    return got  # type: ignore[return-value]


def stage_events(spec: ModelSpec, stage: Stage, recipe: Recipe, dt: Dtypes) -> list[Event]:
    """The allocations and frees of one micro-batch through ``stage``, in order: the graph
    ``stage_points`` simulates, recorded (``events.py``), whole (never composed)."""
    return record(_whole_graph(spec, stage, recipe, dt))


def _whole_graph(spec: ModelSpec, stage: Stage, recipe: Recipe, dt: Dtypes) -> Graph:
    """The op graph of one micro-batch through all of ``stage``, with the recipe's gradient
    accumulation: what ``stage_points`` simulates uncomposed and ``stage_events`` records."""
    ctx, args = _graph_args(spec, stage, recipe, dt)
    g = stage_graph(spec, stage.layers, ctx, **args)  # type: ignore[arg-type]
    g.accumulate = accumulates(recipe)
    return g


def points_key(spec: ModelSpec, stage: Stage, recipe: Recipe, dt: Dtypes,
               memo: dict[object, object] | None = None) -> tuple[object, ...]:
    """What ``stage_points`` reads of its arguments (one ``spec``): equal keys, equal points.
    A caller memoising what it derives from the points alone keys it by this. ``memo``: as for
    ``stage_points`` (the key is kept for the recipe's other calls, ``_recipe_args``)."""
    if memo is not None:
        return _recipe_args(spec, stage, recipe, dt, memo)[2]
    ctx, args = _graph_args(spec, stage, recipe, dt)
    return _points_key(stage, _stage_ctx(ctx, args), args, accumulates(recipe))


def _recipe_args(spec: ModelSpec, stage: Stage, recipe: Recipe, dt: Dtypes,
                 memo: dict[object, object]
                 ) -> tuple[Ctx, dict[str, object], tuple[object, ...]]:
    """``_graph_args`` and ``_points_key`` of ``stage`` under ``recipe``, kept in ``memo`` for
    the last recipe seen (by identity: the slot holds the recipe, so it cannot be another
    object at the same address) and each (first, last) a stage can be: an evaluation asks for
    them per stage from the activations, the points' key and the traffic. ``dt`` is
    ``dtypes(recipe)`` (a function of the recipe), ``spec`` the memo's one model."""
    slot = memo.get("recipe_args")
    if slot is None or slot[0] is not recipe:  # type: ignore[index]
        slot = memo["recipe_args"] = (recipe, {})
    per_stage: dict[tuple[bool, bool], Any] = slot[1]  # type: ignore[index]
    where = (stage.index == 0, stage.index == recipe.parallelism.pp - 1)
    got = per_stage.get(where)
    if got is None:
        ctx, args = _graph_args(spec, stage, recipe, dt, memo)
        if (kc := ("stage_ctx", ctx, args["last"])) not in memo:  # built once, ``kept``
            memo[kc] = kept(memo, _stage_ctx(ctx, args))
        key = _points_key(stage, memo[kc], args, accumulates(recipe))  # type: ignore[arg-type]
        got = per_stage[where] = (ctx, args, key[2:])
    ctx, args, rest = got
    return ctx, args, ("stage_points", stage.layers, *rest)


def _points_key(stage: Stage, staged: Ctx, args: dict[str, object],
                acc: bool) -> tuple[object, ...]:  # staged: _stage_ctx of the stage's context
    return ("stage_points", stage.layers, staged, acc, *args.values())


def _stage_ctx(ctx: Ctx, args: dict[str, object]) -> Ctx:
    """``ctx`` with the fields only the last stage's head and loss read (``families.py``
    ``_eager_graph`` under ``last``: the loss kind, the logits' upcasts, the embeddings its
    forward holds; ``blocks.causal_lm_loss``) at their defaults on any other stage: the graph
    of a non-last stage is the same whatever they are, so its memo keys share them."""
    if args["last"]:
        return ctx
    return replace(ctx, loss="standard", upcast_in_model=False, upcast_in_loss=True,
                   embeds_held=False)


def graph_attention(spec: ModelSpec, attention: str) -> str:
    """The attention kernel as the graph builders (``families.py``, ``ln_decoder.py``,
    ``t5.py``) tell kernels apart, for memo keys (``_graph_args``): they test ``attention ==
    "eager"`` (materialised scores) and otherwise write the fused kernel (``Blocks.sdpa``),
    except multi-head latent attention (``families._mla_attention``: FlashAttention-2 pads v
    to the q/k head dim, CPU SDPA takes the math path). So without MLA (``Traits.mla`` unset)
    ``flash`` writes the same ops as ``sdpa``, and is keyed as ``sdpa``."""
    if attention == "flash" and spec.traits is not None and spec.traits.mla is None:
        return "sdpa"
    return attention


def _graph_args(spec: ModelSpec, stage: Stage, recipe: Recipe, dt: Dtypes,
                memo: dict[object, object] | None = None) -> tuple[Ctx, dict[str, object]]:
    """What ``stage_graph`` is built from for ``stage`` under ``recipe``; ``memo``: the context
    kept by the parts ``_context`` reads (``dt``: precision, engine, parallelism)."""
    ctx = _context(spec, recipe, dt) if memo is None else kept_by_parts(memo, "context", (
        recipe.method, recipe.engine, recipe.parallelism, recipe.precision, recipe.batch,
        recipe.platform, recipe.loss), lambda: kept(memo, _context(spec, recipe, dt)))
    args = dict(first=stage.index == 0, last=stage.index == recipe.parallelism.pp - 1,
                tp=recipe.parallelism.tp,
                attention=graph_attention(spec, str(recipe.platform.attention)),
                checkpointing=policy_of(recipe.checkpointing, recipe.parallelism.tp,
                                        recipe.parallelism.sequence_parallel),
                train_from=(spec.num_layers - recipe.method.freeze_trainable_layers
                            if recipe.method.kind == "freeze" else None))
    return ctx, args


def stage_traffic(spec: ModelSpec, stage: Stage, recipe: Recipe, dt: Dtypes,
                  memo: dict[object, object] | None = None) -> Traffic:
    """Memory-bound bytes and kernel launches of one micro-batch through ``stage`` on one rank
    (``traffic.py``), from the graph ``stage_points`` simulates. A stage of identical layers is
    read off a two-layer graph: its ops are the same for every layer, so the second layer's
    traffic stands for each of the middle ones. ``memo``: as for ``stage_points``."""
    if memo is not None:  # the key of a non-last stage without the head's fields
        ctx, args, pkey = _recipe_args(spec, stage, recipe, dt, memo)
        ctx = pkey[2]  # type: ignore[assignment]
    else:
        ctx, args = _graph_args(spec, stage, recipe, dt)
    layers = stage.layers
    sigs = signatures(spec, memo if memo is not None else {})
    short = (args["train_from"] is None and len(layers) > 2
             and len({sigs[i] for i in layers}) == 1)
    # stages of the same layer kinds move the same bytes wherever they sit in the model
    where = (sigs[layers.start], len(layers)) if short else (layers,)
    key = ("stage_traffic", *where, ctx, *args.values())
    if memo is not None and key in memo:
        return memo[key]  # type: ignore[return-value]
    if short:
        # the two-layer graph's sum and second layer: the same for every stage length and
        # position of these layers (its regions are the only thing the start changes)
        two = ("two_layer_traffic", sigs[layers.start], ctx, *args.values())
        if memo is None:
            parts = _two_layer(graph_traffic(stage_graph(spec, range(
                layers.start, layers.start + 2), ctx, **args)), layers.start)  # type: ignore
            return parts[0] + parts[1].scaled(len(layers) - 2)
        if two not in memo:
            _two_layer_runs(spec, layers.start, ctx, args, memo, lambda c: (
                "two_layer_traffic", sigs[layers.start], c, *args.values()))
        whole, second = memo[two]  # type: ignore[misc]
        total = whole + second.scaled(len(layers) - 2)
    else:
        per_region = graph_traffic(stage_graph(spec, layers, ctx, **args))  # type: ignore[arg-type]
        total = sum(per_region.values(), Traffic())
    if memo is not None:
        memo[key] = total
    return total


def _two_layer(per_region: dict[str, Traffic], start: int) -> tuple[Traffic, Traffic]:
    """A two-layer graph's traffic in all, and its second layer's."""
    return (sum(per_region.values(), Traffic()), per_region.get(f"layer {start + 1}", Traffic()))


def _two_layer_runs(spec: ModelSpec, start: int, ctx: Ctx, args: dict[str, object],
                    memo: dict[object, object], key: Any) -> None:
    """``_two_layer`` of layers ``start, start + 1`` for ``ctx`` put in ``memo`` under
    ``key(ctx)``, with the shapes of ``LANE_SHAPES`` in lanes (``_in_lanes``: ``graph_traffic``
    adds each lane's sizes as it adds one micro-batch's)."""
    layers = range(start, start + 2)

    def run(c: Ctx, k: int) -> list[dict[str, Traffic]]:
        per = graph_traffic(stage_graph(spec, layers, c, **args))  # type: ignore[arg-type]
        if not k:
            return [per]
        return [{r: Traffic(**{f.name: lane(getattr(t, f.name), j) for f in fields(Traffic)})
                 for r, t in per.items()} for j in range(k)]

    for c, per_region in _in_lanes(ctx, memo, key, run, args["tp"]):
        memo[key(c)] = _two_layer(per_region, start)


def _composed(spec: ModelSpec, layers: range, ctx: Ctx, args: dict[str, object],
              memo: dict[object, object], acc: bool) -> tuple[list[Point], int]:
    """``simulate`` of the stage, from three short simulations (``compose.py``) when its layers
    are identical and the policy treats them alike, or alike every ``every`` layers (``full``
    on every k-th layer), and the short simulations not yet in ``memo`` have fewer layers than
    the stage; else of the whole stage."""
    sig = signatures(spec, memo)
    start = layers.start
    period = args["checkpointing"].period  # type: ignore[attr-defined]
    if args["train_from"] is None and period and len(layers) \
            and len({sig[i] for i in layers}) == 1:

        def key(n: int, c: Ctx = ctx) -> tuple[object, ...]:
            return ("short", sig[start], n, c, acc, *args.values())

        def short(n: int) -> tuple[list[Point], int]:
            k = key(n)
            if k not in memo:
                _lane_runs(spec, range(start, start + n), ctx, args, acc, memo,
                           lambda c: key(n, c), relabel=True)
            return memo[k]  # type: ignore[return-value]

        lengths = short_lengths(len(layers), period)
        if lengths and _compose_pays(sum(n for n in lengths if key(n) not in memo), len(layers)):
            out = compose(short, start, len(layers), period)
            if out is not None:
                return out
    # the whole stage, under stage_points' keys (its other micro-batches in lanes)
    return _lane_runs(spec, layers, ctx, args, acc, memo, lambda c: (
        "stage_points", layers, c, acc, *args.values()), relabel=False)


LANE_SHAPES = "lane_shapes"
"""``memo`` key of the (micro-batch, local sequence) shapes a caller will ask for, per tp degree
(``memplan plan``: those of its candidates): a simulation missing for one shape is run for all
the shapes of its tp degree at once."""


def _in_lanes(ctx: Ctx, memo: dict[object, object], key: Any, run: Any,
              tp: Any) -> list[tuple[Ctx, Any]]:
    """``(c, result)`` for ``ctx`` and each shape of ``LANE_SHAPES[tp]`` whose ``key`` is not in
    ``memo``, from one ``run(lanes_ctx, k)`` (``lanes.py``: lane by lane what each shape's own
    run gives; its ``k`` results in lane order); when the lanes split, again with the shapes of
    ``ctx``'s sequence only, then ``run(ctx, 0)`` alone (a list of one result), as before."""
    shapes = memo.get(LANE_SHAPES, {}).get(tp, ())  # type: ignore[attr-defined]
    others = [c for c in (kept(memo, replace(ctx, batch=b, seq=q)) for b, q in shapes
                          if (b, q) != (ctx.batch, ctx.seq)) if key(c) not in memo]
    for group in (others, [c for c in others if c.seq == ctx.seq]):
        if not group:
            continue
        ctxs = [ctx] + group
        bs, qs = tuple(c.batch for c in ctxs), tuple(c.seq for c in ctxs)
        try:
            return list(zip(ctxs, run(replace(
                ctx, batch=Lanes(bs) if len(set(bs)) > 1 else ctx.batch,
                seq=Lanes(qs) if len(set(qs)) > 1 else ctx.seq), len(ctxs))))
        except (Split, TypeError):  # a size the lanes cannot carry (TypeError: an operation
            # Lanes does not define, hashing included): fewer lanes, exactly; any other error
            # is a bug and is raised
            memo["lane_splits"] = memo.get("lane_splits", 0) + 1  # type: ignore[operator]
        if all(c.seq == ctx.seq for c in others):
            break  # the second group is the first
    return [(ctx, run(ctx, 0)[0])]


def _lane_runs(spec: ModelSpec, layers: range, ctx: Ctx, args: dict[str, object], acc: bool,
               memo: dict[object, object], key: Any, relabel: bool) -> tuple[list[Point], int]:
    """The points of ``layers`` (``relabel``: from ``layer 0``) for ``ctx``, put in ``memo``
    under ``key(ctx)``, with the shapes of ``LANE_SHAPES`` in lanes (``_in_lanes``)."""

    def run(c: Ctx, k: int) -> list[tuple[list[Point], int]]:
        g = stage_graph(spec, layers, c, **args)  # type: ignore[arg-type]
        g.accumulate = acc
        return simulate_lanes(g, k) if k else [(simulate(g), g.param_grad_bytes)]

    for c, (points, grads) in _in_lanes(ctx, memo, key, run, args["tp"]):
        memo[key(c)] = ([Point(p.phase, _relabel(p.region, layers.start), p.saved, p.temp,
                               p.grads) for p in points] if relabel else points), grads
    return memo[key(ctx)]  # type: ignore[return-value]


def _compose_pays(new_layers: int, length: int) -> bool:
    """Composing a stage of ``length`` layers is the cheaper route: the short simulations it
    still has to run (``new_layers`` layers in all; the ones kept in the memo are free) are
    shorter than the whole stage's. Either route gives the same points."""
    return new_layers < length


def _relabel(region: str, start: int) -> str:
    return f"layer {int(region[6:]) - start}" if region.startswith("layer ") else region
