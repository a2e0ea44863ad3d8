"""Issue #15 section 4, defaults and output that mislead: trace's default device on a CPU-only
torch, progress on a terminal only, help that keeps ``[host]`` and its option names at 80
columns, ``--version``, the summary line first and ``--quiet``, public sources only. All run
in-process through the CLI entry point."""

from __future__ import annotations

import io
import json
import re

import pytest
from typer.testing import CliRunner

from memplan.cli import app
from memplan.validate import _tiny

runner = CliRunner()
LLAMA = "meta-llama/Llama-3.1-8B"
CPU_ONLY = pytest.mark.skipif(
    pytest.importorskip("torch").backends.cuda.is_built(),
    reason="the fallback is for a torch built without CUDA; this one has CUDA")


def _ok(*args: str, env: dict[str, str] | None = None):
    r = runner.invoke(app, list(args), env=env)
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise AssertionError(f"traceback for {args!r}") from r.exception
    assert r.exit_code == 0, r.output
    return r


# ---- trace on the CPU torch the README installs --------------------------------------------

@CPU_ONLY
def test_trace_default_device_works_on_cpu_torch_and_says_so():
    r = _ok("trace", _tiny("llama"), "--format", "json")
    out = json.loads(r.stdout)
    assert out["gpu"]["name"] == "H100-80GB"
    assert any("traced with CPU kernels" in n for n in out["model"]["notes"])
    assert out["recipe"]["device"] == "cpu"


@CPU_ONLY
def test_trace_explicit_cuda_still_refused_with_the_fix():
    r = runner.invoke(app, ["trace", _tiny("llama"), "--device", "cuda"])
    assert r.exit_code == 2
    assert "leave --device out" in " ".join(r.output.split())


def test_trace_moe_gives_the_real_reason_not_a_cuda_error():
    r = runner.invoke(app, ["trace", _tiny("mixtral")])
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())
    assert "MoE routing" in text and "CUDA build" not in text


# ---- progress: only on a terminal, only on stderr --------------------------------------------

def test_progress_off_a_terminal_prints_nothing(capsys):
    from memplan.cli_options import progress

    with progress("working") as say:
        say("still working")
    assert capsys.readouterr() == ("", "")


def test_progress_on_a_terminal_draws_on_stderr(monkeypatch):
    from rich.console import Console

    import memplan.cli_options as opts

    screen = io.StringIO()
    monkeypatch.setattr(opts, "stderr_console",
                        lambda: Console(file=screen, force_terminal=True, width=80))
    with opts.progress("tracing x: importing torch") as say:
        say("tracing x: two training steps")
    assert "tracing x" in screen.getvalue()


def test_trace_json_stdout_stays_clean():
    r = _ok("trace", _tiny("gpt2"), "--device", "cpu", "--format", "json")
    json.loads(r.stdout)  # nothing but the JSON document on stdout
