"""Step-time model against published training throughput (issue #5).

Tolerance: predicted tokens/s per GPU (or model TFLOP/s per GPU) within +-35 % of the
published figure. The model has one matmul efficiency (0.81, an H100 GEMM measurement) and no
kernel-launch, framework or attention-kernel inefficiency, so it over-predicts where those
matter; it also models 1F1B without interleaving, so it over-counts pipeline bubbles of
interleaved schedules. Nothing here was fitted to these rows.

Sources:
- torchtitan A100 rows: pytorch/torchtitan docs/performance.md (commit 0413364), "Llama 3
  performance numbers" and "Llama 2 performance numbers" tables: FSDP2 on 64 A100-80GB, local
  batch size as given, sequence length 8192 (Llama 3) / 4096 (Llama 2). Node: DGX-A100-80GB
  preset (8 GPUs, 200 Gb/s per GPU) - an assumption, the doc does not name the network.
- torchtitan H100 row: same file, newer version (docs/performance.md, Table 1): Llama 3.1 8B,
  8 H100 (96 GB HBM2e, 2.4 TB/s, 500 W power limit), FSDP, local batch 2, selective AC,
  5,762 TPS/GPU; sequence length 8192 (torchtitan llama3_8b default).
- Llama 3 405B rows: Dubey et al. 2024, "The Llama 3 Herd of Models", arXiv 2407.21783,
  Table 4 (BF16, H100, 16M tokens per batch): 8,192 GPUs TP8 CP1 PP16 DP64 430 TFLOP/s/GPU;
  16,384 GPUs TP8 CP1 PP16 DP128 400; 16,384 GPUs TP8 CP16 PP16 DP8 seq 131,072 380. Micro-batch
  1 and the schedule's interleaving are not given; we model micro-batch 1, 1F1B.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from memplan import Recipe, estimate, get_device, load_model
from memplan.hardware.nodes import get_node
from memplan.host import HostSetup, node_hardware
from memplan.system import with_host_and_time

TOL = 0.35


def _time(model: str, gpu: str, node: str, device_edit: dict | None = None, **kw):
    m = load_model(model)
    r = Recipe.of(precision="bf16-mixed", gpus_per_node=8, attention="flash", **kw)
    d = get_device(gpu)
    if device_edit:
        d = replace(d, **device_edit)
    hw = node_hardware(get_device(gpu), 8, get_node(node))
    return with_host_and_time(estimate(m, r, d), m, r, d, hw, HostSetup()).time


TORCHTITAN = [
    # model, recipe, published tokens/s/GPU
    ("meta-llama/Llama-3.1-8B", dict(micro_batch=1, seq_len=8192, checkpointing="selective"), 2973),
    ("meta-llama/Llama-3.1-70B", dict(micro_batch=1, seq_len=8192, checkpointing="full"), 331),
    ("meta-llama/Llama-2-13b-hf", dict(micro_batch=2, seq_len=4096, checkpointing="none"), 2162),
    ("meta-llama/Llama-2-70b-hf", dict(micro_batch=2, seq_len=4096, checkpointing="full"), 353),
]


@pytest.mark.parametrize(("model", "kw", "published"), TORCHTITAN)
def test_torchtitan_fsdp_on_64_a100(model, kw, published):
    t = _time(model, "A100-80GB", "DGX-A100-80GB", gpus=64, zero=3, **kw)
    assert t.tokens_per_second_per_gpu == pytest.approx(published, rel=TOL)


@pytest.mark.xfail(strict=True, reason="known over-prediction (~2.3x): eager PyTorch FSDP on "
                   "H100 at a 500 W cap reaches 33-39 % MFU (torchtitan docs) while the model "
                   "assumes 81 % for every matmul and no launch/attention-kernel overhead")
def test_torchtitan_fsdp_on_8_h100():
    t = _time("meta-llama/Llama-3.1-8B", "H100-80GB", "DGX-H100", {"hbm_gb_per_s": 2400},
              gpus=8, zero=3, micro_batch=2, seq_len=8192, checkpointing="selective")
    assert t.tokens_per_second_per_gpu == pytest.approx(5762, rel=TOL)


@pytest.mark.parametrize(("gpus", "cp", "seq", "accum", "published"), [
    (8192, 1, 8192, 32, 430), (16384, 1, 8192, 16, 400), (16384, 16, 131072, 16, 380)])
def test_llama3_405b_table4(gpus, cp, seq, accum, published):
    t = _time("meta-llama/Llama-3.1-405B", "H100-80GB", "DGX-H100", gpus=gpus, tp=8, pp=16,
              cp=cp, zero=1, micro_batch=1, seq_len=seq, grad_accum=accum)
    tflops = t.model_flops_per_step / t.step_seconds / t.gpus / 1e12
    assert tflops == pytest.approx(published, rel=TOL)
