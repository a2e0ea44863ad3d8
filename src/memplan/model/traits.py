"""``Traits``: what the activation graph needs to know about an architecture beyond its tensors
(norm kind and placement, rotary, softcaps, attention variant, dropout, positions, head), set
once when the model is described, so the estimator never works the architecture out again from
``model_type`` and raw config keys.

``traits_for`` knows the families in ``GRAPHS``; any other ``model_type`` gets no traits, and the
activation estimate then refuses it with what is missing (never a silent Llama graph).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

__all__ = ["Graph", "Norm", "NormPlacement", "QkNorm", "Mla", "Traits", "GRAPHS", "traits_for"]


class Graph(StrEnum):
    """Which layer graph the estimator draws (transformers 5.x code of each)."""

    DECODER = "decoder"
    """Llama lineage: RMSNorm, rotary, gated MLP or MoE (Llama, Mistral, Qwen 1-3, Gemma, Phi-3,
    OLMo 2, DeepSeek MLA)."""
    GPT2 = "gpt2"
    """Pre-LN, Conv1D, learned positions, gelu_new in Python ops, dropout everywhere."""
    GPT_NEOX = "gpt_neox"
    """Fused qkv, partial rotary, optional parallel residual."""
    BERT = "bert"
    """Post-LN encoder with an MLM head."""
    T5 = "t5"
    """Encoder-decoder with relative position bias (``estimate/activations/t5.py``)."""
    LN_DECODER = "ln_decoder"
    """LayerNorm decoders with (partial) rotary: Phi-1/1.5/2, StableLM, StarCoder2, Falcon
    (``estimate/activations/ln_decoder.py``)."""


class Norm(StrEnum):
    RMS = "rmsnorm"
    RMS_GEMMA = "rmsnorm-gemma"
    """Gemma's RMSNorm (``1 + weight``, computed in fp32)."""
    LAYER = "layernorm"


class NormPlacement(StrEnum):
    PRE = "pre"
    """Norm before attention and MLP (Llama)."""
    SANDWICH = "sandwich"
    """Pre and post norms around each sublayer (Gemma 2/3: 4 norms per layer)."""
    POST = "post"
    """Norm on each sublayer's output only (OLMo 2)."""
    POST_LN = "post-ln"
    """Norm after the residual add (BERT)."""


class QkNorm(StrEnum):
    NONE = "none"
    HEAD = "head"
    """RMSNorm over each head's dim (Qwen3, Gemma 3)."""
    FULL = "full"
    """RMSNorm over the whole projection (OLMo 2)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Mla:
    """DeepSeek multi-head latent attention dims (``DeepseekV3Config``)."""

    nope: int
    """``qk_nope_head_dim``."""
    rope: int
    """``qk_rope_head_dim``: the decoupled part that rotates."""
    v: int
    """``v_head_dim``."""
    kv_rank: int
    """``kv_lora_rank``."""
    q_rank: int
    """``q_lora_rank`` (0: q projected directly)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Traits:
    """Architecture facts the activation graph reads."""

    graph: Graph
    """The layer graph."""
    norm: Norm
    """Norm kind of layers and the final norm."""
    placement: NormPlacement = NormPlacement.PRE
    """Where the layer's norms sit."""
    qk_norm: QkNorm = QkNorm.NONE
    """Norm on queries and keys."""
    rotary_dims: int = 0
    """Dims per head that rotary rotates (0: no rotary; learned positions instead)."""
    embedding_scale: bool = False
    """Embeddings multiplied by sqrt(hidden) (Gemma)."""
    learned_positions: bool = False
    """Learned position embeddings added to the tokens (GPT-2, BERT)."""
    token_types: bool = False
    """Token-type embeddings and an embedding LayerNorm (BERT)."""
    parallel_residual: bool = False
    """Attention and MLP read the same input and add together (GPT-NeoX)."""
    attn_softcap: bool = False
    """Attention logits soft-capped in the layer (Gemma 2), which forces eager attention."""
    eager_mask: bool = False
    """The config sets ``attn_logit_softcapping``, so transformers materialises the mask."""
    final_softcap: bool = False
    """Final logits soft-capped (Gemma 2)."""
    attention_dropout: float = 0.0
    """Dropout on attention probabilities."""
    residual_dropout: float = 0.0
    """Dropout on sublayer outputs (GPT-2, GPT-NeoX, BERT)."""
    embedding_dropout: float = 0.0
    """Dropout after the embeddings (GPT-2, BERT)."""
    causal: bool = True
    """Causal LM loss with shifted labels; False for BERT's MLM (no shift, biased decoder)."""
    layer_types: tuple[str, ...] = ()
    """Attention type per layer (``full_attention`` / ``sliding_attention``); empty: all full."""
    mla: Mla | None = None
    """DeepSeek MLA dims, when the attention is latent."""
    shift_copy: bool = False
    """The loss shifts the logits with a ``.contiguous()`` copy before cross-entropy (Qwen-1's
    remote ``QWenLMHeadModel.forward``: ``lm_logits[..., :-1, :].contiguous()``); its
    ``log_softmax`` runs in fp32 under the Trainer's autocast, as ``ForCausalLMLoss``'s does."""


