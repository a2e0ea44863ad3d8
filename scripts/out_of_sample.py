"""The out-of-sample matrix (issue #17): a seeded random draw of configurations the estimator
was not developed on, measured on CPU and compared with ``estimate()``.

Developed on (in-sample): hidden 128, 2 layers, vocab 1024, 4 heads, sequences <= 256
(``validation/cpu_tiny_matrix.jsonl``, ``src/memplan/validate/cases.toml``). Drawn here, with
``SEED``: hidden 64-384 (head dim 16-64), 1 or 3 layers, vocab 512 or 3000, sequences 320 to
4096, batch 1-3, precision, attention, checkpointing, optimizer and method (full, LoRA,
freeze). Each case runs two real steps through memplan's measure (live tensor bytes) and is
estimated; the row keeps the whole peak and the activation + temporary bytes at the peak, so
the error on those can be read apart from the model states.

Usage (slow: minutes on 2 cores; ``--n`` cases, appends to the output as it goes):
``PYTHONPATH=src python scripts/out_of_sample.py --n 40 --out validation/out_of_sample.jsonl``
``PYTHONPATH=src python scripts/out_of_sample.py --table validation/out_of_sample.jsonl``
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "src" / "memplan" / "validate" / "tiny"
SEED = 17
MODELS = ("llama", "qwen2", "gpt2", "gpt_neox", "bert_mlm", "gemma2")
HIDDEN = (64, 96, 192, 256, 384)
SEQ = (320, 640, 1280, 2048, 3072, 4096)
ACT = ("activations", "temporary")


def draw(n: int, seed: int = SEED) -> list[dict]:
    """``n`` configurations, the same for a given seed."""
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        model = rng.choice(MODELS)
        seq = rng.choice(SEQ)
        c = {"model": model, "hidden": rng.choice(HIDDEN), "layers": rng.choice((1, 3)),
             "vocab": rng.choice((512, 3000)), "seq_len": seq,
             "micro_batch": rng.choice((1, 2, 3)) if seq <= 1280 else 1,
             "precision": rng.choice(("32-true", "bf16-mixed", "bf16-true")),
             "attention": "eager" if model == "gemma2" else rng.choice(("eager", "sdpa")),
             "checkpointing": rng.choice(("none", "full")),
             "optimizer": rng.choice(("adamw", "adam", "sgd")),
             "method": rng.choice(("full", "full", "lora", "freeze"))}
        if c["model"] == "bert_mlm":
            c["seq_len"] = min(c["seq_len"], 2048)  # position table, kept modest
        out.append(c)
    return out


def config(c: dict) -> dict:
    """The tiny config of ``c['model']`` resized to the draw."""
    cfg = json.loads((TINY / f"{c['model']}.json").read_text())
    h, heads = c["hidden"], max(1, c["hidden"] // 32)
    if c["model"] == "gpt2":
        cfg.update(n_embd=h, n_layer=c["layers"], n_head=heads, n_inner=2 * h,
                   vocab_size=c["vocab"], n_positions=c["seq_len"])
    else:
        cfg.update(hidden_size=h, intermediate_size=2 * h, num_hidden_layers=c["layers"],
                   num_attention_heads=heads, vocab_size=c["vocab"],
                   max_position_embeddings=c["seq_len"])
        if "num_key_value_heads" in cfg:
            cfg["num_key_value_heads"] = heads // 2 if heads % 2 == 0 else heads
        if c["model"] == "gemma2":
            cfg.update(head_dim=32, query_pre_attn_scalar=32)
    return cfg


def _recipe(c: dict):
    from memplan import Recipe

    kw = {k: c[k] for k in ("precision", "attention", "checkpointing", "optimizer", "method",
                            "micro_batch", "seq_len")}
    if c["method"] == "freeze":
        kw["freeze_trainable_layers"] = 1
    if c["method"] == "lora":  # PEFT's default targets; every family has them
        kw["lora_targets"] = ("q", "v")
    return Recipe.of(device="cpu", **kw)


def estimate_row(c: dict) -> tuple[int, int]:
    """Today's estimate of one drawn configuration: (peak, activations + temporary at it)."""
    from memplan import estimate, load_model
    from memplan.hardware import cpu_device

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "config.json"
        path.write_text(json.dumps(config(c)))
        w = estimate(load_model(str(path)), _recipe(c), cpu_device(16 << 30)).worst
    return w.peak_allocated_bytes, sum(v for k, v in w.categories_at_peak().items()
                                       if str(k) in ACT)


