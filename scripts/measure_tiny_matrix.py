"""Measure live tensor bytes of real training steps of tiny random-init transformers models.

For each model x (batch, seq) x precision x attention implementation x activation
checkpointing, runs two AdamW steps on CPU with ``memplan.measure.measure_step`` and prints one
JSON line: the configuration, sizes useful for checking formulas (parameter bytes, one fp32
logits tensor, one fp32 hidden-state tensor, one fp32 attention-score tensor) and the
measurements of step 0 (creates the AdamW states) and step 1 (steady state).

    python scripts/measure_tiny_matrix.py > /tmp/tiny_matrix.jsonl
    python scripts/measure_tiny_matrix.py --quick        # one size, fewer combinations
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
import warnings

import torch
import transformers

from memplan.measure import measure_step

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN, VOCAB = 128, 2, 4, 2, 256, 1024
MAX_POS = 512


def _configs() -> dict[str, tuple[type, type, dict]]:
    t = transformers
    common_dec = dict(
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        vocab_size=VOCAB,
        max_position_embeddings=MAX_POS,
        use_cache=False,
    )
    return {
        "llama": (t.LlamaConfig, t.LlamaForCausalLM, dict(common_dec)),
        "qwen2": (t.Qwen2Config, t.Qwen2ForCausalLM, dict(common_dec)),
        "gemma2": (
            t.Gemma2Config,
            t.Gemma2ForCausalLM,
            dict(common_dec, head_dim=HIDDEN // HEADS, query_pre_attn_scalar=HIDDEN // HEADS,
                 sliding_window=128),
        ),
        "gpt2": (
            t.GPT2Config,
            t.GPT2LMHeadModel,
            dict(n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_inner=FFN, vocab_size=VOCAB,
                 n_positions=MAX_POS, use_cache=False),
        ),
        "gpt_neox": (
            t.GPTNeoXConfig,
            t.GPTNeoXForCausalLM,
            dict(hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                 num_attention_heads=HEADS, vocab_size=VOCAB, max_position_embeddings=MAX_POS,
                 use_cache=False),
        ),
        "bert_mlm": (
            t.BertConfig,
            t.BertForMaskedLM,
            dict(hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                 num_attention_heads=HEADS, vocab_size=VOCAB, max_position_embeddings=MAX_POS),
        ),
    }


def _enable_checkpointing(model: torch.nn.Module) -> None:
    # transformers 5 renamed gradient_checkpointing_enable (deprecated, warns) to this.
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is None:
        enable = model.gradient_checkpointing_enable
    enable()


def run_case(name, batch, seq, precision, attn, ckpt, seed=0) -> dict:
    cfg_cls, model_cls, kw = _configs()[name]
    cfg = cfg_cls(**kw, attn_implementation=attn)
    torch.manual_seed(seed)
    model = model_cls(cfg)
    model.train()
    if ckpt:
        _enable_checkpointing(model)
    ids = torch.randint(0, VOCAB, (batch, seq))
    inputs = {"input_ids": ids, "labels": ids.clone()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    dtype = torch.bfloat16 if precision == "bf16-autocast" else None
    t0 = time.perf_counter()
    res = measure_step(model, inputs, optimizer, autocast_dtype=dtype, steps=2)
    secs = time.perf_counter() - t0
    n_params = sum(p.numel() for p in model.parameters())
    heads = getattr(cfg, "num_attention_heads", HEADS)
    return {
        "model": name,
        "config": type(cfg).__name__,
        "hidden": HIDDEN,
        "layers": LAYERS,
        "heads": heads,
        "vocab": VOCAB,
        "ffn": FFN,
        "tied_embeddings": bool(getattr(cfg, "tie_word_embeddings", False)),
        "batch": batch,
        "seq": seq,
        "precision": precision,
        "attn": attn,
        "grad_ckpt": ckpt,
        "optimizer": "AdamW",
        "n_params": n_params,
        "param_bytes": n_params * 4,
        "ref": {  # one fp32 tensor of each shape, for reading the numbers
            "logits_fp32": batch * seq * VOCAB * 4,
            "hidden_fp32": batch * seq * HIDDEN * 4,
            "scores_fp32": batch * heads * seq * seq * 4,
            "input_ids": batch * seq * 8,
        },
        "step1": res[1].to_dict(),
        "step0": res[0].to_dict(),
        "seconds": round(secs, 3),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one size, fp32 and bf16, no ckpt")
    ap.add_argument("--models", nargs="*", default=None, help="subset of models")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    transformers.logging.set_verbosity_error()
    warnings.simplefilter("ignore")

    models = args.models or list(_configs())
    sizes = [(1, 64), (4, 128), (2, 256)] if not args.quick else [(2, 128)]
    precisions = ["fp32", "bf16-autocast"]
    attns = ["eager", "sdpa"]
    ckpts = [False, True] if not args.quick else [False]
    grid = itertools.product(models, sizes, precisions, attns, ckpts)
    for name, (b, s), prec, attn, ckpt in grid:
        try:
            row = run_case(name, b, s, prec, attn, ckpt)
        except Exception as exc:  # noqa: BLE001 - report and go on
            row = {"model": name, "batch": b, "seq": s, "precision": prec, "attn": attn,
                   "grad_ckpt": ckpt, "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
