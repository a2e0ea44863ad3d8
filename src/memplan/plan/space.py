"""The search space of ``memplan plan``: every recipe the cluster and the model allow, with the
user's own keys held fixed.

What varies (unless fixed): ZeRO stage / FSDP sharding (hybrid across nodes for ZeRO-3), tp
(with and without sequence parallelism), pp (with virtual stages), cp and ep degrees that
divide the model and the cluster; micro-batch x gradient accumulation making up the global
batch; checkpointing; attention kernel; loss variant; CPU/NVMe offload; and the engine that
runs the combination (``engine_for``), so every candidate can be exported as it is.

Not searched but chosen: an engine that steps ``torch.optim`` (DDP, FSDP1/2, torchtitan) steps
Adam/AdamW with ``fused=True`` unless ``optimizer_impl`` is given (``FUSED_NOTE``): it has no
state-sized temporaries on the GPU or the host and its CPU step runs at the vectorised rate,
so the foreach and for-loop paths are never better on any number plan prints.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from ..errors import ConfigError
from ..model.spec import ModelSpec
from ..recipe import Recipe
from ..recipe.engine import TORCH_OPTIM_ENGINES, EngineKind
from ..recipe.parts import (Attention, Checkpointing, CheckpointingKind, Loss, LossKind,
                            Offload, OffloadKind, OptimizerImpl)

__all__ = ["Space", "SEARCHED", "LAYOUT_KEYS", "layout_of", "engines_for", "divisors"]

LAYOUT_KEYS = ("engine", "zero", "offload", "tp", "pp", "cp", "ep")
"""How the model is split and where its states live."""


def layout_of(recipe: Recipe) -> tuple[Any, ...]:
    """The recipe's ``LAYOUT_KEYS`` values."""
    p = recipe.parallelism
    return (str(recipe.engine.kind), p.zero, str(recipe.offload.kind), p.tp, p.pp, p.cp, p.ep)

CHECKPOINT_KEYS = frozenset({"checkpointing", "checkpoint_every", "checkpoint_layers",
                             "partition_activations", "cpu_checkpointing"})
"""Recipe keys of ``Checkpointing``: giving any holds the user's policy."""

SEARCHED = ("zero", "hybrid_shard", "offload", "engine", "tp", "sequence_parallel", "pp",
            "pp_virtual", "cp", "ep", "micro_batch", "grad_accum", "checkpointing",
            "attention", "loss")
"""Recipe keys ``plan`` chooses; any of them given by the user is held at the given value."""


FUSED_NOTE = (f"candidates that step torch.optim ({', '.join(TORCH_OPTIM_ENGINES)}) use its fused "
              "AdamW (\"fused > foreach > for-loop\" in speed, torch.optim's docs; no state-sized "
              "temporaries); give --optimizer-impl to hold another")
"""Said when ``Space.fused`` chose the fused step for some candidates."""


def divisors(n: int) -> list[int]:
    """Positive divisors of ``n`` in increasing order."""
    return [d for d in range(1, n + 1) if n % d == 0]


def engines_for(zero: int, offload: str, model_parallel: bool) -> tuple[str, ...]:
    """Concrete engines that run a sharding/offload choice (their docs, as encoded in
    ``recipe.engine``): data parallelism alone runs on DDP (zero 0), DeepSpeed (zero 1-3, every
    offload) and FSDP2 (zero 3, CPU offload); tensor/pipeline/context/expert parallelism on
    Megatron-Core (distributed optimizer = zero 1, optimizer CPU offload) or torchtitan
    (FSDP2 = zero 3, CPU offload)."""
    if model_parallel:
        out = []
        if zero in (0, 1) and offload in ("none", "optimizer"):
            out.append("megatron")
        if zero == 3 and offload in ("none", "params+optimizer"):
            out.append("torchtitan")
        return tuple(out)
    if zero == 0:
        return ("ddp",) if offload == "none" else ()
    out = ["deepspeed"]
    if zero == 3 and offload in ("none", "params+optimizer"):
        out.append("fsdp2")
    return tuple(out)


def _offload_ok(zero: int, offload: str) -> bool:
    """Recipe's own rule: optimizer offload needs ZeRO >= 1, parameter offload ZeRO-3."""
    if offload == "optimizer":
        return zero >= 1
    if offload in ("params+optimizer", "nvme"):
        return zero == 3
    return True


