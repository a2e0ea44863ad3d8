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


# ---- help ------------------------------------------------------------------------------------

def _help(*cmd: str) -> str:
    return _ok(*cmd, "--help", env={"COLUMNS": "80"}).stdout


def test_help_keeps_host_in_brackets():
    assert "([host] in TOML)" in " ".join(_help("estimate").split())


@pytest.mark.parametrize("cmd", ["estimate", "trace", "plan", "size", "measure", "validate"])
def test_help_option_names_whole_at_80_columns(cmd):
    text = _help(cmd)
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    names = set(re.findall(r"--[a-z0-9][a-z0-9-]*", text))
    if cmd == "estimate":  # the longest names, whole
        assert {"--stage3-param-persistence-threshold", "--no-contiguous-gradients",
                "--offload-pin-memory"} <= names


def test_estimate_help_shows_defaults():
    text = " ".join(_help("estimate").split())
    for shown in ("--seq-len <int> Tokens per sequence. (default: 2048)",
                  "(default: bf16-mixed)", "[default: table]"):
        assert shown in text, shown


def test_version():
    import memplan

    assert _ok("--version").stdout == f"memplan {memplan.__version__}\n"


# ---- the verdict first, --quiet ---------------------------------------------------------------

def test_summary_line_comes_first():
    first = _ok("estimate", LLAMA, env={"COLUMNS": "250"}).stdout.splitlines()[0]
    assert first.startswith(f"{LLAMA} on 1x H100-80GB: GPU does NOT fit (")
    assert "host RAM unknown" in first and "tokens/s" in first


def test_quiet_is_one_line():
    out = _ok("estimate", "openai-community/gpt2", "--quiet").stdout
    assert out.count("\n") == 1
    assert out.startswith("openai-community/gpt2 on 1x H100-80GB: GPU fits (")


def test_quiet_with_json_refused():
    r = runner.invoke(app, ["estimate", "openai-community/gpt2", "--quiet", "--format", "json"])
    assert r.exit_code == 2 and "give one of them" in " ".join(r.output.split())


def test_recipe_line_shows_pp_virtual():
    out = " ".join(_ok("estimate", "meta-llama/Llama-3.1-70B", "--gpus", "16", "--pp", "4",
                       "--pp-virtual", "2", "--grad-accum", "8").stdout.split())
    assert "pp=4, pp-virtual=2" in out


# ---- host-RAM verdict names the cheaper load mode ----------------------------------------------

HOST_70B = ("estimate", "meta-llama/Llama-3.1-70B", "--gpus", "8", "--zero", "3", "--offload",
            "optimizer", "--node", "DGX-H100")


def test_host_verdict_names_the_cheaper_load_mode():
    data = json.loads(_ok(*HOST_70B, "--format", "json").stdout)["host"]
    assert data["fits"] is False
    cheaper = data["other_loads"]
    assert set(cheaper) == {"meta", "rank0", "sharded"}
    assert all(b < data["per_node_peak_bytes"] for b in cheaper.values())
    assert all(b <= data["capacity_bytes"] for b in cheaper.values())
    # the same job with --load meta is what the hint promised
    meta = json.loads(_ok(*HOST_70B, "--load", "meta", "--format", "json").stdout)["host"]
    assert meta["fits"] is True and meta["per_node_peak_bytes"] == cheaper["meta"]
    assert meta["other_loads"] == {}
    line = _ok(*HOST_70B, "--quiet").stdout
    assert "host RAM does NOT fit (2.07 TiB of 2.00 TiB per node; fits with --load meta (" in line


# ---- public sources only ----------------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ("estimate", LLAMA), ("estimate", LLAMA, "--format", "json"), HOST_70B,
    ("gpus", "--format", "json"), ("nodes", "--format", "json"),
])
def test_output_cites_no_private_notes(args):
    out = _ok(*args, env={"COLUMNS": "250"}).stdout
    for private in ("facts §", "facts \\u00a7", "host-and-overheads.md", "/work/"):
        assert private not in out, private
