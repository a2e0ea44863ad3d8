"""Capture ``memplan estimate ... --format json`` for a fixed set of varied cases.

The cases span five model families, every precision, LoRA / QLoRA / freeze, ZeRO 0-3,
TP / SP / PP / CP / EP, offload, host RAM and step time. The output is the golden snapshot
``tests/golden/data/estimate_snapshot.json`` that ``tests/golden/test_estimate_snapshot.py``
compares with the current code, byte for byte: a refactor must not move a number.

Run ``python scripts/estimate_snapshot.py`` to rewrite the snapshot (only when a change of
output is intended, and say which in the commit message).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SNAPSHOT = Path(__file__).resolve().parents[1] / "tests/golden/data/estimate_snapshot.json"

L1 = "meta-llama/Llama-3.2-1B"
L8 = "meta-llama/Llama-3.1-8B"
L70 = "meta-llama/Llama-3.1-70B"
Q7 = "Qwen/Qwen2.5-7B"
Q30 = "Qwen/Qwen3-30B-A3B"
G2 = "google/gemma-2-2b"
G3 = "google/gemma-3-4b-pt"
GPT2 = "openai-community/gpt2-xl"
NEOX = "EleutherAI/gpt-neox-20b"
DSV2 = "deepseek-ai/DeepSeek-V2-Lite"
DSV3 = "deepseek-ai/DeepSeek-V3"
MIX = "mistralai/Mixtral-8x7B-v0.1"
PHI = "microsoft/Phi-3-mini-4k-instruct"
OLMO = "allenai/OLMo-2-1124-7B"
BERT = "google-bert/bert-base-uncased"

CASES: dict[str, list[str]] = {
    "llama1b-default": [L1],
    "llama1b-32true-eager": [L1, "--precision", "32-true", "--attention", "eager"],
    "llama1b-16mixed-a100": [L1, "--precision", "16-mixed", "--gpu", "A100-80GB"],
    "llama1b-bf16true-mb8": [L1, "--precision", "bf16-true", "--micro-batch", "8",
                             "--seq-len", "4096"],
    "llama1b-16true-sgd": [L1, "--precision", "16-true", "--optimizer", "sgd-momentum"],
    "llama8b-fp8-zero3": [L8, "--precision", "fp8-mixed", "--gpus", "8", "--zero", "3"],
    "llama8b-lora": [L8, "--method", "lora", "--lora-rank", "64",
                     "--lora-targets", "q,v", "--checkpointing", "full"],
    "llama8b-qlora-nf4dq": [L8, "--method", "qlora", "--quant", "nf4-dq",
                            "--optimizer", "paged-adamw-8bit", "--gpu", "A100-40GB"],
    "llama8b-qlora-int8": [L8, "--method", "qlora", "--quant", "int8", "--gpu", "L4-24GB"],
    "llama8b-freeze": [L8, "--method", "freeze", "--precision", "bf16-true"],
    "llama8b-zero1": [L8, "--gpus", "8", "--zero", "1", "--optimizer", "adam"],
    "llama8b-zero2-selective": [L8, "--gpus", "8", "--zero", "2",
                                "--checkpointing", "selective"],
    "llama8b-zero3-offload-opt": [L8, "--gpus", "8", "--zero", "3", "--offload", "optimizer"],
    "llama8b-zero3-offload-params": [L8, "--gpus", "8", "--zero", "3",
                                     "--offload", "params+optimizer", "--node", "DGX-H100"],
    "llama8b-zero3-nvme": [L8, "--gpus", "8", "--zero", "3", "--offload", "nvme",
                           "--nvme", "30.72TB", "--host-ram", "1TiB"],
    "llama8b-zero3-hybrid": [L8, "--gpus", "16", "--gpus-per-node", "8", "--zero", "3",
                             "--recipe", "@hybrid_shard = 8\nzero = 3\ngpus = 16"],
    "llama8b-adafactor-loss-chunked": [L8, "--optimizer", "adafactor", "--loss", "chunked",
                                       "--seq-len", "8192"],
    "llama8b-lion-fused-loss": [L8, "--optimizer", "lion", "--loss", "fused",
                                "--expandable-segments"],
    "llama8b-adamw8bit-grad-fp32": [L8, "--optimizer", "adamw-8bit", "--precision", "bf16-true",
                                    "--recipe", '@grad_dtype = "fp32"'],
    "llama8b-cpu": [L8, "--device", "cpu", "--precision", "32-true"],
    "llama70b-tp-sp-pp": [L70, "--gpus", "64", "--tp", "8", "--sequence-parallel", "--pp", "4",
                          "--zero", "1", "--checkpointing", "full", "--seq-len", "4096",
                          "--micro-batch", "2", "--grad-accum", "16", "--node", "p5.48xlarge"],
    "llama70b-pp-virtual": [L70, "--gpus", "32", "--tp", "4", "--pp", "8", "--pp-virtual", "2",
                            "--grad-accum", "8", "--attention", "flash"],
    "llama70b-cp": [L70, "--gpus", "32", "--tp", "8", "--cp", "4", "--seq-len", "32768",
                    "--zero", "1", "--checkpointing", "full"],
    "llama8b-host-knobs": [L8, "--gpus", "8", "--zero", "3", "--node", "DGX-A100-80GB",
                           "--load", "rank0", "--workers", "8", "--prefetch", "4", "--pcie", "4"],
    "qwen7b-lora-all": [Q7, "--method", "lora", "--lora-targets", "all-linear",
                        "--micro-batch", "4"],
    "qwen3-moe-ep": [Q30, "--gpus", "16", "--ep", "8", "--zero", "1",
                     "--checkpointing", "full"],
    "qwen3-moe-capacity": [Q30, "--gpus", "8", "--ep", "8", "--zero", "3",
                           "--moe-capacity-factor", "1.25"],
    "gemma2-eager": [G2, "--attention", "eager", "--micro-batch", "2"],
    "gemma3-bf16true": [G3, "--precision", "bf16-true", "--seq-len", "8192"],
    "gpt2xl-32true": [GPT2, "--precision", "32-true", "--micro-batch", "4", "--seq-len", "1024"],
    "gpt2xl-16mixed-v100": [GPT2, "--precision", "16-mixed", "--gpu", "V100-32GB",
                            "--seq-len", "1024"],
    "neox20b-zero3": [NEOX, "--gpus", "8", "--zero", "3", "--checkpointing", "full"],
    "dsv2lite-mla": [DSV2, "--gpus", "8", "--ep", "8", "--zero", "2"],
    "dsv3-big": [DSV3, "--gpus", "1024", "--tp", "8", "--pp", "16", "--ep", "8", "--zero", "1",
                 "--precision", "fp8-mixed", "--checkpointing", "full"],
    "mixtral-lora": [MIX, "--method", "lora", "--precision", "bf16-true", "--gpus", "2",
                     "--ep", "2"],
    "phi3-freeze": [PHI, "--method", "freeze", "--recipe", "@freeze_trainable_layers = 4"],
    "llama1b-lora-bf16-adapters": [L1, "--method", "lora", "--recipe",
                                   '@adapter_dtype = "bf16"\nlora_alpha = 8'],
    "llama8b-host-table": [L8, "--gpus", "8", "--zero", "3", "--offload", "optimizer",
                           "--recipe", '@micro_batch = 2\n[host]\ndataset = "in-ram"\n'
                           'dataset_bytes = 20000000000\ncheckpoint = "full-rank0"\n'
                           'async_save = false\npinned = false\nmatmul_efficiency = 0.7'],
    "olmo2-sdpa": [OLMO, "--micro-batch", "2", "--gpus", "4", "--zero", "2"],
    "bert-base": [BERT, "--precision", "32-true", "--seq-len", "512", "--micro-batch", "32"],
}


def run_case(args: list[str]) -> dict:
    """The JSON of ``memplan estimate ARGS --format json`` (in-process, typer's runner). An
    argument ``@text`` is written to a temporary recipe TOML and replaced by its path."""
    import tempfile

    from typer.testing import CliRunner

    from memplan.cli import app

    with tempfile.TemporaryDirectory() as tmp:
        argv = []
        for a in args:
            if a.startswith("@"):
                path = Path(tmp) / "recipe.toml"
                path.write_text(a[1:] + "\n")
                a = str(path)
            argv.append(a)
        r = CliRunner().invoke(app, ["estimate", *argv, "--format", "json"])
    if r.exit_code != 0:
        raise RuntimeError(f"memplan estimate {' '.join(args)} exited {r.exit_code}: "
                           f"{r.output}{r.exception!r}")
    return json.loads(r.stdout)


def snapshot() -> dict[str, dict]:
    return {name: {"args": args, "json": run_case(args)} for name, args in CASES.items()}


def main() -> None:
    data = snapshot()
    SNAPSHOT.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    sys.stdout.write(f"{len(data)} cases -> {SNAPSHOT}\n")


if __name__ == "__main__":
    main()
