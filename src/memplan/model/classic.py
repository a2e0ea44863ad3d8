"""Builders for the pre-Llama families: GPT-2 (and GPT-3 from its paper), GPT-NeoX, Falcon,
BERT (masked LM) and T5 / FLAN-T5 (encoder-decoder), plus the SigLIP vision tower of Gemma 3.

Module names and shapes follow transformers' ``modeling_<type>.py``; the counts are checked
against models built on the meta device (tests/test_param_counts.py).
"""

from __future__ import annotations

from ._build import Config, embedding, linear, norm
from .spec import Attention, Component, Ffn, Layer, ModelSpec, Split, Tensor

A, M = Component.ATTENTION, Component.MLP


def _lm_spec(c: Config, model_id: str, h: int, V: int, emb: list[Tensor], layers: list[Layer],
             head: list[Tensor], tied: bool) -> ModelSpec:
    if not tied:
        head = head + [Tensor(name="lm_head.weight", shape=(V, h), component=Component.HEAD,
                              split=Split.VOCAB)]
    return ModelSpec(
        id=model_id, model_type=c.req("model_type"), hidden_size=h, vocab_size=V,
        embedding=tuple(emb), layers=tuple(layers), head=tuple(head), tied_embeddings=tied,
        head_tied_numel=V * h if tied else 0,
        max_position_embeddings=c.get("n_positions", c.get("max_position_embeddings")),
    )


