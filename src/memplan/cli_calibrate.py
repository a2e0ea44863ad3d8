"""The ``memplan calibrate`` subcommand (registered by ``cli.py``): time this device, write a
calibration file for ``estimate --calibration FILE``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

__all__ = ["calibrate_command"]

Opt = typer.Option


def calibrate_command(
    model: Annotated[str, typer.Argument(help="Model whose GEMM shapes are timed (HF id from "
                                              "the catalog, or a config.json).")],
    gpu: Annotated[str, Opt(help="Catalog GPU the rates stand for, e.g. H100-80GB; estimate "
                                 "accepts the file only for this GPU.")],
    out: Annotated[Path, Opt(help="Calibration TOML to write.")],
    device: Annotated[str, Opt(help="torch device to time: cuda | cpu.")] = "cuda",
    dtype: Annotated[str, Opt(help="bf16 | fp16 | fp32.")] = "bf16",
    tokens: Annotated[int, Opt(help="Rows of each GEMM (micro_batch x seq_len).")] = 8192,
    seq_len: Annotated[int, Opt(help="Sequence length of the attention benchmark.")] = 4096,
    copy_mib: Annotated[int, Opt(help="Size of the HBM, host-copy and all-reduce buffers, "
                                      "MiB.")] = 1024,
    repeats: Annotated[int, Opt(help="Timed runs per benchmark (median).")] = 5,
) -> None:
    """Time GEMMs of MODEL's real shapes, attention, HBM bandwidth, host-device copies and
    (under torchrun) all-reduce on this machine; write --out for `estimate --calibration`."""
    from .cli_options import guard as _guard
    from .errors import ConfigError
    from .hardware import get_device
    from .model import load_model

    def run() -> None:
        problems = []
        if device not in ("cuda", "cpu"):
            problems.append(f"--device {device!r} must be cuda or cpu.")
        if dtype not in ("bf16", "fp16", "fp32"):
            problems.append(f"--dtype {dtype!r} must be bf16, fp16 or fp32.")
        for name, v in (("tokens", tokens), ("seq-len", seq_len), ("copy-mib", copy_mib),
                        ("repeats", repeats)):
            if v < 1:
                problems.append(f"--{name} {v} must be >= 1.")
        if problems:
            raise ConfigError(problems)
        get_device(gpu)   # unknown names fail here, with suggestions
        spec = load_model(model)
        try:
            from .calibrate import calibrate
        except ImportError as e:
            raise ConfigError([f"calibrate needs torch ({e}); pip install 'memplan[hf]'."]) from e
        cal = calibrate(spec, gpu, device=device, dtype=dtype, tokens=tokens, seq_len=seq_len,
                        copy_bytes=copy_mib << 20, repeats=repeats)
        rank = int(__import__("os").environ.get("RANK", "0"))
        if rank == 0:
            out.write_text(cal.to_toml())
            sys.stdout.write(cal.to_toml())

    _guard(run)
