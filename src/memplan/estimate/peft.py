"""PEFT methods: which tensors train and which ones each method adds, as PEFT 0.21.2 builds them.

Every method here freezes the base model; the gradient still flows back through the whole
network to the first trainable tensor (unlike ``method = freeze``, whose backward stops at the
first trained layer). Counts follow PEFT's own modules (``peft/tuners/*/layer.py``):

==============  ==================================================================  =========
method          trainable tensors (per adapted linear ``out x in`` unless stated)   source
==============  ==================================================================  =========
lora, qlora     ``lora_A`` r x in, ``lora_B`` out x r                               lora/layer.py
dora            LoRA + ``lora_magnitude_vector`` (out)                              lora/dora.py
lora-fa         ``lora_B`` only; ``lora_A`` frozen (``create_lorafa_optimizer``)    optimizers/lorafa.py
vera            ``vera_lambda_d`` (r), ``vera_lambda_b`` (out); shared frozen       vera/layer.py,
                ``vera_A`` (r x max in), ``vera_B`` (max out x r)                   vera/model.py
ia3             ``ia3_l``: out (k/v-like targets) or in (feed-forward targets)      ia3/layer.py
prompt-tuning   ``PromptEmbedding``: virtual_tokens x hidden                        prompt_tuning/model.py
prefix-tuning   ``PrefixEncoder``: virtual_tokens x (layers x 2 x kv heads x head   prefix_tuning/model.py,
                dim) (hidden instead of kv heads x head dim without GQA keys)       utils/other.py
ln-tuning       a trainable copy of each targeted norm (the base norm stays)        ln_tuning/layer.py
bitfit          every bias of the base (Ben Zaken et al. 2022; not in PEFT)
adapter         ``adapter_params`` (the recipe's count)
==============  ==================================================================  =========
"""

from __future__ import annotations

from typing import NamedTuple

from ..errors import Problems
from ..model.peft_targets import ia3_roles, ln_tuning_norm
from ..model.spec import LORA_HEAD, Component, ModelSpec, Split, Tensor, is_head_weight
from ..recipe import Recipe

__all__ = ["Extra", "LORA_LIKE", "FROZEN_BASE", "adapted_roles", "base_trains", "tensor_extras",
           "model_extras", "prefix_token_dim", "peft_problems"]

LORA_LIKE = ("lora", "qlora", "dora", "lora-fa", "vera")
"""Methods that add low-rank adapters to the linears named by ``lora_targets``."""
FROZEN_BASE = LORA_LIKE + ("ia3", "prompt-tuning", "prefix-tuning", "ln-tuning", "bitfit",
                           "adapter")
"""Methods whose base weights are frozen while the gradient flows through every layer."""


class Extra(NamedTuple):
    """A tensor a method adds, as one rank holds it (``layout`` turns it into a ``Held``)."""

    tensor: Tensor
    numel: int
    trainable: bool = True
    adapter: bool = True
    """Stored in ``adapter_dtype`` (PEFT's modules); False: in the parameters' dtype."""


def adapted_roles(model: ModelSpec, recipe: Recipe) -> frozenset[str]:
    """Linear roles that get a per-linear adapter under ``recipe.method``."""
    kind = recipe.method.kind
    if kind in LORA_LIKE:
        return frozenset(recipe.method.lora_targets)
    if kind == "ia3":
        return ia3_roles(model.model_type)[0]
    return frozenset()


def base_trains(t: Tensor, recipe: Recipe) -> bool:
    """A base tensor trains under a frozen-base method: only biases, under BitFit."""
    return recipe.method.kind == "bitfit" and t.is_bias


def _held(name: str, shape: tuple[int, ...], base: Tensor, numel: int, *,
          trainable: bool = True) -> Extra:
    return Extra(Tensor(name=name, shape=shape, component=base.component,
                        experts=base.experts), numel, trainable)


