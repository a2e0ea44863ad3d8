"""Checks that need both the model and the recipe (the recipe checks itself alone)."""

from __future__ import annotations

from ..errors import Problems
from ..facts import state_dtypes
from ..model.spec import LORA_TARGETS, ModelSpec
from ..recipe import Parallelism, Recipe
from ..recipe.engine import fsdp1_mixes
from .peft import FROZEN_BASE, LORA_LIKE, peft_problems

__all__ = ["check_compatible"]


def check_compatible(model: ModelSpec, recipe: Recipe) -> None:
    """Raise one ``ConfigError`` listing every way ``recipe`` cannot apply to ``model``."""
    p, par = Problems(), recipe.parallelism
    attn = next((layer.attention for layer in model.layers if layer.attention), None)
    if par.tp > 1 and attn is not None:
        if attn.num_heads % par.tp:
            divisors = [d for d in range(1, attn.num_heads + 1) if attn.num_heads % d == 0]
            p.add(f"tp={par.tp} does not divide the {attn.num_heads} attention heads of "
                  f"{model.id}; each TP rank needs whole heads. Use tp in "
                  f"{', '.join(map(str, [d for d in divisors if d <= 64]))}.")
        kv = attn.num_kv_heads
        if kv % par.tp and par.tp % kv:
            p.add(f"tp={par.tp} and the {kv} key/value heads of {model.id} do not divide "
                  "either way (kv heads are split when tp divides them, replicated when they "
                  "divide tp). Choose tp as a divisor or multiple of the kv heads.")
    _pipeline_split(model, par, p)
    if par.pp > max(1, model.num_layers):
        p.add(f"pp={par.pp} is larger than the {model.num_layers} layers of {model.id}; "
              f"every pipeline stage needs at least one layer. Use pp <= {model.num_layers}.")
    if par.ep > 1:
        experts = max((t.experts for t in model.tensors), default=1)
        if experts <= 1:
            p.add(f"ep={par.ep} but {model.id} has no routed experts (not a MoE model). "
                  "Use ep=1.")
        elif experts % par.ep:
            p.add(f"ep={par.ep} does not divide the {experts} experts of {model.id}. "
                  f"Use a divisor of {experts}.")
    peft_problems(model, recipe, p)
    _fsdp1_flat_dtype(recipe, p)
    _deepspeed_adapter_dtype(recipe, p)
    graph = model.traits.graph if model.traits is not None else None
    if recipe.method.kind in ("prompt-tuning", "prefix-tuning") and graph not in (
            "decoder", "ln_decoder") and not (recipe.method.kind == "prompt-tuning"
                                              and graph in ("gpt2", "gpt_neox")):
        which = ("Llama lineage, Phi, StableLM, StarCoder2, Falcon, GPT-2, GPT-NeoX"
                 if recipe.method.kind == "prompt-tuning"
                 else "Llama lineage, Phi, StableLM, StarCoder2")
        p.add(f"method={recipe.method.kind} is modelled for decoder-only families ({which}); "
              f"{model.id} ({model.model_type}) is not one of them. Use lora, ia3 or "
              "--method adapter with its parameter count.")
    if recipe.method.kind == "prefix-tuning" and model.model_type == "falcon":
        p.add("method=prefix-tuning on falcon: PEFT 0.21.2 shapes the prefix with every query "
              "head while Falcon's cache holds its k/v heads (the real run fails in torch.cat). "
              "Use prompt-tuning, lora or ia3.")
    if model.traits is not None and model.traits.graph == "t5" and par.tp * par.pp * par.cp > 1:
        p.add(f"{model.id} is an encoder-decoder (T5): memplan's T5 graph runs the whole model "
              "on one rank; use tp=1, pp=1, cp=1 (data parallelism and ZeRO are fine).")
    if recipe.method.kind in LORA_LIKE:
        have = model.available_targets()
        missing = [t for t in recipe.method.lora_targets if t not in have]
        if not have:
            p.add(f"{model.id} has no linear layers memplan can adapt with LoRA.")
        elif len(missing) == len(recipe.method.lora_targets):
            p.add(f"LoRA targets {','.join(missing)} match no module of {model.id}; it has "
                  f"{','.join(t for t in ('q', 'k', 'v', 'o', 'gate', 'up', 'down') if t in have)}.")
        elif missing and set(recipe.method.lora_targets) != set(LORA_TARGETS):
            # the default (every role) means every linear the model has (PEFT "all-linear")
            p.add(f"LoRA target(s) {','.join(missing)} do not exist in {model.id} (it has "
                  f"{','.join(t for t in ('q', 'k', 'v', 'o', 'gate', 'up', 'down') if t in have)}"
                  "). Remove them from lora_targets.")
    if recipe.method.kind in LORA_LIKE and "lm_head" in recipe.method.lora_targets and \
            recipe.loss.kind in ("chunked", "fused"):
        p.add(f"lora_targets with lm_head and loss={recipe.loss.kind}: an adapter inside the "
              "chunked or fused output projection is not modelled. Use loss=standard, "
              "chunked-head or chunked-ce, or drop lm_head from lora_targets.")
    if recipe.optimizer.in_backward:
        if par.gpus > 1 or recipe.batch.grad_accum > 1 or recipe.offload.kind != "none":
            p.add(f"optimizer_in_backward with gpus={par.gpus}, grad_accum="
                  f"{recipe.batch.grad_accum}, offload={recipe.offload.kind}: modelled for one "
                  "device without gradient accumulation or offload (torchtune's single-device "
                  "recipes refuse accumulation with it). Use gpus=1, grad_accum=1, offload=none.")
    if recipe.method.kind == "freeze" and recipe.method.freeze_trainable_layers > model.num_layers:
        p.add(f"freeze_trainable_layers={recipe.method.freeze_trainable_layers} exceeds the "
              f"{model.num_layers} layers of {model.id}.")
    if par.cp > 1 and recipe.batch.seq_len % (2 * par.cp):
        p.add(f"seq_len={recipe.batch.seq_len} must be divisible by 2*cp={2 * par.cp}: "
              "context parallelism splits each sequence into 2*cp load-balanced chunks "
              "(Megatron-Core).")
    if par.pp > 1 and model.num_layers == 0:
        p.add(f"{model.id} has no detectable layer stack, so it cannot be split into pipeline "
              "stages. Use pp=1.")
    p.raise_if_any()


