"""The parts a ``Recipe`` is composed of: frozen, keyword-only, one concern each.

Every field carries a docstring (it becomes the CLI help and the web form's label), its choices
are a ``StrEnum``, and numeric bounds sit in the field's ``metadata`` (``min``/``max``). A
field's *key* (its TOML key and CLI flag) is its name, or ``metadata["key"]`` for the part's
main field (``Precision.kind`` is ``precision``). Keys are unique across parts, so a recipe is
also a flat table of keys.

Each part checks its own fields (``check_part``) and reports every problem at once; checks that
span parts (``qlora`` needs a quantised base, offload needs ZeRO...) live in ``Recipe``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from ..errors import ConfigError
from ..model.spec import LORA_HEAD, LORA_TARGETS
from .check import check_part
from .loop import Loop
from .engine import Engine
from .parallelism import Parallelism

__all__ = [
    "PrecisionKind", "GradDtype", "FrozenDtype", "OptimizerKind", "MethodKind", "Quant", "AdapterDtype",
    "CheckpointingKind", "Attention", "LossKind", "OffloadKind", "DeviceKind",
    "Precision", "Optimizer", "Method", "Batch", "Parallelism", "Checkpointing", "Offload",
    "Loss", "Platform", "PARTS",
]


class PrecisionKind(StrEnum):
    """Lightning's precision names."""

    FP32 = "32-true"
    FP16_MIXED = "16-mixed"
    BF16_MIXED = "bf16-mixed"
    FP16_TRUE = "16-true"
    BF16_TRUE = "bf16-true"
    FP8_MIXED = "fp8-mixed"


class GradDtype(StrEnum):
    AUTO = "auto"
    FP32 = "fp32"


class FrozenDtype(StrEnum):
    AUTO = "auto"
    FP32 = "fp32"


class OptimizerKind(StrEnum):
    ADAMW = "adamw"
    ADAM = "adam"
    SGD = "sgd"
    SGD_MOMENTUM = "sgd-momentum"
    ADAFACTOR = "adafactor"
    LION = "lion"
    ADAMW_8BIT = "adamw-8bit"
    PAGED_ADAMW = "paged-adamw"
    PAGED_ADAMW_8BIT = "paged-adamw-8bit"


class MethodKind(StrEnum):
    FULL = "full"
    LORA = "lora"
    QLORA = "qlora"
    FREEZE = "freeze"
    DORA = "dora"
    LORA_FA = "lora-fa"
    VERA = "vera"
    IA3 = "ia3"
    PROMPT_TUNING = "prompt-tuning"
    PREFIX_TUNING = "prefix-tuning"
    LN_TUNING = "ln-tuning"
    BITFIT = "bitfit"
    ADAPTER = "adapter"


class Quant(StrEnum):
    NONE = "none"
    NF4 = "nf4"
    NF4_DQ = "nf4-dq"
    INT8 = "int8"
    GPTQ_INT4 = "gptq-int4"


class OptimizerImpl(StrEnum):
    AUTO = "auto"
    FOREACH = "foreach"
    FOREACH_TORCH20 = "foreach-torch2.0"
    FOR_LOOP = "for-loop"
    FUSED = "fused"


class Quantizer(StrEnum):
    BITSANDBYTES = "bitsandbytes"
    TORCHAO = "torchao"
    TORCHAO_0_1 = "torchao-0.1"
    LIGHTNING_BNB = "lightning-bnb"


class AdapterDtype(StrEnum):
    AUTO = "auto"
    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"


class CheckpointingKind(StrEnum):
    NONE = "none"
    SELECTIVE = "selective"
    OP = "op"
    FULL = "full"


class Attention(StrEnum):
    EAGER = "eager"
    SDPA = "sdpa"
    FLASH = "flash"


class LossKind(StrEnum):
    STANDARD = "standard"
    CHUNKED = "chunked"
    FUSED = "fused"
    CHUNKED_HEAD = "chunked-head"
    CHUNKED_CE = "chunked-ce"


class LogitsUpcast(StrEnum):
    LOSS = "loss"
    MODEL = "model"
    NONE = "none"


class OffloadKind(StrEnum):
    NONE = "none"
    OPTIMIZER = "optimizer"
    PARAMS_OPTIMIZER = "params+optimizer"
    NVME = "nvme"


