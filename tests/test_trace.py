"""memplan.trace: real model code under FakeTensorMode, compared with real CPU runs."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from memplan import Recipe  # noqa: E402
from memplan.breakdown import Category, Step  # noqa: E402
from memplan.errors import TraceError  # noqa: E402
from memplan.hardware import cpu_device  # noqa: E402
from memplan.measure.real import measure_recipe  # noqa: E402
from memplan.runtime.steps import module_table  # noqa: E402
from memplan.trace import trace  # noqa: E402
from memplan.units import GIB  # noqa: E402
from memplan.validate import cases  # noqa: E402

CPU = cpu_device(16 * GIB)
QUICK = [c for c in cases(quick=True) if not c.no_trace]  # MoE routing cannot be faked
IN_CI = {"llama fp32 adamw", "llama bf16-mixed adamw ckpt", "llama lora r8 bf16-mixed",
         "qwen2 bf16-true adamw", "gemma2 fp32 adamw eager", "bert-mlm fp32 adamw",
         "deepseek-v3 mla fp32 adamw", "trainer llama bf16-mixed ckpt", "t5 fp32 adamw eager",
         "llama bf16-mixed op", "loop llama bf16-mixed grad_accum 2 (short)"}
"""One case per mechanism the trace must reproduce (fp32 / autocast / bf16-true, checkpointing
and torchtitan's op policy, LoRA, eager attention, encoder, encoder-decoder, MLA, the HF Trainer,
the user's loop); the other cases (more architectures and PEFT methods, each a real run plus a
trace) are ``full`` (validation/full_tests.md)."""


@pytest.mark.parametrize("case", [pytest.param(c, marks=() if c.name in IN_CI else pytest.mark.full)
                                  for c in QUICK], ids=[c.name for c in QUICK])
def test_trace_equals_a_real_cpu_run_moment_by_moment(case):
    """The trace's timeline is the real run's: every moment, every category, to the byte."""
    real = measure_recipe(case.model, case.recipe, CPU).worst
    fake = trace(case.model, case.recipe, CPU).worst
    assert [m.label for m in fake.moments] == [m.label for m in real.moments]
    for r, f in zip(real.moments, fake.moments, strict=True):
        assert f.allocated_bytes == r.allocated_bytes, (r.step, r.label)
        assert f.categories() == r.categories(), (r.step, r.label)
    assert fake.peak_moment.label == real.peak_moment.label
    assert {(i.name, i.category): i.bytes for i in fake.items} == \
        {(i.name, i.category): i.bytes for i in real.items}


def test_trace_timeline_has_layers_steps_and_module_owners():
    case = QUICK[0]  # llama fp32 adamw
    b = trace(case.model, case.recipe, CPU)
    rank = b.worst
    labels = [m.label for m in rank.moments if m.step == Step.STEADY]
    for i in (0, 1):
        assert f"forward: model.layers.{i}" in labels
        assert f"backward: model.layers.{i}" in labels
    assert labels[-1] == "optimizer-step"
    # AdamW states appear in the first step's optimizer phase only.
    assert rank.phase_moment("forward", Step.FIRST).categories()[Category.OPTIMIZER] == 0
    assert rank.phase_moment("forward", Step.STEADY).categories()[Category.OPTIMIZER] > 0
    rows = {r["module"]: r for r in module_table(rank.peak_moment)}
    assert rows["model.layers.0"]["params"] == rows["model.layers.1"]["params"] > 0
    assert sum(r["total"] for r in rows.values()) == rank.peak_allocated_bytes
    assert b.source == "trace" and b.model.params == 557696


def test_trace_of_a_catalog_model_uses_no_real_memory():
    """Qwen2.5-0.5B at 4 x 1024 (about 20 GiB of tensors) traces in a few seconds."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.process_time()  # CPU seconds: the wall clock depends on the machine's other jobs
    b = trace("Qwen/Qwen2.5-0.5B", Recipe.of(device="cpu", micro_batch=4, seq_len=1024), CPU)
    assert time.process_time() - t0 < 60
    rank = b.worst
    assert rank.peak_allocated_bytes > 10 * GIB
    assert b.model.params == 494032768  # the catalog's exact count
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    assert grown < 1 * GIB


def test_bad_recipes_are_refused_with_every_reason():
    with pytest.raises(TraceError) as e:
        trace("Qwen/Qwen2.5-0.5B", Recipe.of(device="cpu", gpus=2, zero=2,
                                          optimizer="adamw-8bit"), CPU)
    msg = str(e.value)
    assert "gpus=2" in msg and "zero=2" in msg and "adamw-8bit" in msg


def test_cuda_trace_needs_a_cuda_build_of_torch():
    if torch.backends.cuda.is_built():
        pytest.skip("this torch has CUDA: the refusal path does not apply (and a fake-CUDA "
                    "trace is exercised on GPU machines)")
    with pytest.raises(TraceError, match="CUDA build of torch"):
        trace("Qwen/Qwen2.5-0.5B", Recipe.of(seq_len=64), CPU)


@pytest.mark.skipif(not torch.backends.cuda.is_built(),
                    reason="fake CUDA tensors need a CUDA build of torch (this one is CPU-only)")
def test_cuda_trace_runs_without_touching_gpu_memory():
    from memplan import get_device

    b = trace("Qwen/Qwen2.5-0.5B", Recipe.of(seq_len=256), get_device("H100-80GB"))
    assert b.worst.peak_allocated_bytes > 0
    assert any(i.name == "CUDA context" for i in b.worst.outside)


def test_cli_trace_json_and_errors():
    """The JSON through a real ``python -m memplan`` process; the table and the refusal through
    the same entry point in this process (each process of its own imports torch again)."""
    from typer.testing import CliRunner

    from memplan.cli import app

    case = QUICK[0]
    args = ["trace", case.model, "--device", "cpu", "--precision", "32-true", "--micro-batch", "2",
            "--seq-len", "128"]
    out = subprocess.run([sys.executable, "-m", "memplan", *args, "--format", "json"],
                         capture_output=True, text=True, check=True)
    data = json.loads(out.stdout)
    assert data["source"] == "trace"
    assert data["gpu"]["peak_allocated_bytes"] == sum(r["total"] for r in data["modules_at_peak"])
    runner = CliRunner()
    table = runner.invoke(app, args)
    assert table.exit_code == 0, table.output
    assert "by module at the peak" in table.output and "model.layers.0" in table.output
    bad = runner.invoke(app, [*args, "--optimizer", "lion"])
    assert bad.exit_code == 2, bad.output
    assert bad.exception is None or isinstance(bad.exception, SystemExit)
    assert "optimizer=lion" in bad.output and "Traceback" not in bad.output


def test_adafactor_is_refused_by_the_tracer_only():
    with pytest.raises(TraceError, match="adafactor"):
        trace(QUICK[0].model, Recipe.of(device="cpu", optimizer="adafactor", seq_len=16), CPU)
    real = measure_recipe(QUICK[0].model, Recipe.of(device="cpu", optimizer="adafactor",
                                                 precision="32-true", seq_len=16), CPU)
    assert real.worst.peak_allocated_bytes > 0
