"""``memplan measure`` reports which training loop it saw (issue #15 section 1): outputs kept or
dropped, where zero_grad runs and its set_to_none, gradient accumulation, and how the optimizer
steps; with ``--against`` it names the recipe flags that would match the run."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import memplan.measure as mm  # noqa: E402
from memplan.measure.loop_seen import optimizer_impl  # noqa: E402
from memplan.measure.loop_text import describe_loop, loop_hints  # noqa: E402


def _model(use_cache=False):
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, vocab_size=128,
                                   max_position_embeddings=64, use_cache=use_cache)
    torch.manual_seed(0)
    ids = torch.randint(0, 128, (1, 16))
    return transformers.LlamaForCausalLM(cfg), {"input_ids": ids, "labels": ids}


def _run(*, kept=False, before=False, set_to_none=True, accum=1, opt_kw=None, use_cache=False,
         give_objects=True):
    model, batch = _model(use_cache)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **(opt_kw or {}))
    with mm.session(model=model if give_objects else None,
                    optimizer=opt if give_objects else None, plot=False) as s:
        for i in range(3 * accum):
            if kept:
                outputs = model(**batch)
                loss = outputs.loss
            else:
                loss = model(**batch).loss
            if before:
                opt.zero_grad(set_to_none=set_to_none)
            (loss / accum).backward()
            if (i + 1) % accum:
                continue
            opt.step()
            if not before:
                opt.zero_grad(set_to_none=set_to_none)
    assert "zero_grad" not in vars(opt)  # the session gave zero_grad back
    return s.report.loop


@pytest.mark.parametrize("give_objects", [True, False])
@pytest.mark.parametrize("kw, want", [
    ({}, {"outputs": "dropped", "zero_grad": "after-step", "set_to_none": True,
          "forwards_per_step": 1, "optimizer": "AdamW for-loop"}),
    ({"kept": True}, {"outputs": "kept", "zero_grad": "after-step"}),
    ({"kept": True, "use_cache": True}, {"outputs": "kept, with past_key_values"}),
    ({"before": True}, {"outputs": "dropped", "zero_grad": "before-backward",
                        "set_to_none": True}),
    ({"set_to_none": False}, {"zero_grad": "none (gradients kept)", "set_to_none": False}),
    ({"accum": 2}, {"forwards_per_step": 2, "zero_grad": "after-step", "steps": 3}),
    ({"opt_kw": {"foreach": True}}, {"optimizer": "AdamW foreach"}),
    ({"opt_kw": {"fused": True}}, {"optimizer": "AdamW fused"}),
])
def test_session_reports_the_loop_it_saw(kw, want, give_objects):
    loop = _run(**kw, give_objects=give_objects)
    assert {k: loop[k] for k in want} == want


def test_optimizer_impl_follows_torch_default_for_the_device():
    p = [torch.nn.Parameter(torch.zeros(2))]
    # torch 2.13 _default_to_fused_or_foreach: foreach only on foreach devices (CUDA), never
    # fused by default; CPU parameters get the for-loop.
    assert optimizer_impl(torch.optim.AdamW(p)) == "for-loop"
    assert optimizer_impl(torch.optim.AdamW(p, foreach=False)) == "for-loop"
    assert optimizer_impl(torch.optim.SGD(p, foreach=True)) == "foreach"
    assert optimizer_impl(torch.optim.LBFGS(p)) == "for-loop"  # no foreach option


def test_hints_name_the_flags_that_match_the_run():
    loop = {"outputs": "kept, with past_key_values", "zero_grad": "before-backward",
            "set_to_none": True, "forwards_per_step": 4, "optimizer": "AdamW fused"}
    recipe = {"outputs": "dropped", "zero_grad": "after-step", "set_to_none": True,
              "optimizer_impl": "auto", "grad_accum": 1, "device": "cuda"}
    hints = "\n".join(loop_hints(loop, recipe))
    for flag in ("--outputs kept", "--use-cache", "--zero-grad before-backward",
                 "--optimizer-impl fused", "--grad-accum 4"):
        assert flag in hints
    assert "--no-set-to-none" not in hints
    same = {"outputs": "kept", "use_cache": True, "zero_grad": "before-backward",
            "set_to_none": True,
            "optimizer_impl": "fused", "grad_accum": 4, "device": "cuda"}
    assert loop_hints(loop, same) == []
    kept_grads = {**loop, "zero_grad": "none (gradients kept)", "set_to_none": False}
    assert any("--no-set-to-none" in h for h in loop_hints(kept_grads, same))
    # auto resolves to torch's default for the device: the for-loop on CPU
    assert loop_hints({"optimizer": "AdamW for-loop"}, {"device": "cpu"}) == []
    assert "foreach" in loop_hints({"optimizer": "AdamW for-loop"}, {"device": "cuda"})[0]
    assert describe_loop(loop).startswith("loop seen: outputs kept, with past_key_values; "
                                          "zero_grad before-backward (set_to_none=True); 4 ")


SCRIPT = textwrap.dedent("""
    import torch, transformers
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, vocab_size=128,
                                   max_position_embeddings=64, use_cache=False)
    model = transformers.LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    ids = torch.randint(0, 128, (1, 16))
    for _ in range(3):
        outputs = model(input_ids=ids, labels=ids)   # the HF course's loop
        loss = outputs.loss
        loss.backward(); opt.step(); opt.zero_grad()
""")


def test_cli_measure_prints_the_loop_and_the_flags_to_match(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    est = tmp_path / "est.json"
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
                               "hidden_size": 32, "intermediate_size": 64,
                               "num_hidden_layers": 1, "num_attention_heads": 2,
                               "num_key_value_heads": 1, "vocab_size": 128,
                               "max_position_embeddings": 64}))
    run = [sys.executable, "-m", "memplan"]
    r = subprocess.run(run + ["estimate", str(cfg), "--device", "cpu", "--precision", "32-true",
                              "--micro-batch", "1", "--seq-len", "16", "--format", "json"],
                       capture_output=True, text=True, check=True)
    est.write_text(r.stdout)
    r = subprocess.run(run + ["measure", "--out", str(tmp_path / "m"), "--against", str(est),
                              "--", sys.executable, str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert ("loop seen: outputs kept; zero_grad after-step (set_to_none=True); optimizer AdamW "
            "foreach") in r.stdout
    assert "--outputs kept" in r.stdout and "--optimizer-impl foreach" in r.stdout
    saved = json.loads((tmp_path / "m" / "memplan-measure.json").read_text())
    assert saved["loop"]["outputs"] == "kept"