class CompileScope(StrEnum):
    BLOCKS = "blocks"
    MODEL = "model"


class DeviceKind(StrEnum):
    CUDA = "cuda"
    CPU = "cpu"


def _key(name: str, **bounds: float) -> dict[str, object]:
    return {"key": name, **bounds}


@dataclass(frozen=True, kw_only=True, slots=True)
class Precision:
    """Numeric formats of weights, compute and gradients."""

    kind: PrecisionKind = field(default=PrecisionKind.BF16_MIXED, metadata=_key("precision"))
    """``32-true``; ``16-mixed``/``bf16-mixed`` (16-bit compute, fp32 master weights);
    ``16-true``/``bf16-true`` (everything in 16-bit); ``fp8-mixed`` (Transformer Engine FP8
    GEMMs)."""
    grad_dtype: GradDtype = GradDtype.AUTO
    """``auto``: gradients in the parameters' dtype; ``fp32``: fp32 gradient accumulation
    buffers for 16-bit parameters (Megatron's ``main_grad``)."""
    frozen_dtype: FrozenDtype = FrozenDtype.AUTO
    """Storage of the frozen (non-trained) weights. ``auto``: the precision's: 16-bit under
    ``-mixed`` and ``-true`` (the usual PEFT recipe loads the checkpoint with ``torch_dtype``
    bf16), fp32 under ``32-true``; ``fp32``: the frozen base stays fp32 under autocast
    (``from_pretrained`` / ``from_config`` without ``torch_dtype``, PEFT's own examples;
    autocast casts each frozen weight to 16 bits where it is used)."""

    def __post_init__(self) -> None:
        check_part(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class Optimizer:
    """The optimizer (its states and step temporaries come from the optimizer table)."""

    kind: OptimizerKind = field(default=OptimizerKind.ADAMW, metadata=_key("optimizer"))
    """Optimizer; ``*-8bit`` and ``paged-*`` are the bitsandbytes optimizers."""
    impl: OptimizerImpl = field(default=OptimizerImpl.AUTO, metadata=_key("optimizer_impl"))
    """How a torch optimizer steps (``foreach=`` / ``fused=`` of torch.optim): ``auto``
    (torch's default for the device: foreach on CUDA, the for-loop on CPU, an offloaded
    optimizer's host included; torchtitan's default: fused; DeepSpeed and Megatron step their
    own fused Adam), ``foreach`` (one state-sized temporary of every
    tensor at once), ``foreach-torch2.0`` (torch < 2.1's foreach Adam/AdamW: two at once,
    ``exp_avg_sq_sqrt`` and ``denom = torch._foreach_add(exp_avg_sq_sqrt, eps)``; pytorch#97712,
    removed by #104780 / #104898 in 2.1), ``for-loop`` (temporaries of one tensor at a time),
    ``fused`` (none)."""
    in_backward: bool = field(default=False, metadata=_key("optimizer_in_backward"))
    """Step each parameter as soon as its gradient is accumulated and free that gradient
    (torchtune ``optimizer_in_bwd``: one optimizer per parameter, stepped and zeroed in a
    ``register_post_accumulate_grad_hook``), so at most one parameter's gradient and step
    temporaries exist at a time. Single device, no gradient accumulation."""

    def __post_init__(self) -> None:
        check_part(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class Method:
    """What trains: every weight, LoRA adapters (on a quantised base for QLoRA), or the last
    layers."""

    kind: MethodKind = field(default=MethodKind.FULL, metadata=_key("method"))
    """``full`` fine-tuning / pre-training, ``lora``, ``qlora`` (quantized frozen base + LoRA),
    ``freeze`` (train only the last ``freeze_trainable_layers`` layers; the backward stops
    there). PEFT methods, where the gradient flows back through the whole frozen network:
    ``dora`` (LoRA + magnitude), ``lora-fa`` (LoRA with frozen A), ``vera`` (shared frozen
    projections, trained scaling vectors), ``ia3`` (learned rescaling vectors),
    ``prompt-tuning`` / ``prefix-tuning`` (``virtual_tokens``), ``ln-tuning`` (norms train),
    ``bitfit`` (biases train), ``adapter`` (any method with ``adapter_params`` trainable
    parameters)."""
    lora_rank: int = field(default=16, metadata={"min": 1, "max": 65536})
    """LoRA rank r: each adapted linear (out x in) gains r x (in + out) trainable parameters."""
    lora_alpha: int = 32
    """LoRA scaling numerator; recorded for completeness, it does not change memory."""
    lora_dropout: float = field(default=0.0, metadata={"min": 0.0, "below": 1.0})
    """Dropout probability on each adapter's input (PEFT ``LoraConfig.lora_dropout`` /
    ``VeraConfig.vera_dropout``, default 0: ``nn.Identity``; litgpt ``lora_dropout``). With
    p > 0 every adapted linear runs ``lora_B(lora_A(dropout(x)))`` (peft 0.21.2
    ``tuners/lora/layer.py`` ``Linear.forward``): one ``nn.Dropout`` per adapted linear, whose
    mask (1 B per element on CUDA's ``native_dropout``, the input dtype on CPU) and output
    (saved by ``lora_A``'s matmul for its weight gradient) stay until the backward. Applies to
    ``lora``, ``qlora``, ``lora-fa`` and ``vera``; 0 for every other method."""
    lora_dropout_qkv_shared: bool = False
    """With ``lora_dropout`` > 0: the q, k and v adapters read one dropout of their common input,
    as litgpt's fused ``LoRAQKVLinear`` does (``F.linear(self.lora_dropout(x), self.lora_A)``,
    one ``lora_A`` for the enabled q/k/v; litgpt/lora.py @a2bc1403), so one mask and one dropped
    input per layer instead of PEFT's one per adapted linear (false)."""
    lora_targets: tuple[str, ...] = field(default=LORA_TARGETS, metadata={
        "choices": LORA_TARGETS + (LORA_HEAD,), "all": LORA_TARGETS})
    """Which linears get adapters: comma list of ``q,k,v,o,gate,up,down`` (``all-linear`` =
    all of them), plus ``lm_head`` for the untied output layer (torchtune
    ``apply_lora_to_output``, litgpt ``lora_head``; not part of ``all-linear``, as in PEFT)."""
    modules_to_save: tuple[str, ...] = field(default=(), metadata={
        "choices": ("embed", "lm_head"), "empty": True})
    """With a PEFT method: whole modules that train next to the adapters, PEFT's
    ``modules_to_save`` (``embed``: the input embedding, ``lm_head``: the output layer; 'none'
    by default). PEFT keeps the frozen original and trains a copy (``ModulesToSaveWrapper``):
    one more weight in the parameters' dtype, with its gradient and optimizer states."""
    adapter_dtype: AdapterDtype = AdapterDtype.AUTO
    """dtype of PEFT adapter weights. ``auto``: what the engine leaves them in: fp32, PEFT's
    default (``autocast_adapter_dtype``), except under DeepSpeed ZeRO-1/2 with a 16-bit
    precision, whose engine casts the whole module, adapters included, to the 16-bit dtype
    (``facts.dtypes`` cites the source). ``fp32``/``bf16``/``fp16``: as given."""
    quant: Quant = Quant.NONE
    """Storage of the frozen base under ``qlora``: ``nf4``, ``nf4-dq`` (double-quantized
    scales, QLoRA's default), ``int8`` (LLM.int8), ``gptq-int4`` (a GPTQ 4-bit checkpoint, group
    size 128, loaded by auto-gptq, e.g. Qwen's -Int4 models). ``none`` for every other method."""
    quantizer: Quantizer = Quantizer.BITSANDBYTES
    """Library that quantises the base on the GPU while the model loads (``qlora`` with ``nf4``,
    ``nf4-dq`` or ``int8``; its largest temporary is a moment of the load phase):
    ``bitsandbytes`` (PEFT / HF ``BitsAndBytesConfig``), ``torchao`` (torchtune's
    ``NF4Tensor``, torchao >= 0.2: quantised in chunks of 2^20 elements), ``torchao-0.1``
    (torchtune until May 2024: the whole weight at once, 64 B per element of temporaries),
    ``lightning-bnb`` (Lightning Fabric's ``BitsandbytesPrecision`` as litgpt's ``--quantize
    bnb.*`` runs it, with the bitsandbytes 0.42.0 litgpt pinned from 2024-03 to 2024-12: every
    ``nn.Linear``, the output head included, quantised from an fp16 copy; each 4-bit linear
    keeps its input until the autograd graph is freed). bitsandbytes' training matmul
    dequantises each 4-bit weight in the forward and again in the backward (to 0.49.x)."""
    freeze_trainable_layers: int = field(default=2, metadata={"min": 1})
    """With ``method = freeze``: how many last layers train (LLaMA-Factory's default is 2)."""
    virtual_tokens: int = field(default=20, metadata={"min": 1})
    """With ``prompt-tuning`` / ``prefix-tuning``: PEFT's ``num_virtual_tokens`` (prompt
    tuning lengthens every sequence by this many tokens; prefix tuning adds this many keys and
    values to every layer's attention)."""
    adapter_params: int = field(default=0, metadata={"min": 0})
    """With ``method = adapter``: trainable parameters of an adapter memplan does not model by
    name (frozen base, gradients through every layer; kept in ``adapter_dtype``)."""

    def __post_init__(self) -> None:
        check_part(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class Batch:
    """The shape of the data one GPU sees per step (the global batch is derived:
    ``Recipe.global_batch``)."""

    micro_batch: int = field(default=1, metadata={"min": 1, "max": 1_000_000})
    """Sequences per GPU per forward/backward."""
    seq_len: int = field(default=2048, metadata={"min": 1, "max": 1 << 27})
    """Tokens per sequence."""
    grad_accum: int = field(default=1, metadata={"min": 1, "max": 1_000_000})
    """Micro-batches accumulated before each optimizer step."""

    def __post_init__(self) -> None:
        check_part(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class Checkpointing:
    """Activation checkpointing (recomputation in the backward), as the engines define it
    (``estimate/activations/policy.py`` cites each engine's source)."""

    kind: CheckpointingKind = field(default=CheckpointingKind.NONE,
                                    metadata=_key("checkpointing"))
    """Activation checkpointing: ``none``; ``selective``: Megatron's ``--recompute-granularity
    selective`` (its default ``recompute_modules = ["core_attn"]``: the attention core is
    recomputed); ``op``: torchtitan's per-op selective policy (``selective_ac_option = "op"``:
    each block recomputed except the outputs of its save list, matmuls and fused attention,
    every second ``mm`` recomputed); ``full``: each checkpointed layer keeps only its input
    (HF ``gradient_checkpointing``, Megatron ``full``, torchtitan ``full``)."""
    checkpoint_every: int = field(default=1, metadata={"min": 1, "max": 1024})
    """With ``full``: checkpoint one layer in every k (torchtitan ``selective_ac_option = k``,
    its default 2: layers k-1, 2k-1, ... of each stage); 1: every layer."""
    checkpoint_layers: int = field(default=0, metadata={"min": 0})
    """With ``full``: checkpoint only the first N layers of each pipeline stage (Megatron
    ``--recompute-method block --recompute-num-layers N``); 0: all."""
    partition_activations: bool = False
    """With ``full``: DeepSpeed ``activation_checkpointing.partition_activations`` (Megatron
    ``distribute_saved_activations``): each checkpointed layer input is split over the
    tensor-parallel ranks (1/tp each), all-gathered again for the recompute."""
    cpu_checkpointing: bool = False
    """With ``full``: the checkpointed layer inputs live in host RAM (counted on the host),
    copied back for the recompute. DeepSpeed ``activation_checkpointing.cpu_checkpointing``;
    torchtune ``enable_activation_offloading`` with activation checkpointing (0.6.1
    ``training/_activation_offloading.py`` ``OffloadActivations``: a saved-tensors hook copies
    every saved tensor of 1 KiB or more to pinned host memory, and torch's non-reentrant
    checkpoint saves the layer inputs through it, ``_NoopSaveInputs``)."""

    def __post_init__(self) -> None:
        check_part(self)
        extra = [k for k, v in (("checkpoint_every", self.checkpoint_every != 1),
                                ("checkpoint_layers", self.checkpoint_layers != 0),
                                ("partition_activations", self.partition_activations),
                                ("cpu_checkpointing", self.cpu_checkpointing)) if v]
        problems = []
        if extra and self.kind != CheckpointingKind.FULL:
            problems.append(f"{', '.join(extra)} set with checkpointing={self.kind}: these "
                            "choose which layers are checkpointed and where their inputs live, "
                            "so they need checkpointing=full. Set checkpointing=full or drop "
                            "them.")
        if self.checkpoint_every != 1 and self.checkpoint_layers:
            problems.append(f"checkpoint_every={self.checkpoint_every} and checkpoint_layers="
                            f"{self.checkpoint_layers}: one picks every k-th layer (torchtitan), "
                            "the other the first N (Megatron block); set one.")
        if problems:
            raise ConfigError(problems)


@dataclass(frozen=True, kw_only=True, slots=True)
class Offload:
    """Where model states live when they are not on the GPU."""

    kind: OffloadKind = field(default=OffloadKind.NONE, metadata=_key("offload"))
    """``optimizer`` (ZeRO-Offload: states and fp32 master on the host), ``params+optimizer``
    (ZeRO-3 / FSDP CPU offload), ``nvme`` (ZeRO-Infinity: states and params on NVMe)."""

    def __post_init__(self) -> None:
        check_part(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class Loss:
    """How the cross-entropy of a causal LM is computed."""

    kind: LossKind = field(default=LossKind.STANDARD, metadata=_key("loss"))
    """Cross-entropy of causal LMs: ``standard`` (HF ``ForCausalLMLoss``: full fp32 logits),
    ``chunked`` (torchtune ``CEWithChunkedOutputLoss``: output projection and fp32 upcast in 8
    sequence chunks), ``fused`` (Liger ``LigerFusedLinearCrossEntropyLoss``: logits never
    materialised, gradients computed in the forward), ``chunked-head`` (litgpt
    ``finetune/lora.py``: ``model(input_ids, lm_head_chunk_size=128)`` and
    ``chunked_cross_entropy``: output projection and cross-entropy per 128 tokens, in the
    logits' dtype, no fp32 upcast), ``chunked-ce`` (litgpt ``finetune/full.py``: whole logits,
    ``chunked_cross_entropy`` over 128-row chunks in the logits' dtype). litgpt's loops hold
    the logits through the backward: pair both with ``outputs = "kept"``."""
    logits_upcast: LogitsUpcast = LogitsUpcast.LOSS
    """With ``standard``: where the logits become fp32. ``loss``: inside the loss function (HF
    ``ForCausalLMLoss``, torchtitan's ``cross_entropy_loss``); ``model``: the model returns fp32
    logits (torchtune 0.6 ``TransformerDecoder.unembed``: ``self.output(h).float()``), so the
    16-bit logits die at once and, under ``compile``, the upcast runs outside the compiled
    loss (its fp32 output is written and saved); ``none``: the loss runs in the logits' own
    dtype and only autocast upcasts (Qwen-1's remote ``QWenLMHeadModel.forward`` calls
    ``CrossEntropyLoss()`` on the 16-bit ``lm_logits``; without autocast, as under DeepSpeed,
    ``log_softmax`` saves a 16-bit output)."""

    def __post_init__(self) -> None:
        check_part(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class Platform:
    """The device, its attention kernel and its allocator."""

    device: DeviceKind = DeviceKind.CUDA
    """``cuda``, or ``cpu`` to compare with CPU runs (no CUDA context, workspaces or NCCL)."""
    attention: Attention = Attention.SDPA
    """Attention kernel: ``eager`` (materialises scores), ``sdpa``, ``flash``."""
    expandable_segments: bool = False
    """``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``: the caching allocator maps memory
    in pages on demand, which removes most of its fragmentation (PyTorch default: off)."""
    compile: bool = False
    """``torch.compile`` (Inductor): elementwise chains run as fused kernels, and the partitioner
    recomputes cheap ops in the backward instead of saving them (``estimate/activations/
    compiled.py``); memory-bound traffic and kernel launches of the step time shrink too."""
    compile_scope: CompileScope = CompileScope.BLOCKS
    """With ``compile``: ``blocks`` compiles each transformer block and the loss on their own
    (torchtune ``compile: True``, torchtitan ``[compile]``); ``model`` the whole model as one
    graph (``model.compile()``, HF Trainer ``torch_compile``, Accelerate ``dynamo_backend``)."""

    def __post_init__(self) -> None:
        check_part(self)


PARTS: dict[str, type] = {
    "precision": Precision, "optimizer": Optimizer, "method": Method, "batch": Batch,
    "parallelism": Parallelism, "checkpointing": Checkpointing, "offload": Offload,
    "loss": Loss, "platform": Platform, "engine": Engine, "loop": Loop,
}
"""The parts of a ``Recipe``, by attribute name, in the order of the flat table."""