def tensor_extras(model: ModelSpec, t: Tensor, recipe: Recipe, roles: frozenset[str]) -> list[Extra]:
    """Tensors the method adds next to base tensor ``t`` (one rank's share under TP/EP; the
    factor on a split side is split too, as NeMo/Megatron LoRA does)."""
    kind, par = recipe.method.kind, recipe.parallelism
    if _saved_module(t, recipe):
        return [Extra(Tensor(name=t.name + " (modules_to_save copy)", shape=t.shape,
                             component=t.component, split=t.split),
                      t.numel_per_rank(par.tp_of(t.experts), par.ep), adapter=False)]
    if kind == "ln-tuning":
        if not ln_tuning_norm(model, t):
            return []
        return [Extra(Tensor(name=t.name + " (ln_tuning copy)", shape=t.shape,
                             component=t.component, is_bias=t.is_bias), t.numel, adapter=False)]
    head = LORA_HEAD in roles and kind in LORA_LIKE and is_head_weight(t)
    if not (head or (t.is_linear and set(t.targets) & roles)):
        return []
    if t.experts > 1 and kind not in ("lora", "qlora"):
        return []  # routed experts are 3-D parameters in transformers 5: no module to wrap
    out_f, in_f = t.shape[0], t.shape[-1]
    r, tp = recipe.method.lora_rank, par.tp_of(t.experts)
    a_in = -(-in_f // tp) if t.split is Split.ROW else in_f
    b_out = -(-out_f // tp) if t.split in (Split.COLUMN, Split.VOCAB) else out_f
    e = -(-t.experts // par.ep) if t.experts > 1 else 1
    base = t.name.replace(".weight", "")
    if kind == "ia3":
        ff = set(t.targets) & ia3_roles(model.model_type)[1]
        return [_held(base + ".ia3_l", (1, in_f) if ff else (out_f, 1), t,
                      e * (a_in if ff else b_out))]
    if kind == "vera":
        return [_held(base + ".vera_lambda_d", (r,), t, e * r),
                _held(base + ".vera_lambda_b", (out_f,), t, e * b_out)]
    out = [_held(base + ".lora_A", (r, in_f), t, e * r * a_in, trainable=kind != "lora-fa"),
           _held(base + ".lora_B", (out_f, r), t, e * r * b_out)]
    if kind == "dora":
        out.append(_held(base + ".lora_magnitude_vector", (out_f,), t, e * b_out))
    return out


def _saved_module(t: Tensor, recipe: Recipe) -> bool:
    """``t`` is the weight of a module PEFT's ``modules_to_save`` copies and trains: the token
    embedding (``embed``, the vocabulary-split embedding) or the untied output layer
    (``lm_head``) (``peft/utils/other.py`` ``ModulesToSaveWrapper``: the original stays frozen,
    a deep copy trains)."""
    saved = recipe.method.modules_to_save
    if not saved or t.split is not Split.VOCAB:
        return False
    return ("embed" in saved and t.component is Component.EMBEDDING) or (
        "lm_head" in saved and t.component is Component.HEAD)


def model_extras(model: ModelSpec, recipe: Recipe) -> list[Extra]:
    """Tensors the method adds once per model (held with the embedding, pipeline stage 0)."""
    m = recipe.method
    emb = Tensor(name="", shape=(0,), component=Component.OTHER)
    if m.kind == "prompt-tuning":
        n = m.virtual_tokens * model.hidden_size
        return [_held("prompt_encoder.embedding.weight", (m.virtual_tokens, model.hidden_size),
                      emb, n)]
    if m.kind == "prefix-tuning":
        dim = prefix_token_dim(model)
        shape = (m.virtual_tokens, model.num_layers * 2 * dim)
        return [_held("prompt_encoder.embedding.weight", shape, emb, shape[0] * shape[1])]
    if m.kind == "adapter":
        return [_held("adapter (adapter_params)", (m.adapter_params,), emb, m.adapter_params)]
    if m.kind == "vera":
        roles = adapted_roles(model, recipe)
        lin = [t for t in model.tensors if t.is_linear and set(t.targets) & roles]
        if not lin:
            return []
        r = m.lora_rank
        max_in, max_out = max(t.shape[-1] for t in lin), max(t.shape[0] for t in lin)
        return [_held("vera_A", (r, max_in), emb, r * max_in, trainable=False),
                _held("vera_B", (max_out, r), emb, r * max_out, trainable=False)]
    return []


def prefix_token_dim(model: ModelSpec) -> int:
    """Per-layer width of one key (or value) prefix: ``num_key_value_heads x head_dim`` when
    the config has ``num_key_value_heads``, else ``hidden_size`` (PEFT
    ``_prepare_prompt_learning_config``, utils/other.py)."""
    a = next((ly.attention for ly in model.layers if ly.attention), None)
    if a is None or not (model.config or {}).get("num_key_value_heads"):
        return model.hidden_size
    return a.num_kv_heads * a.head_dim


def peft_problems(model: ModelSpec, recipe: Recipe, p: Problems) -> None:
    """What the method needs from the model (checked with the LoRA targets)."""
    kind = recipe.method.kind
    saved = recipe.method.modules_to_save
    if saved and kind not in FROZEN_BASE:
        p.add(f"modules_to_save={','.join(saved)} applies to PEFT methods; method={kind} "
              "trains " + ("every weight already." if kind == "full" else "its own layers.")
              + " Drop --modules-to-save, or use a PEFT method such as lora.")
    if "lm_head" in saved and model.tied_embeddings:
        p.add(f"modules_to_save=lm_head: {model.id} ties its output layer to the input "
              "embedding, so there is no separate lm_head to copy. Use --modules-to-save embed.")
    if kind == "bitfit" and not any(t.is_bias for t in model.tensors):
        p.add(f"method=bitfit trains biases, but {model.id} has none (its linears and norms "
              "are bias-free). Use ln-tuning, ia3 or lora.")
    if kind == "ia3" and not any(t.is_linear and set(t.targets) & ia3_roles(model.model_type)[0]
                                 for t in model.tensors):
        p.add(f"method=ia3: none of PEFT's default IA3 targets exist in {model.id}.")