def _num(cfg: Mapping[str, Any], *keys: str) -> float:
    """The first of ``keys`` the config sets (0.0 if none)."""
    return float(next((cfg[k] for k in keys if cfg.get(k) is not None), 0.0) or 0.0)


def _rotary_fraction(cfg: Mapping[str, Any], default: float = 0.25) -> float:
    """The share of head_dim that gets rotary: ``rope_parameters.partial_rotary_factor``
    (transformers 5), else ``partial_rotary_factor``, else ``rotary_pct``, else the family's
    default (GPT-NeoX and StableLM 0.25, Phi 0.5, full rotary 1.0)."""
    rope = cfg.get("rope_parameters") or {}
    for v in (rope.get("partial_rotary_factor"), cfg.get("partial_rotary_factor"),
              cfg.get("rotary_pct")):
        if v is not None:
            return float(v)
    return default


_LN_ROTARY = {"phi": 0.5, "stablelm": 0.25, "starcoder2": 1.0, "falcon": 1.0}
"""Default rotary share per LayerNorm-decoder family (transformers 5 config classes)."""
_LN_DROPOUT = {"phi": ("resid_pdrop", "embd_pdrop"), "stablelm": ("hidden_dropout", ""),
               "starcoder2": ("residual_dropout", "embedding_dropout"),
               "falcon": ("hidden_dropout", "")}
"""(residual, embedding) dropout keys per LayerNorm-decoder family."""


def _ln_decoder(model_type: str, cfg: Mapping[str, Any], head_dim: int,
                tensor_names: set[str], common: dict[str, Any]) -> Traits:
    """Phi (parallel attention and MLP on one LayerNorm), StableLM (``use_parallel_residual``),
    StarCoder2 (sequential), Falcon (``parallel_attn`` / ``new_decoder_architecture``)."""
    res, emb = _LN_DROPOUT[model_type]
    if model_type == "phi":
        parallel = True
    elif model_type == "falcon":
        parallel = bool(cfg.get("parallel_attn", True) or cfg.get("new_decoder_architecture"))
    else:
        parallel = bool(cfg.get("use_parallel_residual"))
    qk = QkNorm.HEAD if any("q_layernorm" in n for n in tensor_names) else QkNorm.NONE
    return Traits(graph=Graph.LN_DECODER, norm=Norm.LAYER, qk_norm=qk,
                  rotary_dims=int(head_dim * _rotary_fraction(cfg, _LN_ROTARY[model_type])),
                  parallel_residual=parallel,
                  attention_dropout=_num(cfg, "attention_dropout"),
                  residual_dropout=_num(cfg, res), embedding_dropout=_num(cfg, emb) if emb else 0.0,
                  **common)


_DECODERS = ("llama", "mistral", "mixtral", "qwen", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma",
             "gemma2", "gemma3", "gemma3_text", "phi3", "olmo2", "deepseek_v2", "deepseek_v3")