@dataclass(frozen=True, kw_only=True, slots=True)
class Space:
    """The candidates of one search."""

    base: Recipe
    """The user's recipe: every key not searched, and the searched keys in ``fixed``."""
    fixed: frozenset[str] = frozenset()
    """Recipe keys the user gave (held at ``base``'s value)."""
    gpus: int
    """World size."""
    gpus_per_node: int
    """GPUs per node."""
    global_batch: int | None = None
    """Sequences per optimizer step; None holds micro_batch and grad_accum as in ``base``."""
    max_micro_batch: int = 16
    """Largest micro-batch tried."""
    attention: tuple[str, ...] = (Attention.SDPA, Attention.FLASH)
    """Kernels tried (eager materialises the scores: never faster, never smaller)."""
    only: frozenset[tuple[Any, ...]] | None = None
    """When set, only these layouts (``LAYOUT_KEYS`` values) are searched (``size`` searches
    the layouts its fit probe found)."""
    notes: tuple[str, ...] = field(default=())
    """Said to the user about the space (e.g. the global batch assumed)."""

    def _choices(self, key: str, options: list[Any]) -> list[Any]:
        if key in self.fixed:
            value = self.base.to_dict()[key]
            return [value]
        return options

    def degrees(self, model: ModelSpec) -> Iterator[tuple[int, int, int, int, int, bool]]:
        """(tp, cp, pp, pp_virtual, ep, sequence_parallel) that divide model and cluster."""
        attn = next((ly.attention for ly in model.layers if ly.attention), None)
        experts = max((ly.ffn.num_experts for ly in model.layers if ly.ffn), default=0)
        heads, kv = (attn.num_heads, attn.num_kv_heads) if attn else (1, 1)
        local = self.gpus_per_node
        tps = [t for t in divisors(local) if heads % t == 0 and (kv % t == 0 or t % kv == 0)]
        seq = self.base.batch.seq_len
        cps = [c for c in divisors(self.gpus) if c <= 8 and (c == 1 or seq % (2 * c) == 0)]
        for tp in self._choices("tp", tps):
            for cp in self._choices("cp", cps):
                if self.gpus % (tp * cp):
                    continue
                rest = self.gpus // (tp * cp)
                pps = [p for p in divisors(rest) if p <= max(1, model.num_layers) and p <= 16]
                for pp in self._choices("pp", pps):
                    if rest % pp:
                        continue
                    dp = rest // pp
                    virtuals = [1] + [v for v in (2, 4) if pp > 1 and model.num_layers % (pp * v) == 0]
                    eps = [e for e in divisors(dp * cp) if experts and experts % e == 0] or [1]
                    sps = [False, True] if tp > 1 else [False]
                    for v in self._choices("pp_virtual", virtuals):
                        for ep in self._choices("ep", eps):
                            for sp in self._choices("sequence_parallel", sps):
                                yield tp, cp, pp, v, ep, sp

    def batches(self, dp: int) -> list[tuple[int, int]]:
        """(micro_batch, grad_accum) making up the global batch over ``dp`` replicas."""
        b = self.base.batch
        if self.global_batch is None:
            return [(b.micro_batch, b.grad_accum)]
        if self.global_batch % dp:
            return []
        per = self.global_batch // dp
        out = []
        for mb in self._choices("micro_batch", [m for m in divisors(per)
                                                if m <= self.max_micro_batch]):
            if per % mb == 0:
                ga = per // mb
                if "grad_accum" in self.fixed and ga != b.grad_accum:
                    continue
                out.append((mb, ga))
        return out

    def sharding(self, dp: int, model_parallel: bool) -> Iterator[tuple[int, int, str, str]]:
        """(zero, hybrid_shard, offload, engine) runnable over ``dp`` replicas."""
        nodes_span = dp > 1 and self.gpus > self.gpus_per_node
        for zero in self._choices("zero", [0, 1, 2, 3] if dp > 1 else [0, 3]):
            hybrids = [0]
            if zero == 3 and nodes_span and not model_parallel:
                hybrids += [h for h in (self.gpus_per_node,) if dp % h == 0 and h < dp]
            for hybrid in self._choices("hybrid_shard", hybrids):
                for off in self._choices("offload", [str(o) for o in OffloadKind]):
                    if not _offload_ok(zero, off):
                        continue
                    engines = engines_for(zero, off, model_parallel)
                    for eng in self._choices("engine", list(engines)):
                        yield zero, hybrid, off, eng

    @property
    def fused(self) -> bool:
        """Whether candidates on torch.optim engines step fused Adam/AdamW (the user gave no
        ``optimizer_impl``, and the optimizer has a fused path)."""
        return ("optimizer_impl" not in self.fixed and self.base.optimizer.impl == "auto"
                and str(self.base.optimizer.kind) in ("adam", "adamw")
                and ("engine" not in self.fixed
                     or str(self.base.engine.kind) in TORCH_OPTIM_ENGINES))

    def checkpointings(self) -> list[Checkpointing]:
        """The checkpointing policies tried: every kind (Megatron ``selective``, torchtitan
        ``op``, ``full``) and torchtitan's default layer policy (``full`` on every second
        layer); the user's own when any checkpointing key is given."""
        if self.fixed & CHECKPOINT_KEYS:
            return [self.base.checkpointing]
        return [Checkpointing(kind=CheckpointingKind(c)) for c in CheckpointingKind] + [
            Checkpointing(kind=CheckpointingKind.FULL, checkpoint_every=2)]

    def recipes(self, model: ModelSpec) -> Iterator[Recipe]:
        """Every candidate recipe (valid by the recipe's own checks), each once. Equal parts
        are one object across candidates (``_shared``): the evaluator's memo keys hold them,
        and a key compares its parts by identity first."""
        base = self.base
        ckpts = self.checkpointings()
        attns = self._choices("attention", [str(a) for a in self.attention])
        # litgpt's two losses are a framework's fixed code path, not a knob: not searched
        losses = self._choices("loss", [str(k) for k in LossKind if k not in (
            LossKind.CHUNKED_HEAD, LossKind.CHUNKED_CE)])
        platforms = _made([lambda at=at: replace(base.platform, attention=Attention(at))
                           for at in attns])
        loss_parts = _made([lambda loss=loss: Loss(kind=LossKind(loss)) for loss in losses])
        shared: dict[object, object] = {}
        fused = replace(base.optimizer, impl=OptimizerImpl.FUSED) if self.fused else None
        for tp, cp, pp, v, ep, sp in self.degrees(model):
            dp = self.gpus // (tp * cp * pp)
            model_parallel = tp > 1 or cp > 1 or pp > 1 or ep > 1
            par0 = replace(base.parallelism, gpus=self.gpus, gpus_per_node=self.gpus_per_node,
                           tp=tp, cp=cp, pp=pp, pp_virtual=v, ep=ep, sequence_parallel=sp)
            batches = [_shared(shared, replace(base.batch, micro_batch=mb, grad_accum=ga))
                       for mb, ga in self.batches(dp)]
            for zero, hybrid, off, eng in self.sharding(dp, model_parallel):
                par = replace(par0, zero=zero, hybrid_shard=hybrid)
                if self.only is not None and (eng, zero, off, tp, pp, cp, ep) not in self.only:
                    continue
                try:
                    r0 = replace(base, parallelism=par,
                                 offload=_shared(shared, Offload(kind=OffloadKind(off))),
                                 engine=_shared(shared, replace(base.engine,
                                                                kind=EngineKind(eng))))
                except ConfigError:
                    continue
                if fused is not None and eng in TORCH_OPTIM_ENGINES:
                    r0 = replace(r0, optimizer=fused)
                for batch in batches:
                    for ck in ckpts:
                        for platform in platforms:
                            for loss in loss_parts:
                                try:
                                    yield replace(r0, batch=batch, checkpointing=ck,
                                                  platform=platform, loss=loss)
                                except ConfigError:
                                    continue


T = TypeVar("T")


def _shared(seen: dict[object, object], part: T) -> T:
    """The object equal to ``part`` seen first (``part`` itself the first time)."""
    return seen.setdefault(part, part)  # type: ignore[return-value]


def _made(makers: list[Callable[[], T]]) -> list[T]:
    """Each maker's part, in order, leaving out those the part's own checks refuse
    (``ConfigError``): the candidates with them are skipped, as when a part is made per
    candidate."""
    out = []
    for make in makers:
        try:
            out.append(make())
        except ConfigError:
            continue
    return out