def _pipeline_split(model: ModelSpec, par: Parallelism, p: Problems) -> None:
    """The layer split Megatron-Core accepts (``transformer_block.py``
    ``get_num_layers_to_build`` asserts each of these)."""
    n, pp, vp = model.num_layers, par.pp, par.pp_virtual
    first, last = par.pp_first_layers, par.pp_last_layers
    if pp == 1:
        return
    if first or last:
        left, rest = pp - (first > 0) - (last > 0), n - first - last
        if rest < 0 or (left == 0 and rest) or (left and rest % left):
            p.add(f"pp_first_layers={first}, pp_last_layers={last}: the other {max(rest, 0)} of "
                  f"the {n} layers of {model.id} must split equally over the {left} other "
                  "stage(s) (Megatron: 'the left over layers must be divisible by left over "
                  "stages'). Change the first/last counts or pp.")
            return
        counts = [c for c in (first, last) if c] + ([rest // left] if left else [])
        if vp > 1 and any(c % vp for c in counts):
            p.add(f"pp_virtual={vp}: every stage's layer count ({', '.join(map(str, counts))}) "
                  "must divide into pp_virtual chunks (Megatron asserts it). Change "
                  "pp_virtual or the first/last counts.")
        return
    extra = par.pp_split_embedding + par.pp_split_loss
    if extra:
        if (n + extra) % pp or (n + extra) // pp < 1:
            p.add(f"pp_split_embedding/pp_split_loss: the {n} layers of {model.id} + {extra} "
                  f"= {n + extra} must divide by pp={pp} (Megatron: 'num_layers should be "
                  "divisible by pipeline_model_parallel_size'). Change pp or drop one of them.")
        elif vp > 1 and ((n + extra) // pp) % vp:
            p.add(f"pp_virtual={vp} must divide the {(n + extra) // pp} layers of each stage "
                  "(the embedding / loss counted). Change pp_virtual.")
        return
    if vp > 1 and n % (pp * vp):
        p.add(f"pp_virtual={vp}: the {n} layers of {model.id} do not split into pp x "
              f"pp_virtual = {pp * vp} equal chunks (Megatron requires it). Choose pp_virtual "
              "so that pp x pp_virtual divides the layers, or set pp_first_layers / "
              "pp_last_layers.")


def _fsdp1_flat_dtype(recipe: Recipe, p: Problems) -> None:
    """An FSDP1 flat parameter holds one dtype (torch 2.13 ``_flat_param.py``
    ``_validate_tensors_to_flatten``: "Must flatten tensors with uniform dtype"), so adapters
    that share a unit with the frozen base must be stored in the base's dtype."""
    kind = str(recipe.method.kind)
    if str(recipe.engine_kind) != "fsdp1" or kind not in LORA_LIKE + ("ia3",) \
            or not fsdp1_mixes(kind, str(recipe.engine.fsdp1_wrap)):
        return
    frozen, adapter = state_dtypes(recipe).frozen, state_dtypes(recipe).adapter
    if frozen != adapter:
        p.add(f"engine=fsdp1 with fsdp1_wrap={recipe.engine.fsdp1_wrap} puts method={kind}'s "
              f"{adapter} adapters in one flat parameter with the {frozen} frozen base, which "
              "torch refuses ('Must flatten tensors with uniform dtype', _flat_param.py). Set "
              f"adapter_dtype={frozen} (or frozen_dtype to match)"
              + (", or fsdp1_wrap=peft (adapters in units of their own)."
                 if not fsdp1_mixes(kind, "peft") else "."))


def _deepspeed_adapter_dtype(recipe: Recipe, p: Problems) -> None:
    """DeepSpeed ZeRO-1/2 with a 16-bit config casts every parameter of the module, PEFT's
    adapters included, to that dtype (``facts.adapter_dtypes`` cites the engine's lines), so
    an ``adapter_dtype`` given otherwise describes no run DeepSpeed makes."""
    given = str(recipe.method.adapter_dtype)
    if given == "auto" or str(recipe.method.kind) not in FROZEN_BASE:
        return
    dt = state_dtypes(recipe)
    held = dt.adapter  # differs from a given dtype only where DeepSpeed casts
    if held != given:
        master = " with an fp32 master" if dt.adapter_master else ""
        p.add(f"adapter_dtype={given} with engine=deepspeed, zero={recipe.parallelism.zero} and "
              f"precision={recipe.precision.kind}: DeepSpeed casts every parameter of the "
              f"module to {held} when it wraps it (engine.py _configure_distributed_model), "
              f"PEFT's adapters included"
              + (", and keeps their fp32 master in its optimizer" if master else "")
              + f". Leave adapter_dtype unset (auto: {held}{master}) or set "
              f"adapter_dtype={held}.")
