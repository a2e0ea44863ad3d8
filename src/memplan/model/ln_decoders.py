"""Builders for LayerNorm decoders with rotary positions: Phi-1/1.5/2 (``phi``: one LayerNorm
feeding attention and MLP in parallel, partial rotary, biased ``dense``/``fc1``/``fc2``, biased
lm_head), StableLM (``stablelm``: partial rotary, gated SiLU MLP, optional parallel residual and
per-head qk LayerNorm) and StarCoder2 (``starcoder2``: biased q/k/v/o, ``c_fc``/``c_proj`` MLP,
GQA, sliding window). Falcon lives in ``classic.py``.

Module names and shapes follow transformers 5.x ``modeling_phi.py``, ``modeling_stablelm.py``
and ``modeling_starcoder2.py``; the counts are checked against the models built on the meta
device (tests/test_param_counts.py).
"""

from __future__ import annotations

from ._build import Config, embedding, linear, norm
from .spec import Attention, Component, Ffn, Layer, ModelSpec, Split, Tensor

A, M = Component.ATTENTION, Component.MLP

__all__ = ["phi", "stablelm", "starcoder2"]


def _qkv(c: Config, *, bias: bool, o_name: str, o_bias: bool) -> tuple[list[Tensor], Attention]:
    h, a = c.int("hidden_size"), c.int("num_attention_heads")
    kv = c.int("num_key_value_heads", default=a)
    d = c.int("head_dim", default=h // a)
    t = (linear("self_attn.q_proj", a * d, h, component=A, split=Split.COLUMN, bias=bias,
                targets=("q",))
         + linear("self_attn.k_proj", kv * d, h, component=A, split=Split.COLUMN, bias=bias,
                  targets=("k",))
         + linear("self_attn.v_proj", kv * d, h, component=A, split=Split.COLUMN, bias=bias,
                  targets=("v",))
         + linear(f"self_attn.{o_name}", h, a * d, component=A, split=Split.ROW, bias=o_bias,
                  targets=("o",)))
    kind = "mha" if kv == a else ("mqa" if kv == 1 else "gqa")
    return t, Attention(kind=kind, num_heads=a, num_kv_heads=kv, head_dim=d, v_head_dim=d,
                        sliding_window=c.get("sliding_window"))


def _spec(c: Config, model_id: str, layers: list[Layer], head: list[Tensor], *,
          tie_default: bool, head_bias: bool = False) -> ModelSpec:
    h, V = c.int("hidden_size"), c.int("vocab_size")
    tied = bool(c.get("tie_word_embeddings", tie_default))
    if not tied:
        head = head + [Tensor(name="lm_head.weight", shape=(V, h), component=Component.HEAD,
                              split=Split.VOCAB)]
    if head_bias:
        head = head + [Tensor(name="lm_head.bias", shape=(V,), component=Component.HEAD,
                              split=Split.VOCAB, is_bias=True)]
    return ModelSpec(id=model_id, model_type=c.req("model_type"), hidden_size=h, vocab_size=V,
                     embedding=tuple(embedding("embed_tokens", V, h)), layers=tuple(layers),
                     head=tuple(head), tied_embeddings=tied, head_tied_numel=V * h if tied else 0,
                     max_position_embeddings=c.get("max_position_embeddings"))


def phi(c: Config, model_id: str) -> ModelSpec:
    """Phi-1, Phi-1.5, Phi-2 (``PhiForCausalLM``; Gunasekar et al. 2023, Li et al. 2023): one
    ``input_layernorm`` per block feeding attention and MLP in parallel; ``lm_head`` has a
    bias."""
    h, n, f = c.int("hidden_size"), c.int("num_hidden_layers"), c.int("intermediate_size")
    t, attn = _qkv(c, bias=True, o_name="dense", o_bias=True)
    if c.get("qk_layernorm", False):
        d = attn.head_dim
        t += norm("self_attn.q_layernorm", d, bias=True) + norm("self_attn.k_layernorm", d, bias=True)
    t += (linear("mlp.fc1", f, h, component=M, split=Split.COLUMN, bias=True, targets=("up",))
          + linear("mlp.fc2", h, f, component=M, split=Split.ROW, bias=True, targets=("down",))
          + norm("input_layernorm", h, bias=True))
    ffn = Ffn(gated=False, activation=c.get("hidden_act", "gelu_new"), intermediate_size=f)
    layer = Layer(kind="decoder", tensors=tuple(t), attention=attn, ffn=ffn, norm="layernorm")
    return _spec(c, model_id, [layer] * n, norm("final_layernorm", h, bias=True),
                 tie_default=False, head_bias=True)


def stablelm(c: Config, model_id: str) -> ModelSpec:
    """StableLM 3B-4E1T / StableLM 2 (``StableLmForCausalLM``): LayerNorm with bias, partial
    rotary, gated MLP; ``use_parallel_residual`` drops the post-attention norm; ``qk_layernorm``
    adds one LayerNorm (no bias) per head for q and per kv head for k."""
    h, n, f = c.int("hidden_size"), c.int("num_hidden_layers"), c.int("intermediate_size")
    t, attn = _qkv(c, bias=bool(c.get("use_qkv_bias", False)), o_name="o_proj", o_bias=False)
    if c.get("qk_layernorm", False):
        d = attn.head_dim
        t += [Tensor(name="self_attn.q_layernorm.norms.weight", shape=(attn.num_heads, d),
                     component=Component.NORM),
              Tensor(name="self_attn.k_layernorm.norms.weight", shape=(attn.num_kv_heads, d),
                     component=Component.NORM)]
    t += (linear("mlp.gate_proj", f, h, component=M, split=Split.COLUMN, targets=("gate",))
          + linear("mlp.up_proj", f, h, component=M, split=Split.COLUMN, targets=("up",))
          + linear("mlp.down_proj", h, f, component=M, split=Split.ROW, targets=("down",))
          + norm("input_layernorm", h, bias=True))
    if not c.get("use_parallel_residual", False):
        t += norm("post_attention_layernorm", h, bias=True)
    ffn = Ffn(gated=True, activation=c.get("hidden_act", "silu"), intermediate_size=f)
    layer = Layer(kind="decoder", tensors=tuple(t), attention=attn, ffn=ffn, norm="layernorm")
    return _spec(c, model_id, [layer] * n, norm("norm", h, bias=True), tie_default=False)


def starcoder2(c: Config, model_id: str) -> ModelSpec:
    """StarCoder2 (Lozhkov et al. 2024, ``Starcoder2ForCausalLM``): LayerNorm with bias, full
    rotary, biased q/k/v/o and ``c_fc``/``c_proj`` (``use_bias``), tied lm_head by default."""
    h, n, f = c.int("hidden_size"), c.int("num_hidden_layers"), c.int("intermediate_size")
    b = bool(c.get("use_bias", True))
    t, attn = _qkv(c, bias=b, o_name="o_proj", o_bias=b)
    t += (linear("mlp.c_fc", f, h, component=M, split=Split.COLUMN, bias=b, targets=("up",))
          + linear("mlp.c_proj", h, f, component=M, split=Split.ROW, bias=b, targets=("down",))
          + norm("input_layernorm", h, bias=True) + norm("post_attention_layernorm", h, bias=True))
    ffn = Ffn(gated=False, activation=c.get("hidden_act", "gelu_pytorch_tanh"), intermediate_size=f)
    layer = Layer(kind="decoder", tensors=tuple(t), attention=attn, ffn=ffn, norm="layernorm")
    return _spec(c, model_id, [layer] * n, norm("norm", h, bias=True), tie_default=True)
