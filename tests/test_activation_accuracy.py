"""The estimator's peak vs real CPU training steps of small real architectures (issue #3).

``memplan.measure.measure_step`` counts every live tensor byte of real transformers models at
random init (scaled-down configs: hidden 128, 2 layers, vocab 1024). With ``device=cpu`` the
estimate of peak allocated bytes must be within 5% of measured for every case and within 2% for
most. Two sources: the committed matrix (``validation/cpu_tiny_matrix.jsonl``, 132 configurations
x first/steady step, produced by ``scripts/measure_tiny_matrix.py``) and fresh runs here that
add bf16-true, Adam and SGD (no LoRA: LoRA runs are `memplan validate` cases).
"""

from __future__ import annotations

import json
import statistics
import sys
from functools import cache
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from memplan import Recipe, estimate, load_model  # noqa: E402
from memplan.hardware import cpu_device  # noqa: E402
from memplan.model.hf import from_hf_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import measure_tiny_matrix as tiny  # noqa: E402

PRECISION = {"fp32": "32-true", "bf16-autocast": "bf16-mixed", "bf16-true": "bf16-true"}


def _spec(name: str, attn: str):
    cfg_cls, _, kw = tiny._configs()[name]
    return from_hf_config(cfg_cls(**kw, attn_implementation=attn).to_dict(), name)


@cache  # scripts/accuracy_claims.py estimates the same matrix in the same worker (conftest)
def _estimate(name, batch, seq, precision, attn, ckpt, optimizer="adamw", method="full"):
    recipe = Recipe.of(precision=PRECISION[precision], micro_batch=batch, seq_len=seq,
                    attention=attn, checkpointing="full" if ckpt else "none", device="cpu",
                    optimizer=optimizer, method=method)
    return estimate(_spec(name, attn), recipe, cpu_device(24 << 30)).ranks[0]


def _err(est: int, meas: int) -> float:
    return abs(est - meas) / meas * 100


def test_committed_matrix_within_bounds():
    text = (ROOT / "validation/cpu_tiny_matrix.jsonl").read_text()
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    errs = []
    for r in rows:
        if "error" in r:
            continue
        rank = _estimate(r["model"], r["batch"], r["seq"], r["precision"], r["attn"],
                         r["grad_ckpt"])
        errs.append((_err(rank.first_step_peak_allocated_bytes, r["step0"]["peak_bytes"]),
                     r["model"], r["batch"], r["seq"], r["precision"], r["attn"], "step0"))
        errs.append((_err(rank.steady_peak_allocated_bytes, r["step1"]["peak_bytes"]),
                     r["model"], r["batch"], r["seq"], r["precision"], r["attn"], "step1"))
    assert len(errs) == 264
    worst = max(errs)
    assert worst[0] <= 5.0, worst
    within2 = sum(e[0] <= 2.0 for e in errs) / len(errs)
    assert within2 >= 0.85, within2
    assert statistics.median(e[0] for e in errs) <= 0.5


def _run(name, batch, seq, precision, attn, ckpt, optimizer, lora=False):
    cfg_cls, model_cls, kw = tiny._configs()[name]
    torch.manual_seed(0)
    model = model_cls(cfg_cls(**kw, attn_implementation=attn))
    model.train()
    if precision == "bf16-true":
        model.to(torch.bfloat16)
    if ckpt:
        tiny._enable_checkpointing(model)
    if lora:
        peft = pytest.importorskip("peft")
        model = peft.get_peft_model(model, peft.LoraConfig(r=8, target_modules="all-linear"))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam,
           "sgd": torch.optim.SGD}[optimizer](params, lr=1e-4)
    ids = torch.randint(0, tiny.VOCAB, (batch, seq))
    from memplan.measure import measure_step

    return measure_step(model, {"input_ids": ids, "labels": ids.clone()}, opt,
                        autocast_dtype=torch.bfloat16 if precision == "bf16-autocast" else None,
                        steps=2)


