"""Builders for decoder-only transformers in the Llama lineage (RMSNorm, rotary, gated MLP):
Llama, Mistral, Mixtral, Qwen (1), Qwen2/2.5, Qwen1.5-MoE/Qwen2-MoE, Qwen3 (dense and MoE), Gemma 2/3, Phi-3/Phi-4, OLMo 2,
and DeepSeek-V2/V3 (multi-head latent attention + shared/routed experts).

Each function maps a HF ``config.json`` onto ``ModelSpec`` tensors with the module names and
shapes of the transformers implementation (``modeling_<type>.py``), so that the structural count
equals ``sum(p.numel() for p in model.parameters())`` (checked in tests/test_param_counts.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from ._build import Config, embedding, linear, norm
from .spec import Attention, Component, Ffn, Layer, ModelSpec, Split, Tensor

A, M, X = Component.ATTENTION, Component.MLP, Component.EXPERTS


@dataclass(frozen=True, kw_only=True, slots=True)
class _Style:
    """How one family departs from Llama."""

    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: str = ""
    """``head`` (Qwen3, Gemma 3: per head_dim) or ``full`` (OLMo 2: over all heads)."""
    norms: tuple[str, ...] = ("input_layernorm", "post_attention_layernorm")
    fused: bool = False
    """Phi-3: ``qkv_proj`` and ``gate_up_proj``."""
    tie_default: bool = False


_STYLES: dict[str, _Style] = {
    "llama": _Style(),
    "mistral": _Style(),
    "mixtral": _Style(),
    "qwen2": _Style(qkv_bias=True),
    "qwen3": _Style(qk_norm="head"),
    "qwen3_moe": _Style(qk_norm="head"),
    "qwen2_moe": _Style(qkv_bias=True),
    "gemma": _Style(tie_default=True),
    "gemma2": _Style(
        tie_default=True,
        norms=("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
               "post_feedforward_layernorm"),
    ),
    "gemma3_text": _Style(
        tie_default=True,
        qk_norm="head",
        norms=("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
               "post_feedforward_layernorm"),
    ),
    "olmo2": _Style(qk_norm="full", norms=("post_attention_layernorm", "post_feedforward_layernorm")),
    "phi3": _Style(fused=True),
}


def _head_dim(c: Config) -> int:
    return c.int("head_dim", default=c.int("hidden_size") // c.int("num_attention_heads"))


def _attention(c: Config, style: _Style) -> tuple[list[Tensor], Attention]:
    h, a = c.int("hidden_size"), c.int("num_attention_heads")
    kv = c.int("num_key_value_heads", default=a)
    d = _head_dim(c)
    bias = bool(c.get("attention_bias", style.qkv_bias))
    o_bias = bool(c.get("attention_bias", style.o_bias)) and c.data.get("model_type") != "qwen2"
    t: list[Tensor] = []
    if style.fused:
        t += linear("self_attn.qkv_proj", (a + 2 * kv) * d, h, component=A, split=Split.COLUMN,
                    bias=bias, targets=("q", "k", "v"))
    else:
        t += linear("self_attn.q_proj", a * d, h, component=A, split=Split.COLUMN, bias=bias,
                    targets=("q",))
        t += linear("self_attn.k_proj", kv * d, h, component=A, split=Split.COLUMN, bias=bias,
                    targets=("k",))
        t += linear("self_attn.v_proj", kv * d, h, component=A, split=Split.COLUMN, bias=bias,
                    targets=("v",))
    t += linear("self_attn.o_proj", h, a * d, component=A, split=Split.ROW, bias=o_bias,
                targets=("o",))
    if style.qk_norm == "head":
        t += norm("self_attn.q_norm", d) + norm("self_attn.k_norm", d)
    elif style.qk_norm == "full":
        t += norm("self_attn.q_norm", a * d) + norm("self_attn.k_norm", kv * d)
    kind = "mha" if kv == a else ("mqa" if kv == 1 else "gqa")
    window = c.get("sliding_window") if c.get("use_sliding_window", True) else None
    return t, Attention(kind=kind, num_heads=a, num_kv_heads=kv, head_dim=d, v_head_dim=d,
                        sliding_window=window)


def _mlp(prefix: str, h: int, f: int, *, fused: bool = False, bias: bool = False,
         component: Component = M, experts: int = 1) -> list[Tensor]:
    if fused:
        return linear(f"{prefix}.gate_up_proj", 2 * f, h, component=component, split=Split.COLUMN,
                      bias=bias, targets=("gate", "up"), experts=experts) + linear(
            f"{prefix}.down_proj", h, f, component=component, split=Split.ROW, bias=bias,
            targets=("down",), experts=experts)
    return (
        linear(f"{prefix}.gate_proj", f, h, component=component, split=Split.COLUMN, bias=bias,
               targets=("gate",), experts=experts)
        + linear(f"{prefix}.up_proj", f, h, component=component, split=Split.COLUMN, bias=bias,
                 targets=("up",), experts=experts)
        + linear(f"{prefix}.down_proj", h, f, component=component, split=Split.ROW, bias=bias,
                 targets=("down",), experts=experts)
    )


def _router(h: int, experts: int) -> list[Tensor]:
    return [Tensor(name="mlp.gate.weight", shape=(experts, h), component=Component.ROUTER)]


def _is_moe_layer(c: Config, i: int) -> bool:
    mt = c.get("model_type")
    if mt == "mixtral":
        return True
    if mt in ("qwen3_moe", "qwen2_moe"):
        step = c.int("decoder_sparse_step", default=1)
        experts = c.int("num_local_experts", "num_experts")
        return i not in (c.get("mlp_only_layers") or []) and experts > 0 and (
            (i + 1) % step == 0
        )
    return False


def llama_like(c: Config, model_id: str) -> ModelSpec:
    """Llama-lineage decoder; the family's differences come from ``_STYLES``."""
    mt = c.req("model_type")
    style = _STYLES[mt]
    h, V, n = c.int("hidden_size"), c.int("vocab_size"), c.int("num_hidden_layers")
    act = c.get("hidden_act", c.get("hidden_activation", "silu"))
    attn_t, attn = _attention(c, style)
    mlp_bias = bool(c.get("mlp_bias", False))
    layers = []
    for i in range(n):
        t = list(attn_t)
        if _is_moe_layer(c, i):
            E = c.int("num_local_experts", "num_experts")
            # Mixtral's experts use intermediate_size; Qwen3-MoE has a separate key.
            f = c.int("intermediate_size") if mt == "mixtral" else c.int("moe_intermediate_size")
            t += _router(h, E) + _mlp("mlp.experts", h, f, component=X, experts=E)
            fs = c.int("shared_expert_intermediate_size", default=0)
            if fs:  # Qwen2-MoE: one shared expert behind a sigmoid gate (shared_expert_gate)
                t += _mlp("mlp.shared_expert", h, fs) + [
                    Tensor(name="mlp.shared_expert_gate.weight", shape=(1, h),
                           component=Component.ROUTER)]
            ffn = Ffn(gated=True, activation=act, intermediate_size=f, num_experts=E,
                      top_k=c.int("num_experts_per_tok"), shared_experts=1 if fs else 0,
                      shared_intermediate_size=fs, shared_gate=bool(fs))
        else:
            f = c.int("intermediate_size")
            t += _mlp("mlp", h, f, fused=style.fused, bias=mlp_bias)
            ffn = Ffn(gated=True, activation=act, intermediate_size=f)
        for name in style.norms:
            t += norm(name, h)
        layers.append(Layer(kind="decoder", tensors=tuple(t), attention=attn, ffn=ffn))
    return _decoder_spec(c, model_id, h, V, layers, tie_default=style.tie_default)


