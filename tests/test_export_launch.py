"""The exported ds_config is launched, not only parsed: torchrun + gloo, 2 CPU ranks, ZeRO-3 of
a tiny MLP (scripts/ds_train_cpu.py), each rank's bytes counted from its tensors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from memplan.export import ExportContext, write
from memplan.model import load_model
from memplan.recipe import Recipe

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ds_train_cpu.py"


@pytest.mark.full
def test_exported_zero3_config_runs_on_two_cpu_ranks(tmp_path):
    pytest.importorskip("deepspeed", reason="pip install 'memplan[engines]'")
    recipe = Recipe.of(zero=3, gpus=2, micro_batch=2, grad_accum=2)
    ctx = ExportContext(model=load_model("meta-llama/Llama-3.1-8B"))
    (tmp_path / "ds_config.json").write_text(write(recipe, "deepspeed", ctx))
    hidden = 64
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc_per_node", "2", str(SCRIPT), "--deepspeed",
                        str(tmp_path / "ds_config.json"), "--hidden", str(hidden)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert sorted(row["rank"] for row in rows) == [0, 1]
    total = 4 * (hidden * hidden + hidden)  # four Linear(hidden, hidden)
    for row in rows:
        assert row["zero"] == 3 and row["world"] == 2
        assert row["param_elements"] == total
        assert row["param_bytes"] == 2 * total // 2           # bf16, one half per rank
        # Adam's two fp32 states on this rank's half (+ the fp32 step scalar)
        assert 0 <= row["optimizer_state_bytes"] - 2 * 4 * total // 2 <= 8
