"""``PlanResult`` and ``SizeResult`` -> rich tables (formatting only, no computing)."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..plan import Evaluated, PlanResult
from ..units import fmt_bytes

__all__ = ["render_plan", "render_size", "recipe_summary"]

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
    every = f"/{d['checkpoint_every']}" if d.get("checkpoint_every", 1) != 1 else ""
    first = f":{d['checkpoint_layers']}" if d.get("checkpoint_layers") else ""
    parts.append(f"ckpt={d['checkpointing']}{every}{first}")
    parts.append(str(d["attention"]))
    parts.append(f"loss={d['loss']}")
    if d["optimizer_impl"] != "auto":
        parts.append(f"{d['optimizer']}={d['optimizer_impl']}")
    return " ".join(parts)


def _opt_bytes(n: int | None) -> str:
    return "-" if n is None else fmt_bytes(n)


def _numbers(e: Evaluated) -> tuple[object, ...]:
    return (e.tokens_per_second, e.peak_bytes, e.host_bytes, e.nvme_bytes, e.step_seconds)


def _merged(rows: list[Evaluated], top: int) -> list[tuple[Evaluated, list[str]]]:
    """The first ``top`` rows with distinct numbers; a row whose every number equals the one
    shown before it is folded into it as the keys it changes (``attention=flash``)."""
    out: list[tuple[Evaluated, list[str]]] = []
    for e in rows:
        if out and _numbers(out[-1][0]) == _numbers(e):
            a, b = out[-1][0].recipe.to_dict(), e.recipe.to_dict()
            diff = ",".join(f"{k}={b[k]}" for k in a if k not in ("notes",) and a[k] != b[k])
            out[-1][1].append(diff)
            continue
        if len(out) == top:
            break
        out.append((e, []))
    return out


def _folded(same: list[str]) -> str:
    """The rows folded into one (the title says: equal numbers): the variant itself when there
    is one, else how many and which keys they change (a long list would squeeze the number
    columns)."""
    if not same:
        return ""
    if len(same) == 1:
        return f" (same numbers: {same[0]})"
    keys = sorted({part.split("=")[0] for d in same for part in d.split(",")})
    return f" (+{len(same)} folded: other {', '.join(keys)})"


def _rows_table(title: str, rows: list[Evaluated], top: int | None = None) -> Table:
    t = Table(title=title, title_justify="left")
    for col, just in (("#", "right"), ("plan", "left"), ("tokens/s", "right"),
                      ("step", "right"), ("MFU", "right"), ("bottleneck", "left"),
                      ("GPU peak", "right"), ("headroom", "right"), ("host RAM/node", "right"),
                      ("NVMe/node", "right")):
        t.add_column(col, justify=just, no_wrap=True)  # type: ignore[arg-type]
    for i, (e, same) in enumerate(_merged(rows, top or len(rows)), 1):
        name = recipe_summary(e) + _folded(same)
        t.add_row(str(i), name,
                  "-" if e.tokens_per_second is None else f"{e.tokens_per_second:,.0f}",
                  "-" if e.step_seconds is None else f"{e.step_seconds:.2f} s",
                  "-" if e.mfu is None else f"{e.mfu:.1%}", e.bottleneck or "-",
                  fmt_bytes(e.peak_bytes), fmt_bytes(e.headroom_bytes),
                  _opt_bytes(e.host_bytes), _opt_bytes(e.nvme_bytes))
    return t


def render_plan(res: PlanResult, top: int = 10, rejected: int = 8) -> Any:
    """The top plans, the Pareto front and the rejected families."""
    best = res.ranked
    batch = (f"global batch {res.global_batch} sequences" if res.global_batch is not None
             else "micro-batch x accumulation held as given")
    head = Text(f"{res.model_id} on {res.cluster.describe()}; {batch}. "
                f"{res.candidates_evaluated} candidates evaluated in {res.seconds:.2f} s, "
                f"{len(best)} fit.")
    parts: list[Any] = [head]
    parts += [Text(f"note: {n}", style="dim") for n in res.notes]
    parts.append(_rows_table(f"Top {min(top, len(best))} plans by estimated tokens/s "
                             "(plans with equal numbers folded into one row)", best, top))
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


def _needs_table(res: Any, n: dict[str, Any], title: str) -> Table:
    from ..plan.size import ram_rules

    t = Table(title=title, title_justify="left")
    t.add_column("per node")
    t.add_column("bytes", justify="right")
    t.add_column("RAM : GPU memory", justify="right")
    t.add_column("what")
    t.add_row("host RAM, fastest plan", _opt_bytes(n["host_bytes_per_node"]),
              f"{n['ram_to_gpu_ratio']:.2f}x",
              f"peak during {n['best'].host_peak_moment}: {recipe_summary(n['best'])}")
    t.add_row("host RAM, least of any fitting plan", _opt_bytes(n["least_host_bytes_per_node"]),
              f"{n['least_ram_to_gpu_ratio']:.2f}x",
              f"peak during {n['least_host'].host_peak_moment}: "
              f"{recipe_summary(n['least_host'])}")
    t.add_row("NVMe, fastest plan", _opt_bytes(n["nvme_bytes_per_node"]), "", "")
    t.add_row("GPU memory of the job's GPUs on one node", fmt_bytes(n["gpu_memory_per_node_bytes"]), "1x", "")
    for rule in ram_rules():
        t.add_row(rule["name"], "", f"{rule['ratio']:.1f}x", rule["source"])
    return t


def render_size(res: Any) -> Any:
    """``SizeResult`` -> the smallest cluster, what its nodes need, and the speed target."""
    fit = res.fit
    c = fit.cluster
    probed = ", ".join(f"{g} ({k} fit)" for g, k in res.tried)
    parts: list[Any] = [Text(
        f"{res.model_id}: smallest cluster that fits is {c.gpus} x {c.gpu} ({c.nodes} node(s)"
        f"{' of ' + c.node if c.node else ''}). Probed GPUs: {probed}. "
        f"{res.seconds:.1f} s.")]
    n = res.needs(fit)
    parts.append(_rows_table(f"Fastest plans on {c.gpus} GPUs", fit.ranked, 5))
    parts.append(_needs_table(fit, n, f"What each node needs on {c.gpus} GPUs"))
    if res.speed is not None:
        s = res.speed
        best = s.ranked[0]
        parts.append(Text(
            f"For {res.target_tokens_per_second:,.0f} tokens/s: {s.cluster.gpus} x {c.gpu} "
            f"({s.cluster.nodes} node(s)); fastest plan {best.tokens_per_second:,.0f} tokens/s."))
        parts.append(_rows_table(f"Fastest plans on {s.cluster.gpus} GPUs", s.ranked, 5))
        parts.append(_needs_table(s, res.needs(s), f"What each node needs on {s.cluster.gpus} GPUs"))
    return Group(*parts)
