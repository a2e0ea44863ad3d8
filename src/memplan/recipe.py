"""``Recipe``: how a model is trained (precision, optimizer, fine-tuning method, batch shape,
parallelism, offload). Frozen and validated on construction; every problem is reported at once.

A recipe is written in Python, in a TOML file (the same names as the CLI flags, with
underscores), or assembled from CLI flags over a TOML file.
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from .errors import ConfigError, ModelConfigError, Problems, did_you_mean
from .model.spec import LORA_TARGETS

__all__ = ["Recipe", "PRECISIONS", "OPTIMIZERS", "METHODS", "QUANTS", "OFFLOADS"]

PRECISIONS = ("32-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true", "fp8-mixed")
OPTIMIZERS = ("adamw", "adam", "sgd", "sgd-momentum", "adafactor", "lion", "adamw-8bit",
              "paged-adamw", "paged-adamw-8bit")
METHODS = ("full", "lora", "qlora", "freeze")
QUANTS = ("none", "nf4", "nf4-dq", "int8")
CHECKPOINTING = ("none", "selective", "full")
ATTENTION = ("eager", "sdpa", "flash")
LOSSES = ("standard", "chunked", "fused")
OFFLOADS = ("none", "optimizer", "params+optimizer", "nvme")
DEVICES = ("cuda", "cpu")
ADAPTER_DTYPES = ("fp32", "bf16", "fp16")
GRAD_DTYPES = ("auto", "fp32")


@dataclass(frozen=True, kw_only=True, slots=True)
class Recipe:
    """A training configuration. Field names double as TOML keys and CLI flags."""

    precision: str = "bf16-mixed"
    """``32-true``; ``16-mixed``/``bf16-mixed`` (16-bit compute, fp32 master weights);
    ``16-true``/``bf16-true`` (everything in 16-bit); ``fp8-mixed`` (Transformer Engine FP8 GEMMs)."""
    optimizer: str = "adamw"
    """One of ``OPTIMIZERS``; ``*-8bit`` and ``paged-*`` are the bitsandbytes optimizers."""
    method: str = "full"
    """``full`` fine-tuning / pre-training, ``lora``, ``qlora`` (quantized frozen base + LoRA),
    ``freeze`` (train only the last ``freeze_trainable_layers`` layers)."""
    lora_rank: int = 16
    """LoRA rank r: each adapted linear (out x in) gains r x (in + out) trainable parameters."""
    lora_alpha: int = 32
    """LoRA scaling numerator; recorded for completeness, it does not change memory."""
    lora_targets: tuple[str, ...] = LORA_TARGETS
    """Which linears get adapters: subset of ``q,k,v,o,gate,up,down`` (``all-linear`` = all)."""
    adapter_dtype: str = "fp32"
    """dtype of LoRA weights. PEFT keeps adapters in fp32 by default (``autocast_adapter_dtype``)."""
    quant: str = "none"
    """Storage of the frozen base under ``qlora``: ``nf4``, ``nf4-dq`` (double-quantized scales,
    QLoRA's default), ``int8`` (LLM.int8). ``none`` for every other method."""
    freeze_trainable_layers: int = 2
    """With ``method = freeze``: how many last layers train (LLaMA-Factory's default is 2)."""
    micro_batch: int = 1
    """Sequences per GPU per forward/backward."""
    seq_len: int = 2048
    """Tokens per sequence."""
    grad_accum: int = 1
    """Micro-batches accumulated before each optimizer step."""
    checkpointing: str = "none"
    """Activation checkpointing: ``none``, ``selective`` (attention recomputed), ``full`` (per layer)."""
    attention: str = "sdpa"
    """Attention kernel: ``eager`` (materialises scores), ``sdpa``, ``flash``."""
    loss: str = "standard"
    """Cross-entropy of causal LMs: ``standard`` (HF ``ForCausalLMLoss``: full fp32 logits),
    ``chunked`` (torchtune ``CEWithChunkedOutputLoss``: output projection and fp32 upcast in 8
    sequence chunks), ``fused`` (Liger ``LigerFusedLinearCrossEntropyLoss``: logits never
    materialised, gradients computed in the forward)."""
    gpus: int = 1
    """GPUs in the job (world size)."""
    gpus_per_node: int = 0
    """GPUs per node; 0 means min(gpus, 8)."""
    zero: int = 0
    """ZeRO stage over the data-parallel group: 0 (DDP), 1 (optimizer states sharded),
    2 (+ gradients), 3 (+ parameters; FSDP full shard)."""
    hybrid_shard: int = 0
    """FSDP hybrid shard / ZeRO++ hpZ: shard within groups of this many ranks (0 = all of DP)."""
    tp: int = 1
    """Tensor-parallel degree (Megatron column/row splits; must divide attention and kv heads)."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism (``--sequence-parallel``): with tp > 1, norms, dropout and
    residual activations are split over the TP ranks along the sequence (Korthikanti et al.
    2022, arXiv 2205.05198, §4.2.2)."""
    pp: int = 1
    """Pipeline-parallel stages."""
    pp_virtual: int = 1
    """Model chunks per pipeline rank (Megatron ``--num-layers-per-virtual-pipeline-stage``):
    1 is the plain 1F1B schedule, more is the interleaved schedule (smaller bubble, more
    activations in flight)."""
    cp: int = 1
    """Context-parallel degree (sequence split across ranks for attention)."""
    moe_capacity_factor: float = 0.0
    """MoE expert capacity as a multiple of the balanced share ``tokens x top_k / experts``,
    inputs padded to it (GShard; Megatron ``--moe-expert-capacity-factor`` with
    ``--moe-pad-expert-input-to-capacity``). 0: dropless, every routed token once."""
    ep: int = 1
    """Expert-parallel degree (MoE experts split across ranks)."""
    offload: str = "none"
    """``optimizer`` (ZeRO-Offload: states and fp32 master on the host), ``params+optimizer``
    (ZeRO-3 / FSDP CPU offload), ``nvme`` (ZeRO-Infinity: states and params on NVMe)."""
    device: str = "cuda"
    """``cuda``, or ``cpu`` to compare with CPU runs (no CUDA context, workspaces or NCCL)."""
    expandable_segments: bool = False
    """``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``: the caching allocator maps memory
    in pages on demand, which removes most of its fragmentation (PyTorch default: off)."""
    grad_dtype: str = "auto"
    """``auto``: gradients in the parameters' dtype; ``fp32``: fp32 gradient accumulation
    buffers for 16-bit parameters (Megatron's ``main_grad``)."""
    notes: tuple[str, ...] = field(default=(), compare=False)
    """Free-form remarks carried into the report."""

    def __post_init__(self) -> None:
        p = Problems()
        p.choice("precision", self.precision, PRECISIONS)
        p.choice("optimizer", self.optimizer, OPTIMIZERS)
        p.choice("method", self.method, METHODS)
        p.choice("quant", self.quant, QUANTS)
        p.choice("checkpointing", self.checkpointing, CHECKPOINTING)
        p.choice("attention", self.attention, ATTENTION)
        p.choice("loss", self.loss, LOSSES)
        p.choice("offload", self.offload, OFFLOADS)
        p.choice("device", self.device, DEVICES)
        p.choice("adapter_dtype", self.adapter_dtype, ADAPTER_DTYPES)
        p.choice("grad_dtype", self.grad_dtype, GRAD_DTYPES)
        for name in ("lora_rank", "micro_batch", "seq_len", "grad_accum", "gpus", "tp", "pp",
                     "pp_virtual", "cp", "ep", "freeze_trainable_layers"):
            p.positive(name, getattr(self, name))
        for t in self.lora_targets:
            if t not in LORA_TARGETS:
                p.add(f"lora_targets: {t!r} is not one of {', '.join(LORA_TARGETS)} "
                      f"(or 'all-linear').{did_you_mean(t, LORA_TARGETS)}")
        if not self.lora_targets:
            p.add("lora_targets is empty; name at least one of q,k,v,o,gate,up,down.")
        if not isinstance(self.expandable_segments, bool):
            p.add(f"expandable_segments={self.expandable_segments!r} must be true or false.")
        if self.zero not in (0, 1, 2, 3):
            p.add(f"zero={self.zero!r} is out of range: ZeRO stages are 0, 1, 2 or 3.")
        if p:
            p.raise_if_any()
        self._check_combinations(p)
        p.raise_if_any()

    def _check_combinations(self, p: Problems) -> None:
        if self.method == "qlora" and self.quant == "none":
            p.add("method=qlora needs a quantized base: set quant to nf4, nf4-dq or int8 "
                  "(QLoRA's default is nf4-dq), or use method=lora.")
        if self.method != "qlora" and self.quant != "none":
            p.add(f"quant={self.quant} only applies to method=qlora: quantized base weights are "
                  "frozen, so full/freeze training cannot update them. Use method=qlora or quant=none.")
        model_parallel = self.tp * self.pp * self.cp
        if self.gpus % model_parallel:
            p.add(f"gpus={self.gpus} is not divisible by tp*pp*cp={model_parallel}; "
                  "data parallelism needs whole replicas. Change gpus or the parallel degrees.")
        elif (self.dp * self.cp) % self.ep:
            p.add(f"ep={self.ep} must divide dp*cp={self.dp * self.cp} (experts are spread over "
                  "data-parallel ranks, as in Megatron-Core). Lower ep or add GPUs.")
        if self.gpus_per_node < 0:
            p.add(f"gpus_per_node={self.gpus_per_node} must be >= 1 (or 0 for min(gpus, 8)).")
        if self.hybrid_shard:
            if self.zero != 3:
                p.add("hybrid_shard needs zero=3 (FSDP HYBRID_SHARD shards parameters).")
            elif self.hybrid_shard < 1 or self.dp % self.hybrid_shard:
                p.add(f"hybrid_shard={self.hybrid_shard} must divide the data-parallel size "
                      f"dp={self.dp}.")
        if not isinstance(self.moe_capacity_factor, (int, float)) or self.moe_capacity_factor < 0:
            p.add(f"moe_capacity_factor={self.moe_capacity_factor!r} must be a number >= 0 "
                  "(0 = dropless; 1.0-1.25 is usual).")
        if not isinstance(self.sequence_parallel, bool):
            p.add(f"sequence_parallel={self.sequence_parallel!r} must be true or false.")
        elif self.sequence_parallel and self.tp == 1:
            p.add("sequence_parallel needs tensor parallelism (tp > 1): it splits the sequence "
                  "over the TP ranks. Set tp or drop sequence_parallel.")
        if self.pp_virtual > 1 and self.pp == 1:
            p.add(f"pp_virtual={self.pp_virtual} needs pipeline parallelism (pp > 1): the "
                  "interleaved schedule splits each pipeline rank's layers into chunks.")
        if self.offload == "optimizer" and self.zero == 0:
            p.add("offload=optimizer needs zero>=1 (ZeRO-Offload partitions the optimizer "
                  "before moving it to the host). Set zero to 1, 2 or 3.")
        if self.offload in ("params+optimizer", "nvme") and self.zero != 3:
            p.add(f"offload={self.offload} needs zero=3 (only ZeRO-3/FSDP can keep parameters "
                  "off the GPU between uses).")
        if self.offload != "none" and self.device == "cpu":
            p.add("offload moves GPU memory to the host; it has no meaning with device=cpu.")
        if self.precision == "fp8-mixed" and self.device == "cpu":
            p.add("precision=fp8-mixed needs FP8 tensor cores (Hopper or newer); use device=cuda.")

    # ---- derived values -------------------------------------------------------------------

    @property
    def dp(self) -> int:
        """Data-parallel size: gpus / (tp * pp * cp)."""
        return max(1, self.gpus // (self.tp * self.pp * self.cp))

    @property
    def shard_degree(self) -> int:
        """Ranks over which ZeRO/FSDP shards dense states: dp*cp (Megatron shards the
        distributed optimizer over DP x CP), or the hybrid-shard group size."""
        return self.hybrid_shard or self.dp * self.cp

    @property
    def expert_shard_degree(self) -> int:
        """Ranks over which ZeRO shards expert states: the expert-data-parallel size dp*cp/ep."""
        return max(1, self.shard_degree // self.ep)

    @property
    def local_gpus(self) -> int:
        return self.gpus_per_node or min(self.gpus, 8)

    # ---- construction ---------------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, where: str = "recipe") -> Recipe:
        """Build from plain values (TOML, JSON, CLI); unknown keys get close-match suggestions."""
        names = [f.name for f in fields(cls)]
        p = Problems()
        values: dict[str, Any] = {}
        for key, value in data.items():
            name = key.replace("-", "_")
            if name not in names:
                p.add(f"{where}: unknown key {key!r}.{did_you_mean(name, names)}")
                continue
            if name in ("lora_targets", "notes"):
                value = _as_tuple(value)
                if name == "lora_targets" and value in (("all-linear",), ("all",)):
                    value = LORA_TARGETS
            values[name] = value
        p.raise_if_any()
        return cls(**values)

    @classmethod
    def from_toml(cls, path: str | Path) -> Recipe:
        """Read a recipe TOML; malformed TOML names the file, line and what was expected."""
        data = read_recipe_toml(path)
        data.pop("host", None)  # the [host] table is memplan.host.HostSetup's (issue #5)
        return cls.from_dict(data, where=str(path))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["lora_targets"] = list(self.lora_targets)
        d["notes"] = list(self.notes)
        d["dp"] = self.dp
        return d


def read_recipe_toml(path: str | Path) -> dict[str, Any]:
    """The contents of a recipe TOML (the recipe's keys and its optional ``[host]`` table);
    unreadable or malformed files name the file, line and what was expected."""
    path = Path(path)
    try:
        return tomllib.loads(path.read_text())
    except OSError as e:
        raise ModelConfigError(f"cannot read recipe {path}: {e.strerror}.") from None
    except tomllib.TOMLDecodeError as e:
        raise ModelConfigError(f"{path}: malformed TOML: {e}. Expected `key = value` lines "
                               "with the recipe's field names.") from None


def _as_tuple(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    if isinstance(value, (list, tuple)):
        return tuple(str(v) for v in value)
    raise ConfigError([f"expected a list or comma-separated string, got {value!r}"])