def gpt2(c: Config, model_id: str) -> ModelSpec:
    """GPT-2 (Radford et al. 2019) and GPT-3 175B (Brown et al. 2020, Table 2.1), which shares it.

    Fused ``c_attn`` (q, k, v) and ``Conv1D`` weights stored (in, out); LayerNorm with bias.
    """
    h, V, n = c.int("n_embd"), c.int("vocab_size"), c.int("n_layer")
    a = c.int("n_head")
    inner = c.int("n_inner", default=4 * h)
    t = (norm("ln_1", h, bias=True)
         + linear("attn.c_attn", 3 * h, h, component=A, split=Split.COLUMN, bias=True,
                  targets=("q", "k", "v"))
         + linear("attn.c_proj", h, h, component=A, split=Split.ROW, bias=True, targets=("o",))
         + norm("ln_2", h, bias=True)
         + linear("mlp.c_fc", inner, h, component=M, split=Split.COLUMN, bias=True, targets=("up",))
         + linear("mlp.c_proj", h, inner, component=M, split=Split.ROW, bias=True,
                  targets=("down",)))
    attn = Attention(kind="mha", num_heads=a, num_kv_heads=a, head_dim=h // a, v_head_dim=h // a)
    ffn = Ffn(gated=False, activation=c.get("activation_function", "gelu_new"),
              intermediate_size=inner)
    layer = Layer(kind="decoder", tensors=tuple(t), attention=attn, ffn=ffn, norm="layernorm")
    emb = embedding("wte", V, h) + embedding("wpe", c.int("n_positions"), h, split=Split.REPLICATED)
    return _lm_spec(c, model_id, h, V, emb, [layer] * n, norm("ln_f", h, bias=True),
                    tied=bool(c.get("tie_word_embeddings", True)))


def gpt_neox(c: Config, model_id: str) -> ModelSpec:
    """GPT-NeoX (Black et al. 2022): fused qkv with bias, LayerNorm, untied ``embed_out``."""
    h, V, n = c.int("hidden_size"), c.int("vocab_size"), c.int("num_hidden_layers")
    a, f = c.int("num_attention_heads"), c.int("intermediate_size")
    b = bool(c.get("attention_bias", True))
    t = (norm("input_layernorm", h, bias=True) + norm("post_attention_layernorm", h, bias=True)
         + linear("attention.query_key_value", 3 * h, h, component=A, split=Split.COLUMN, bias=b,
                  targets=("q", "k", "v"))
         + linear("attention.dense", h, h, component=A, split=Split.ROW, bias=b, targets=("o",))
         + linear("mlp.dense_h_to_4h", f, h, component=M, split=Split.COLUMN, bias=True,
                  targets=("up",))
         + linear("mlp.dense_4h_to_h", h, f, component=M, split=Split.ROW, bias=True,
                  targets=("down",)))
    attn = Attention(kind="mha", num_heads=a, num_kv_heads=a, head_dim=h // a, v_head_dim=h // a)
    layer = Layer(kind="decoder", tensors=tuple(t), attention=attn, norm="layernorm",
                  ffn=Ffn(gated=False, activation=c.get("hidden_act", "gelu"), intermediate_size=f))
    return _lm_spec(c, model_id, h, V, embedding("embed_in", V, h), [layer] * n,
                    norm("final_layer_norm", h, bias=True),
                    tied=bool(c.get("tie_word_embeddings", False)))


def falcon(c: Config, model_id: str) -> ModelSpec:
    """Falcon (Almazrouei et al. 2023): multi-query (7B) or grouped (40B, new decoder arch)."""
    h, V, n = c.int("hidden_size"), c.int("vocab_size"), c.int("num_hidden_layers")
    a = c.int("num_attention_heads")
    d = h // a
    new_arch = bool(c.get("new_decoder_architecture", False))
    if new_arch:
        kv = c.int("num_kv_heads", default=a)
    elif c.get("multi_query", True):
        kv = 1
    else:
        kv = a
    b = bool(c.get("bias", False))
    f = c.int("ffn_hidden_size", default=4 * h)
    t: list[Tensor] = []
    if new_arch and c.int("num_ln_in_parallel_attn", default=2) == 2:
        t += norm("ln_attn", h, bias=True) + norm("ln_mlp", h, bias=True)
    else:
        t += norm("input_layernorm", h, bias=True)
        if not new_arch and not c.get("parallel_attn", True):
            t += norm("post_attention_layernorm", h, bias=True)
    t += linear("self_attention.query_key_value", (a + 2 * kv) * d, h, component=A,
                split=Split.COLUMN, bias=b, targets=("q", "k", "v"))
    t += linear("self_attention.dense", h, h, component=A, split=Split.ROW, bias=b, targets=("o",))
    t += linear("mlp.dense_h_to_4h", f, h, component=M, split=Split.COLUMN, bias=b, targets=("up",))
    t += linear("mlp.dense_4h_to_h", h, f, component=M, split=Split.ROW, bias=b, targets=("down",))
    kind = "mha" if kv == a else ("mqa" if kv == 1 else "gqa")
    layer = Layer(kind="decoder", tensors=tuple(t), norm="layernorm",
                  attention=Attention(kind=kind, num_heads=a, num_kv_heads=kv, head_dim=d,
                                      v_head_dim=d),
                  ffn=Ffn(gated=False, activation="gelu", intermediate_size=f))
    return _lm_spec(c, model_id, h, V, embedding("word_embeddings", V, h), [layer] * n,
                    norm("ln_f", h, bias=True), tied=bool(c.get("tie_word_embeddings", True)))


def bert(c: Config, model_id: str) -> ModelSpec:
    """BERT (Devlin et al. 2019) as ``BertForMaskedLM``: no pooler; MLM head transform + bias."""
    h, V, n = c.int("hidden_size"), c.int("vocab_size"), c.int("num_hidden_layers")
    a, f = c.int("num_attention_heads"), c.int("intermediate_size")
    t = (linear("attention.self.query", h, h, component=A, split=Split.COLUMN, bias=True,
                targets=("q",))
         + linear("attention.self.key", h, h, component=A, split=Split.COLUMN, bias=True,
                  targets=("k",))
         + linear("attention.self.value", h, h, component=A, split=Split.COLUMN, bias=True,
                  targets=("v",))
         + linear("attention.output.dense", h, h, component=A, split=Split.ROW, bias=True,
                  targets=("o",))
         + norm("attention.output.LayerNorm", h, bias=True)
         + linear("intermediate.dense", f, h, component=M, split=Split.COLUMN, bias=True,
                  targets=("up",))
         + linear("output.dense", h, f, component=M, split=Split.ROW, bias=True, targets=("down",))
         + norm("output.LayerNorm", h, bias=True))
    layer = Layer(kind="encoder", tensors=tuple(t), norm="layernorm",
                  attention=Attention(kind="mha", num_heads=a, num_kv_heads=a, head_dim=h // a,
                                      v_head_dim=h // a),
                  ffn=Ffn(gated=False, activation=c.get("hidden_act", "gelu"), intermediate_size=f))
    emb = (embedding("embeddings.word_embeddings", V, h)
           + embedding("embeddings.position_embeddings", c.int("max_position_embeddings"), h,
                       split=Split.REPLICATED)
           + embedding("embeddings.token_type_embeddings", c.int("type_vocab_size", default=2), h,
                       split=Split.REPLICATED)
           + norm("embeddings.LayerNorm", h, bias=True))
    head = (linear("cls.predictions.transform.dense", h, h, component=Component.HEAD,
                   split=Split.REPLICATED, bias=True)
            + norm("cls.predictions.transform.LayerNorm", h, bias=True)
            + [Tensor(name="cls.predictions.bias", shape=(V,), component=Component.HEAD,
                      split=Split.VOCAB, is_bias=True)])
    return _lm_spec(c, model_id, h, V, emb, [layer] * n, head,
                    tied=bool(c.get("tie_word_embeddings", True)))


def t5(c: Config, model_id: str) -> ModelSpec:
    """T5 (Raffel et al. 2020) / FLAN-T5 (T5 v1.1: gated-GELU FFN, untied head) as
    ``T5ForConditionalGeneration``. Relative position bias lives in the first block of each stack."""
    dm, V = c.int("d_model"), c.int("vocab_size")
    a, dkv, f = c.int("num_heads"), c.int("d_kv"), c.int("d_ff")
    inner = a * dkv
    ne = c.int("num_layers")
    nd = c.int("num_decoder_layers", default=ne)
    buckets = c.int("relative_attention_num_buckets", default=32)
    proj = str(c.get("feed_forward_proj", "relu"))
    gated = proj.startswith("gated-")
    act = proj.removeprefix("gated-")

    def attn(prefix: str) -> list[Tensor]:
        out: list[Tensor] = []
        for part, split in (("q", Split.COLUMN), ("k", Split.COLUMN), ("v", Split.COLUMN)):
            out += linear(f"{prefix}.{part}", inner, dm, component=A, split=split, targets=(part,))
        return out + linear(f"{prefix}.o", dm, inner, component=A, split=Split.ROW, targets=("o",))

    ff = (linear("DenseReluDense.wi_0", f, dm, component=M, split=Split.COLUMN, targets=("gate",))
          + linear("DenseReluDense.wi_1", f, dm, component=M, split=Split.COLUMN, targets=("up",))
          if gated else
          linear("DenseReluDense.wi", f, dm, component=M, split=Split.COLUMN, targets=("up",)))
    ff += linear("DenseReluDense.wo", dm, f, component=M, split=Split.ROW, targets=("down",))
    rel = [Tensor(name="SelfAttention.relative_attention_bias.weight", shape=(buckets, a),
                  component=Component.OTHER)]
    geometry = Attention(kind="mha", num_heads=a, num_kv_heads=a, head_dim=dkv, v_head_dim=dkv)
    ffn = Ffn(gated=gated, activation=act, intermediate_size=f)
    layers: list[Layer] = []
    for i in range(ne):
        t = attn("SelfAttention") + norm("layer_norm.0", dm) + ff + norm("layer_norm.1", dm)
        t += rel if i == 0 else []
        t += norm("encoder.final_layer_norm", dm) if i == ne - 1 else []
        layers.append(Layer(kind="encoder", tensors=tuple(t), attention=geometry, ffn=ffn))
    for i in range(nd):
        t = (attn("SelfAttention") + attn("EncDecAttention") + ff
             + norm("layer_norm.0", dm) + norm("layer_norm.1", dm) + norm("layer_norm.2", dm))
        t += rel if i == 0 else []
        layers.append(Layer(kind="decoder-cross", tensors=tuple(t), attention=geometry, ffn=ffn))
    return _lm_spec(c, model_id, dm, V, embedding("shared", V, dm), layers,
                    norm("decoder.final_layer_norm", dm),
                    tied=bool(c.get("tie_word_embeddings", True)))


def siglip_vision(c: Config) -> list[Tensor]:
    """SigLIP vision encoder without pooling head (Gemma 3's tower; Zhai et al. 2023)."""
    h, f, n = c.int("hidden_size"), c.int("intermediate_size"), c.int("num_hidden_layers")
    p, img = c.int("patch_size"), c.int("image_size")
    ch = c.int("num_channels", default=3)
    V = Component.VISION
    out = [Tensor(name="vision.patch_embedding.weight", shape=(h, ch, p, p), component=V),
           Tensor(name="vision.patch_embedding.bias", shape=(h,), component=V, is_bias=True),
           Tensor(name="vision.position_embedding.weight", shape=((img // p) ** 2, h), component=V)]
    for i in range(n):
        pre = f"vision.layers.{i}"
        for part in ("q_proj", "k_proj", "v_proj", "out_proj"):
            out += [Tensor(name=f"{pre}.{part}.weight", shape=(h, h), component=V),
                    Tensor(name=f"{pre}.{part}.bias", shape=(h,), component=V, is_bias=True)]
        out += [Tensor(name=f"{pre}.fc1.weight", shape=(f, h), component=V),
                Tensor(name=f"{pre}.fc1.bias", shape=(f,), component=V, is_bias=True),
                Tensor(name=f"{pre}.fc2.weight", shape=(h, f), component=V),
                Tensor(name=f"{pre}.fc2.bias", shape=(h,), component=V, is_bias=True)]
        for ln in ("layer_norm1", "layer_norm2"):
            out += [Tensor(name=f"{pre}.{ln}.weight", shape=(h,), component=V),
                    Tensor(name=f"{pre}.{ln}.bias", shape=(h,), component=V, is_bias=True)]
    out += [Tensor(name="vision.post_layernorm.weight", shape=(h,), component=V),
            Tensor(name="vision.post_layernorm.bias", shape=(h,), component=V, is_bias=True)]
    return out