def run(c: dict) -> dict:
    from memplan import estimate, load_model
    from memplan.hardware import cpu_device
    from memplan.measure.real import measure_recipe

    recipe = _recipe(c)
    device = cpu_device(16 << 30)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "config.json"
        path.write_text(json.dumps(config(c)))
        t0 = time.perf_counter()
        try:
            measured = measure_recipe(str(path), recipe, device).worst
            estimated = estimate(load_model(str(path)), recipe, device).worst
        except Exception as e:  # noqa: BLE001 - recorded, the matrix goes on
            return {**c, "error": f"{type(e).__name__}: {e}"[:300]}
    m_cat, e_cat = measured.categories_at_peak(), estimated.categories_at_peak()
    return {**c, "measured_peak": measured.peak_allocated_bytes,
            "estimated_peak": estimated.peak_allocated_bytes,
            "measured_act_tmp": sum(v for k, v in m_cat.items() if str(k) in ACT),
            "estimated_act_tmp": sum(v for k, v in e_cat.items() if str(k) in ACT),
            "measured_moment": measured.peak_moment.label,
            "estimated_moment": estimated.peak_moment.label,
            "seconds": round(time.perf_counter() - t0, 2)}


BOUND_PCT = 5.0
"""The issue's bar for the whole peak and for activations + temporaries at the peak."""

SDPA_MATH_UPCAST = (
    "The first run of this matrix found GPT-2 and BERT under bf16-true with sdpa 37-40 % low "
    "(5 rows). Cause, measured: with dropout (both use 0.1) CPU SDPA runs "
    "_scaled_dot_product_attention_math, which converts bf16/fp16 q, k, v to fp32 'for "
    "accuracy' (pytorch aten/src/ATen/native/transformers/attention.cpp) unless "
    "allowFP16BF16ReductionMathSDP is set; at hidden 128, 2 x 128 the sdpa peak was 19-25 % "
    "above the eager peak of the same bf16-true model, and memplan's eager estimate matched the "
    "eager measurement within 1 %. memplan modelled that upcast under autocast only; it now "
    "models it for 16-bit training too (estimate/activations/families.py), and the 5 rows are "
    "within 5 %. CPU-only: CUDA runs fused kernels.")

EAGER_16BIT_SOFTMAX_DROPOUT = (
    "The second run left 3 rows outside 5 % (BERT bf16-true eager with checkpointing +6.6 % at "
    "2 x 320 and +15.7 % at 2 x 640, GPT-2 bf16 autocast eager -5.3 %). Cause, measured (saved "
    "tensors of a BERT h192 forward, bf16-true and CPU autocast alike: the S x S tensors kept are "
    "the softmax output, the dropout noise and the dropout output, all bf16): GPT-2 and BERT call "
    "softmax without dtype, so its output keeps the scores' bf16 (CPU autocast's fp32 list has no "
    "softmax), where memplan allocated fp32 probabilities and a bf16 copy; and CPU dropout is "
    "composite (input * noise), saving the noise in the input's dtype, where memplan assumed a "
    "1-byte mask for 16-bit inputs. Fixing one alone moved the BERT rows to -11 %; with both "
    "(estimate/activations/families.py, blocks.py) the three rows are -2.1 %, -1.0 % and +1.2 %.")

EXPLAINED: dict[str, str] = {}
"""Classes of rows outside the bound whose cause was measured but not fixed (none left)."""


def explained(row: dict) -> str:
    """The measured cause of a row outside the bound, if the row belongs to a diagnosed class."""
    return next((why for cls, why in EXPLAINED.items() if cls == row["model"]), "")


def _err(est: int, meas: int) -> float:
    return (est - meas) / meas * 100 if meas else 0.0