GRAPHS: dict[str, Graph] = {**dict.fromkeys(_DECODERS, Graph.DECODER), "gpt2": Graph.GPT2,
                            "gpt_neox": Graph.GPT_NEOX, "bert": Graph.BERT,
                            "t5": Graph.T5, "mt5": Graph.T5, **dict.fromkeys(_LN_ROTARY, Graph.LN_DECODER)}
"""``model_type`` -> layer graph. A model type not here has no traits."""


def traits_for(model_type: str, cfg: Mapping[str, Any], head_dim: int,
               tensor_names: set[str]) -> Traits | None:
    """The traits of ``model_type`` from its config (transformers class defaults filled in),
    the first layer's head dim and its parameter names; None for a family memplan has no
    graph for."""
    graph = GRAPHS.get(model_type)
    if graph is None:
        return None
    common = dict(eager_mask=bool(cfg.get("attn_logit_softcapping")),
                  final_softcap=bool(cfg.get("final_logit_softcapping")),
                  layer_types=tuple(cfg.get("layer_types") or ()))
    if graph is Graph.T5:
        return Traits(graph=graph, norm=Norm.RMS, causal=True,
                      attention_dropout=_num(cfg, "dropout_rate"),
                      residual_dropout=_num(cfg, "dropout_rate"),
                      embedding_dropout=_num(cfg, "dropout_rate"))
    if graph is Graph.LN_DECODER:
        return _ln_decoder(model_type, cfg, head_dim, tensor_names, common)
    if graph is Graph.GPT2:
        return Traits(graph=graph, norm=Norm.LAYER, learned_positions=True,
                      attention_dropout=_num(cfg, "attn_pdrop"),
                      residual_dropout=_num(cfg, "resid_pdrop"),
                      embedding_dropout=_num(cfg, "embd_pdrop"), **common)
    if graph is Graph.BERT:
        p = _num(cfg, "hidden_dropout_prob")
        return Traits(graph=graph, norm=Norm.LAYER, placement=NormPlacement.POST_LN,
                      learned_positions=True, token_types=True, causal=False,
                      attention_dropout=_num(cfg, "attention_probs_dropout_prob"),
                      residual_dropout=p, embedding_dropout=p, **common)
    if graph is Graph.GPT_NEOX:
        return Traits(graph=graph, norm=Norm.LAYER,
                      rotary_dims=int(head_dim * _rotary_fraction(cfg)),
                      parallel_residual=bool(cfg.get("use_parallel_residual")),
                      attention_dropout=_num(cfg, "attention_dropout"),
                      residual_dropout=_num(cfg, "hidden_dropout"), **common)
    gemma = model_type.startswith("gemma")
    mla = None
    if cfg.get("qk_rope_head_dim"):
        mla = Mla(nope=int(cfg["qk_nope_head_dim"]), rope=int(cfg["qk_rope_head_dim"]),
                  v=int(cfg["v_head_dim"]), kv_rank=int(cfg["kv_lora_rank"]),
                  q_rank=int(cfg.get("q_lora_rank") or 0))
    if model_type == "olmo2":
        placement = NormPlacement.POST
    elif any("pre_feedforward_layernorm" in n for n in tensor_names):
        placement = NormPlacement.SANDWICH
    else:
        placement = NormPlacement.PRE
    qk = QkNorm.NONE
    if any("q_norm" in n for n in tensor_names):
        qk = QkNorm.FULL if model_type == "olmo2" else QkNorm.HEAD
    return Traits(graph=graph, norm=Norm.RMS_GEMMA if gemma else Norm.RMS, placement=placement,
                  qk_norm=qk, rotary_dims=mla.rope if mla else head_dim,
                  embedding_scale=gemma,
                  attn_softcap=bool(cfg.get("attn_logit_softcapping")) and model_type == "gemma2",
                  attention_dropout=_num(cfg, "attention_dropout", "attn_dropout_prob"),
                  mla=mla, shift_copy=model_type == "qwen", **common)
