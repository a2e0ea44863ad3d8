"""``PlanResult`` and ``SizeResult`` -> rich tables (formatting only, no computing)."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..plan import Evaluated, PlanResult
from ..units import fmt_bytes

__all__ = ["render_plan", "recipe_summary"]

_SHORT = {"micro_batch": "mb", "grad_accum": "ga", "checkpointing": "ckpt",
          "attention": "attn", "sequence_parallel": "sp", "pp_virtual": "vpp",
          "hybrid_shard": "hsdp"}


def recipe_summary(e: Evaluated) -> str:
    """The searched keys of a candidate in one short line (defaults left out)."""
    d = e.recipe.to_dict()
    parts = [f"{d['engine']}", f"zero{d['zero']}"]
    if d["hybrid_shard"]:
        parts.append(f"hsdp{d['hybrid_shard']}")
    if d["offload"] != "none":
        parts.append(f"off={d['offload']}")
    for k in ("tp", "pp", "cp", "ep"):
        if d[k] > 1:
            parts.append(f"{k}{d[k]}")
    if d["sequence_parallel"]:
        parts.append("sp")
    if d["pp_virtual"] > 1:
        parts.append(f"vpp{d['pp_virtual']}")
    parts.append(f"mb{d['micro_batch']}x{d['grad_accum']}")
    parts.append(f"ckpt={d['checkpointing']}")
    parts.append(str(d["attention"]))
    parts.append(f"loss={d['loss']}")
    return " ".join(parts)


def _opt_bytes(n: int | None) -> str:
    return "-" if n is None else fmt_bytes(n)


def _rows_table(title: str, rows: list[Evaluated]) -> Table:
    t = Table(title=title, title_justify="left")
    for col, just in (("#", "right"), ("plan", "left"), ("tokens/s", "right"),
                      ("step", "right"), ("MFU", "right"), ("bottleneck", "left"),
                      ("GPU peak", "right"), ("headroom", "right"), ("host RAM/node", "right"),
                      ("NVMe/node", "right")):
        t.add_column(col, justify=just, no_wrap=col == "plan")  # type: ignore[arg-type]
    for i, e in enumerate(rows, 1):
        t.add_row(str(i), recipe_summary(e),
                  "-" if e.tokens_per_second is None else f"{e.tokens_per_second:,.0f}",
                  "-" if e.step_seconds is None else f"{e.step_seconds:.2f} s",
                  "-" if e.mfu is None else f"{e.mfu:.1%}", e.bottleneck or "-",
                  fmt_bytes(e.peak_bytes), fmt_bytes(e.headroom_bytes),
                  _opt_bytes(e.host_bytes), _opt_bytes(e.nvme_bytes))
    return t


def render_plan(res: PlanResult, top: int = 10, rejected: int = 8) -> Any:
    """The top plans, the Pareto front and the rejected families."""
    best = res.ranked
    head = Text(f"{res.model_id} on {res.cluster.describe()}; global batch "
                f"{res.global_batch if res.global_batch is not None else 'as given'} sequences. "
                f"{res.candidates_evaluated} candidates evaluated in {res.seconds:.2f} s, "
                f"{len(best)} fit.")
    parts: list[Any] = [head]
    parts += [Text(f"note: {n}", style="dim") for n in res.notes]
    parts.append(_rows_table(f"Top {min(top, len(best))} plans by estimated tokens/s",
                             best[:top]))
    parts.append(_rows_table("Pareto front: GPU headroom against speed", res.pareto))
    rej = res.rejected
    if rej:
        t = Table(title=f"Rejected families ({len(rej)}; least overflowing first)",
                  title_justify="left")
        for col in ("family", "overflows (its least-overflowing candidate)", "nearest change that fits"):
            t.add_column(col)
        for r in rej[:rejected]:
            fam = recipe_summary(r.closest).split(" mb")[0]
            over = "; ".join(f"{w} by {fmt_bytes(n)}" for w, n in r.closest.overflows())
            change = ", ".join(f"{k} {a}->{b}" for k, (a, b) in r.change().items()) or "-"
            t.add_row(fam, over, change)
        parts.append(t)
    return Group(*parts)