def refresh(rows: list[dict]) -> list[dict]:
    """The committed measurements with today's estimates (the estimator moves; the measured
    bytes of a drawn configuration do not)."""
    out = []
    for r in rows:
        if "error" not in r:
            peak, act = estimate_row(r)
            r = {**r, "estimated_peak": peak, "estimated_act_tmp": act}
        out.append(r)
    return out


def errors(rows: list[dict]) -> dict[str, list[float]]:
    ok = [r for r in rows if "error" not in r]
    return {"peak": [_err(r["estimated_peak"], r["measured_peak"]) for r in ok],
            "act_tmp": [_err(r["estimated_act_tmp"], r["measured_act_tmp"]) for r in ok]}


def summary(rows: list[dict]) -> dict[str, object]:
    """The figures the accuracy claims quote (rows already refreshed)."""
    ok = [r for r in rows if "error" not in r]
    e = errors(rows)
    out_peak = [r for r, x in zip(ok, e["peak"]) if abs(x) > BOUND_PCT]
    out_act = [r for r, x in zip(ok, e["act_tmp"]) if abs(x) > BOUND_PCT]
    return {"seed": SEED, "drawn": len(rows), "ran": len(ok),
            "max_abs_peak_error_pct": round(max(map(abs, e["peak"])), 2),
            "median_abs_peak_error_pct": round(statistics.median(map(abs, e["peak"])), 2),
            "max_abs_act_tmp_error_pct": round(max(map(abs, e["act_tmp"])), 2),
            "median_abs_act_tmp_error_pct": round(statistics.median(map(abs, e["act_tmp"])), 2),
            "peak_outside_5pct": len(out_peak), "act_tmp_outside_5pct": len(out_act),
            "outside_explained": sum(bool(explained(r)) for r in out_peak),
            "failed": sorted({r["error"].split(":")[0] for r in rows if "error" in r})}


def table(rows: list[dict]) -> str:
    ok = [r for r in rows if "error" not in r]
    peak = [_err(r["estimated_peak"], r["measured_peak"]) for r in ok]
    act = [_err(r["estimated_act_tmp"], r["measured_act_tmp"]) for r in ok]
    out = [f"Out-of-sample matrix (seed {SEED}): {len(rows)} drawn, {len(ok)} ran, "
           f"{len(rows) - len(ok)} failed to build or run.", "",
           "| | max abs err | median abs err | within 5% |", "|---|---|---|---|"]
    for name, errs in (("whole peak", peak), ("activations + temporary at the peak", act)):
        if errs:
            a = [abs(e) for e in errs]
            out.append(f"| {name} | {max(a):.2f}% | {statistics.median(a):.2f}% | "
                       f"{sum(x <= 5 for x in a)}/{len(a)} |")
    out += ["", "| model | h | L | V | B x S | precision | attn | ckpt | opt | method | peak err "
            "| act+tmp err | measured peak moment | outside 5 %: cause |", "|" + "---|" * 14]
    for r in rows:
        head = (f"| {r['model']} | {r['hidden']} | {r['layers']} | {r['vocab']} | "
                f"{r['micro_batch']} x {r['seq_len']} | {r['precision']} | {r['attention']} | "
                f"{r['checkpointing']} | {r['optimizer']} | {r['method']} | ")
        if "error" in r:
            out.append(head + f"error: {r['error'][:80]} | | | |")
        else:
            pe = _err(r["estimated_peak"], r["measured_peak"])
            why = ("" if abs(pe) <= BOUND_PCT else
                   explained(r) or "not identified")
            out.append(head + f"{pe:+.2f}% | "
                       f"{_err(r['estimated_act_tmp'], r['measured_act_tmp']):+.2f}% | "
                       f"{r['measured_moment']} | {why} |")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--out", type=Path, default=ROOT / "validation" / "out_of_sample.jsonl")
    ap.add_argument("--table", type=Path)
    a = ap.parse_args(argv)
    if a.table:
        rows = refresh([json.loads(x) for x in a.table.read_text().splitlines() if x.strip()])
        sys.stdout.write(table(rows) + "\n")
        return 0
    done = 0
    if a.out.exists():
        done = sum(1 for x in a.out.read_text().splitlines() if x.strip())
    for c in draw(a.n)[done:]:
        with a.out.open("a") as f:
            f.write(json.dumps(run(c)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
