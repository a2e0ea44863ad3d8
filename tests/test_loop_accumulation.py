"""Gradient accumulation in the loop (issue #15 section 1): the runtime really accumulates
(``grad_accum`` micro-batches per optimizer step), scaling the loss by division or in place,
and the activation simulator charges the computed gradient as a temporary when ``.grad``
already exists (``AccumulateGrad`` adds it in place)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from memplan.estimate.activations import accumulates
from memplan.estimate.activations.graph import Graph, Tensor, simulate
from memplan.recipe import Recipe

TINY = Path(__file__).resolve().parents[1] / "src/memplan/validate/tiny/llama.json"


def _backward_peak(accumulate: bool, cast: bool) -> int:
    """x (100 B, saved) feeds y = x W: weight gradient 400 B as computed, 800 B after a cast."""
    g = Graph(accumulate=accumulate)
    x = Tensor(100, grad=False)
    g.op([], (x,))
    g.op([x], (Tensor(200),), saves=(x,), params=((400, 800 if cast else 0),))
    return max(p.saved + p.temp for p in simulate(g) if p.phase == "backward")


def test_accumulating_charges_the_computed_gradient_as_a_temporary():
    # Stolen (.grad is None): the fp32 gradient becomes .grad (a gradient line, not here); a
    # 16-bit one being cast is a temporary beside the saved x.
    assert _backward_peak(False, cast=False) == 100
    assert _backward_peak(False, cast=True) == 100 + 400
    # Accumulating: the computed gradient is added into .grad, so it is a temporary too.
    assert _backward_peak(True, cast=False) == 100 + 400
    # ...and the cast runs after the op freed x: the 16-bit gradient and its fp32 copy.
    assert _backward_peak(True, cast=True) == 400 + 800


@pytest.mark.parametrize("kw, want", [
    ({}, False),
    ({"grad_accum": 2}, True),
    ({"set_to_none": False}, True),
    ({"zero_grad": "before-backward"}, False),  # set_to_none=True: .grad is None again
    ({"grad_accum": 2, "gpus": 8, "zero": 2}, False),  # DeepSpeed keeps its own buffers
    ({"grad_accum": 8, "gpus": 4, "pp": 4}, False),
])
def test_which_loops_accumulate(kw, want):
    assert accumulates(Recipe.from_dict(kw)) is want


@pytest.mark.parametrize("outputs_kept", [False, True])
def test_loss_scaled_in_place_or_not_peaks_the_same(outputs_kept):
    """``loss = loss / accum`` makes a new 0-d tensor, ``loss.div_(accum)`` does not: the
    step's peak and every phase's peak differ by that fp32 scalar at most (4 B: measured 0 B
    with the outputs dropped, 4 B with them kept, whose ``outputs.loss`` keeps the undivided
    loss alive), so the recipe has no knob for it."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from memplan.runtime.stepping import measure_step

    cfg = transformers.AutoConfig.for_model(**json.loads(TINY.read_text()))
    cfg.use_cache = False
    peaks = {}
    for in_place in (False, True):
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        ids = torch.randint(0, cfg.vocab_size, (1, 16))
        steps = measure_step(model, {"input_ids": ids, "labels": ids.clone()}, opt,
                             grad_accum=2, scale_in_place=in_place, outputs_kept=outputs_kept,
                             autocast_dtype=torch.bfloat16, labels=False)
        peaks[in_place] = steps
    for a, b in zip(peaks[False], peaks[True], strict=True):
        assert 0 <= a.peak_bytes - b.peak_bytes <= 4
        assert all(0 <= a.phase_peaks[ph] - b.phase_peaks[ph] <= 4 for ph in a.phase_peaks)


def test_runtime_runs_every_micro_batch():
    """grad_accum=3: three forwards and backwards before each optimizer step."""
    torch = pytest.importorskip("torch")
    from memplan.runtime.stepping import measure_step

    model = torch.nn.Linear(4, 4)
    calls = []
    model.register_forward_hook(lambda *a: calls.append("f"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.register_step_post_hook(lambda *a: calls.append("s"))
    x = torch.randn(2, 4)
    measure_step(model, {"input": x}, opt, steps=2, grad_accum=3, labels=False,
                 loss_fn=lambda m, b: m(**b).sum())
    assert "".join(calls) == "fffsfffs"
    with pytest.raises(ValueError, match="grad_accum"):
        measure_step(model, {"input": x}, opt, grad_accum=0, loss_fn=lambda m, b: m(**b).sum())


def test_estimate_with_accumulation_is_not_below_without():
    from memplan.estimate import estimate
    from memplan.hardware import get_device
    from memplan.model import load_model

    spec = load_model(str(TINY))
    base = Recipe.from_dict({"precision": "bf16-mixed", "micro_batch": 1, "seq_len": 16,
                             "device": "cpu"})
    dev = get_device("H100-80GB")
    one = estimate(spec, base, dev).worst.peak_allocated_bytes
    acc = estimate(spec, replace(base, batch=replace(base.batch, grad_accum=2)),
                   dev).worst.peak_allocated_bytes
    assert acc > one


@pytest.mark.parametrize("kw, shared_k, shared_v", [
    ({"precision": "32-true"}, True, True),  # SDPA saves the cached K/V themselves
    ({"precision": "bf16-mixed"}, False, True),  # fp32 rotary key, saved as a 16-bit cast
    ({"precision": "32-true", "attention": "eager"}, False, False),  # GQA repeat_kv copies
])
def test_kv_cache_split_into_saved_and_extra(kw, shared_k, shared_v):
    from memplan.estimate.layout import layout
    from memplan.estimate.loop import kv_cache_bytes
    from memplan.facts import dtypes
    from memplan.model import load_model

    spec = load_model(str(TINY))  # 2 layers, 2 kv heads x 32, mb 2 x seq 128
    r = Recipe.from_dict({**kw, "micro_batch": 2, "seq_len": 128, "outputs": "kept",
                          "use_cache": True})
    dt = dtypes(r)
    stage = layout(spec, r)[0]
    k = 2 * 256 * 2 * 32 * (4 if kw["precision"] != "bf16-mixed" else 4)  # rotary key fp32
    v = 2 * 256 * 2 * 32 * (4 if kw["precision"] != "bf16-mixed" else 2)
    shared, extra = kv_cache_bytes(spec, stage, r, dt)
    assert shared == k * shared_k + v * shared_v
    assert extra == k * (not shared_k) + v * (not shared_v)
