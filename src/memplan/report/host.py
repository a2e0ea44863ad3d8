"""Table sections for the host side and the clock (issue #5): host RAM per node, NVMe and
step time. Formatting only: every number comes from ``Breakdown.host/.nvme/.time``."""

from __future__ import annotations

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from ..breakdown import Breakdown
from ..host.plan import RULE_OF_THUMB
from ..results import MOMENTS, HostLine
from ..units import fmt_bytes

__all__ = ["host_sections"]

_SHORT = {"load": "load", "steady step": "step", "checkpoint save": "save"}


def _verdict(fits: bool | None, need: int, capacity: int | None,
             other_loads: tuple[tuple[str, int], ...] = ()) -> Text:
    if fits is None:
        return Text("unknown capacity (give --node, --host-ram or --nvme)", style="yellow")
    word = Text("fits", style="bold green") if fits else Text("does NOT fit", style="bold red")
    assert capacity is not None
    return Text.assemble(word, f"  (need {fmt_bytes(need)}, have {fmt_bytes(capacity)}, "
                               f"headroom {fmt_bytes(capacity - need)})",
                         (cheaper_load_hint(other_loads, capacity), "bold"))


def cheaper_load_hint(other_loads: tuple[tuple[str, int], ...], capacity: int | None) -> str:
    """'; fits with --load meta (1.31 TiB) or --load sharded (1.31 TiB)' (or 'still does not
    fit with ...' when none does); '' without cheaper modes."""
    if not other_loads or capacity is None:
        return ""
    fit = [(m, b) for m, b in other_loads if b <= capacity]
    shown = fit or other_loads[:1]
    modes = " or ".join(f"--load {m} ({fmt_bytes(b)})" for m, b in shown)
    return f"; fits with {modes}" if fit else f"; still does not fit with {modes}"


def _lines_table(title: str, lines: tuple[HostLine, ...]) -> Table:
    t = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    t.add_column("category", no_wrap=True)
    t.add_column("bytes", justify="right", no_wrap=True)
    t.add_column("held", no_wrap=True)
    t.add_column("formula / source", ratio=1, style="dim")
    for line in lines:
        held = "all" if len(line.moments) == len(MOMENTS) else "+".join(
            _SHORT[m] for m in line.moments)
        t.add_row(line.name, fmt_bytes(line.bytes), held, line.formula)
    return t


def host_sections(b: Breakdown) -> list[RenderableType]:
    """Host RAM, NVMe and step-time sections ([] when the breakdown has none)."""
    out: list[RenderableType] = []
    h = b.host
    if h is not None:
        out += [_lines_table(f"host RAM per node ({h.node}: {h.local_ranks} ranks per node, "
                             f"{h.nodes} node{'s' if h.nodes != 1 else ''})", h.lines)]
        moments = "  ".join(f"{m}: {fmt_bytes(v)}" for m, v in h.moments.items())
        out += [Text(f"  by moment  {moments}"),
                Text(f"  peak       {fmt_bytes(h.per_node_peak_bytes)} during {h.peak_moment}"),
                Text.assemble("  verdict    ", _verdict(h.fits, h.per_node_peak_bytes,
                                                        h.capacity_bytes, h.other_loads)),
                Text(f"  ratio      this run needs {h.ram_to_gpu_ratio:.2f}x the node's GPU "
                     f"memory ({fmt_bytes(h.gpu_memory_per_node_bytes)}) in host RAM; "
                     f"{RULE_OF_THUMB}")]
        out += [Text(f"  note: {n}", style="dim") for n in h.notes] + [Text("")]
    n = b.nvme
    if n is not None:
        if n.lines:
            out.append(_lines_table("local NVMe per node", n.lines))
        out += [Text.assemble("  NVMe       ", _verdict(n.fits, n.bytes, n.capacity_bytes)),
                Text("")]
    t = b.time
    if t is not None:
        tab = Table(title="step time (one optimizer step, one rank)", title_justify="left",
                    show_edge=False, pad_edge=False)
        for col, just in (("resource", "left"), ("busy", "right"), ("exposed", "right"),
                          ("what / overlap", "left")):
            tab.add_column(col, justify=just, no_wrap=col != "what / overlap")  # type: ignore[arg-type]
        lo, hi = t.tokens_per_second_range
        for r in t.resources:
            tab.add_row(r.name, f"{r.seconds:.3f} s", f"{r.exposed_seconds:.3f} s", r.detail)
        out += [tab,
                Text(f"  step {t.step_seconds:.3f} s   {t.tokens_per_second:,.0f} tokens/s "
                     f"({lo:,.0f}-{hi:,.0f})   {t.tokens_per_second_per_gpu:,.0f} per GPU   "
                     f"MFU {t.mfu:.1%}   HFU {t.hfu:.1%}"),
                Text(f"  range: validation's errors on published rows, {t.error_min:+.0%} to "
                     f"{t.error_max:+.0%} (README 'Step time')", style="dim"),
                Text.assemble("  GPU idle   ", (f"{t.gpu_idle_fraction:.0%}", "bold"),
                              "   bottleneck: ", (t.bottleneck, "bold"))]
        out += _time_axis(b)
        out += [Text(f"  assumes: {a}", style="dim") for a in t.assumptions]
        out += [Text(f"  note: {x}", style="yellow") for x in t.notes]
    elif h is not None:
        out.append(Text("step time: the GPU catalog has no dense peak for this compute dtype on "
                        f"{b.device.name}; not predicted.", style="yellow"))
    return out


def _time_axis(b: Breakdown) -> list[Text]:
    """Where the worst rank's drawn micro-batch and its peak sit on the step's time axis
    (``timing/schedule.py``), when the estimate has one."""
    t = b.time
    if t is None or len(t.stages) != len(b.ranks):
        return []
    p = t.stages[b.ranks.index(b.worst)]
    fwd_end = p.forward_start + p.forward_seconds
    peak = b.worst.peak_moment
    at = (f"; peak at {peak.seconds:.3g} s ({peak.label}, {peak.step} step)"
          if peak.seconds is not None else "")
    return [Text(f"  time axis  last micro-batch: forward {p.forward_start:.3g}-{fwd_end:.3g} s, "
                 f"backward to {fwd_end + p.backward_seconds:.3g} s, serial tail "
                 f"{p.tail_start:.3g}-{t.step_seconds:.3g} s{at}")]