LIVE = [
    ("llama", 4, 128, "bf16-true", "sdpa", False, "adamw"),
    ("qwen2", 2, 256, "bf16-true", "eager", True, "adamw"),
    ("llama", 4, 128, "fp32", "sdpa", False, "adam"),
    ("llama", 4, 128, "fp32", "sdpa", False, "sgd"),
    ("gpt2", 4, 128, "bf16-autocast", "sdpa", False, "sgd"),
    ("gpt_neox", 2, 256, "fp32", "sdpa", True, "adam"),
    ("gemma2", 2, 128, "bf16-true", "eager", False, "adamw"),
    ("bert_mlm", 4, 128, "fp32", "sdpa", False, "adamw"),
    # BertForMaskedLM's loss does not upcast under 16-bit training (was +19 %, issue #17)
    ("bert_mlm", 2, 128, "bf16-true", "eager", True, "adamw"),
    ("bert_mlm", 2, 128, "bf16-true", "eager", False, "adamw"),
    # CPU math SDPA (dropout) upcasts 16-bit q, k, v to fp32 (was -15 % / -18 %, issue #17)
    ("gpt2", 2, 128, "bf16-true", "sdpa", False, "adamw"),
    ("bert_mlm", 2, 128, "bf16-true", "sdpa", False, "adamw"),
]


@pytest.mark.parametrize("case", LIVE, ids=lambda c: "-".join(map(str, c)))
def test_live_runs_within_bounds(case):
    name, batch, seq, precision, attn, ckpt, optimizer = case
    measured = _run(*case)
    rank = _estimate(name, batch, seq, precision, attn, ckpt, optimizer)
    assert _err(rank.first_step_peak_allocated_bytes, measured[0].peak_bytes) <= 5.0, (
        rank.first_step_peak_allocated_bytes, measured[0].peak_bytes)
    assert _err(rank.steady_peak_allocated_bytes, measured[1].peak_bytes) <= 5.0, (
        rank.steady_peak_allocated_bytes, measured[1].peak_bytes)


@pytest.mark.parametrize("model", ["bert-large-uncased", "openai-community/gpt2", "meta-llama/Llama-3.2-1B"])
def test_flash_keeps_no_score_matrix_like_sdpa(model):
    """On CUDA, attention='flash' saves what fused SDPA saves (no B x H x S x S scores) for
    every family; eager keeps the scores and must cost more."""
    from memplan.hardware import get_device

    peaks = {a: estimate(load_model(model), Recipe.of(micro_batch=4, seq_len=512, attention=a),
                         get_device("A100-80GB"), search_micro_batch=False).worst
             .peak_allocated_bytes for a in ("eager", "sdpa", "flash")}
    assert peaks["flash"] == peaks["sdpa"] < peaks["eager"]


def _chunked_ce(model, batch):
    """torchtune's recipe: output projection per sequence chunk, fp32 upcast and
    cross-entropy per chunk, summed; the 16-bit chunk logits are dropped before the backward."""
    hidden = model.model(input_ids=batch["input_ids"]).last_hidden_state
    logits = [model.lm_head(c) for c in hidden.chunk(8, dim=1)]
    labels = batch["labels"].chunk(8, dim=1)
    n = batch["labels"].numel()
    loss = sum(torch.nn.functional.cross_entropy(lg.float().flatten(0, 1), lb.flatten(),
                                                 reduction="sum") for lg, lb in zip(logits, labels))
    del logits
    return loss / n


@pytest.mark.parametrize("precision", ["fp32", "bf16-autocast"])
def test_chunked_cross_entropy_against_a_real_run(precision):
    """loss='chunked' vs a real step with torchtune-style chunked cross-entropy (measured
    2026-11-21: -1.3% fp32, -1.4% bf16 autocast, steady step); and it must cost less than
    the HF loss."""
    from memplan.measure import measure_step

    cfg_cls, model_cls, kw = tiny._configs()["llama"]
    torch.manual_seed(0)
    model = model_cls(cfg_cls(**kw, attn_implementation="sdpa"))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, tiny.VOCAB, (4, 128))
    measured = measure_step(model, {"input_ids": ids, "labels": ids.clone()}, opt,
                            autocast_dtype=torch.bfloat16 if precision != "fp32" else None,
                            loss_fn=_chunked_ce, steps=2)
    recipe = Recipe.of(precision=PRECISION[precision], micro_batch=4, seq_len=128, device="cpu",
                    loss="chunked")
    rank = estimate(_spec("llama", "sdpa"), recipe, cpu_device(24 << 30)).ranks[0]
    assert _err(rank.steady_peak_allocated_bytes, measured[1].peak_bytes) <= 5.0, (
        rank.steady_peak_allocated_bytes, measured[1].peak_bytes)
    standard = _estimate("llama", 4, 128, precision, "sdpa", False)
    assert rank.steady_peak_allocated_bytes < standard.steady_peak_allocated_bytes