def _decoder_spec(c: Config, model_id: str, h: int, V: int, layers: list[Layer], *,
                  tie_default: bool) -> ModelSpec:
    tied = bool(c.get("tie_word_embeddings", tie_default))
    head = norm("norm", h)
    if not tied:
        head += [Tensor(name="lm_head.weight", shape=(V, h), component=Component.HEAD,
                        split=Split.VOCAB)]
    return ModelSpec(
        id=model_id,
        model_type=c.req("model_type"),
        hidden_size=h,
        vocab_size=V,
        embedding=tuple(embedding("embed_tokens", V, h)),
        layers=tuple(layers),
        head=tuple(head),
        tied_embeddings=tied,
        head_tied_numel=V * h if tied else 0,
        max_position_embeddings=c.get("max_position_embeddings"),
    )


def deepseek(c: Config, model_id: str) -> ModelSpec:
    """DeepSeek-V2/V3: MLA attention (low-rank q and compressed kv) and DeepSeekMoE FFNs.

    Source: DeepSeek-V2 paper (arXiv 2405.04434) §2.1 (MLA), §2.2 (DeepSeekMoE);
    transformers ``modeling_deepseek_v2.py`` / ``modeling_deepseek_v3.py`` for module shapes.
    """
    h, V, n = c.int("hidden_size"), c.int("vocab_size"), c.int("num_hidden_layers")
    a = c.int("num_attention_heads")
    nope, rope = c.int("qk_nope_head_dim"), c.int("qk_rope_head_dim")
    vd, kvr = c.int("v_head_dim"), c.int("kv_lora_rank")
    qr = c.get("q_lora_rank")
    bias = bool(c.get("attention_bias", False))
    t: list[Tensor] = []
    if qr is None:
        t += linear("self_attn.q_proj", a * (nope + rope), h, component=A, split=Split.COLUMN,
                    targets=("q",))
    else:
        t += linear("self_attn.q_a_proj", qr, h, component=A, split=Split.REPLICATED, bias=bias,
                    targets=("q",))
        t += norm("self_attn.q_a_layernorm", qr)
        t += linear("self_attn.q_b_proj", a * (nope + rope), qr, component=A, split=Split.COLUMN,
                    targets=("q",))
    t += linear("self_attn.kv_a_proj_with_mqa", kvr + rope, h, component=A,
                split=Split.REPLICATED, bias=bias, targets=("k", "v"))
    t += norm("self_attn.kv_a_layernorm", kvr)
    t += linear("self_attn.kv_b_proj", a * (nope + vd), kvr, component=A, split=Split.COLUMN,
                targets=("k", "v"))
    t += linear("self_attn.o_proj", h, a * vd, component=A, split=Split.ROW, bias=bias,
                targets=("o",))
    attn = Attention(kind="mla", num_heads=a, num_kv_heads=a, head_dim=nope + rope, v_head_dim=vd)
    act = c.get("hidden_act", "silu")
    E = c.int("n_routed_experts", default=0)
    first_dense = c.int("first_k_dense_replace", default=0)
    freq = c.int("moe_layer_freq", default=1)
    fe = c.int("moe_intermediate_size", default=0)
    shared = c.int("n_shared_experts", default=0)
    layers = []
    for i in range(n):
        lt = list(t)
        if E and i >= first_dense and i % freq == 0:
            lt += _router(h, E) + _mlp("mlp.experts", h, fe, component=X, experts=E)
            if shared:
                lt += _mlp("mlp.shared_experts", h, fe * shared)
            ffn = Ffn(gated=True, activation=act, intermediate_size=fe, num_experts=E,
                      top_k=c.int("num_experts_per_tok"), shared_experts=shared,
                      shared_intermediate_size=fe * shared)
        else:
            lt += _mlp("mlp", h, c.int("intermediate_size"))
            ffn = Ffn(gated=True, activation=act, intermediate_size=c.int("intermediate_size"))
        lt += norm("input_layernorm", h) + norm("post_attention_layernorm", h)
        layers.append(Layer(kind="decoder", tensors=tuple(lt), attention=attn, ffn=ffn))
    spec = _decoder_spec(c, model_id, h, V, layers, tie_default=False)
    mtp = c.int("num_nextn_predict_layers", default=0)
    if mtp:
        note = (f"config has {mtp} multi-token-prediction layer(s); transformers does not build "
                "them, so they are not counted (DeepSeek-V3's 671B excludes them, 685B includes).")
        spec = _with_notes(spec, note)
    return spec


def qwen1(c: Config, model_id: str) -> ModelSpec:
    """Qwen (1): Qwen-1.8B/7B/14B/72B, whose ``QWenLMHeadModel`` ships as remote code
    (``modeling_qwen.py`` in each Hub repo; memplan never runs it). ``QWenBlock``: RMSNorm
    ``ln_1``; ``attn.c_attn`` (one qkv Linear, bias) to ``3 x kv_channels x heads``, rotary over
    every head dim (``rotary_pct`` 1.0), ``attn.c_proj`` (bias only without ``no_bias``); RMSNorm
    ``ln_2``; ``QWenMLP`` with ``w1``, ``w2`` (h -> ``intermediate_size // 2``) and ``c_proj``
    back, computing ``c_proj(w1(x) * silu(w2(x)))``: the Llama MLP with w2 as the gate; untied
    ``lm_head``, final RMSNorm ``ln_f``. Multi-head attention (no ``num_key_value_heads``)."""
    h, V, n = c.int("hidden_size"), c.int("vocab_size"), c.int("num_hidden_layers")
    a = c.int("num_attention_heads")
    d = c.int("kv_channels", default=h // a)
    f = c.int("intermediate_size") // 2
    bias = not c.get("no_bias", True)
    t = (norm("ln_1", h)
         + linear("attn.c_attn", 3 * a * d, h, component=A, split=Split.COLUMN, bias=True,
                  targets=("q", "k", "v"))
         + linear("attn.c_proj", h, a * d, component=A, split=Split.ROW, bias=bias,
                  targets=("o",))
         + norm("ln_2", h)
         + linear("mlp.w2", f, h, component=M, split=Split.COLUMN, bias=bias, targets=("gate",))
         + linear("mlp.w1", f, h, component=M, split=Split.COLUMN, bias=bias, targets=("up",))
         + linear("mlp.c_proj", h, f, component=M, split=Split.ROW, bias=bias,
                  targets=("down",)))
    attn = Attention(kind="mha", num_heads=a, num_kv_heads=a, head_dim=d, v_head_dim=d)
    ffn = Ffn(gated=True, activation="silu", intermediate_size=f)
    layer = Layer(kind="decoder", tensors=tuple(t), attention=attn, ffn=ffn)
    head = norm("ln_f", h) + [Tensor(name="lm_head.weight", shape=(V, h),
                                     component=Component.HEAD, split=Split.VOCAB)]
    return ModelSpec(id=model_id, model_type="qwen", hidden_size=h, vocab_size=V,
                     embedding=tuple(embedding("wte", V, h)), layers=(layer,) * n,
                     head=tuple(head), tied_embeddings=False, head_tied_numel=0,
                     max_position_embeddings=c.get("seq_length",
                                                   c.get("max_position_embeddings")))


def _with_notes(spec: ModelSpec, *notes: str) -> ModelSpec:
    from dataclasses import replace

    return replace(spec, notes=spec.notes + notes)
