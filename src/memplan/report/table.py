"""Rich tables for ``Breakdown``s and the catalogs."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..breakdown import Breakdown, Category, Pool, RankBreakdown, Step
from ..hardware.node_hardware import dram_gb_per_s
from ..units import fmt_bytes, fmt_count
from .host import host_sections
from .summary import summary_line

_WHERE = {Pool.ALLOCATED: "GPU", Pool.RESERVED: "GPU (slack)", Pool.DEVICE: "GPU (outside torch)",
          Pool.HOST: "host RAM", Pool.NVME: "NVMe"}
_SUFFIX = {Pool.ALLOCATED: "", Pool.RESERVED: " (allocator slack)", Pool.DEVICE: " (outside torch)",
           Pool.HOST: " -> host RAM", Pool.NVME: " -> NVMe"}

def _recipe_line(r: dict[str, Any]) -> str:
    parts = [f"{r['precision']}", f"{r['optimizer']}", f"method={r['method']}"]
    if r.get("frozen_dtype", "auto") != "auto":
        parts.append(f"frozen base {r['frozen_dtype']}")
    if r.get("grad_dtype", "auto") != "auto":
        parts.append(f"{r['grad_dtype']} gradients")
    if r["method"] in ("lora", "qlora"):
        parts.append(f"r={r['lora_rank']} on {','.join(r['lora_targets'])}")
    if r["method"] == "qlora":
        parts.append(f"base={r['quant']}")
    parts += [f"micro-batch {r['micro_batch']} x {r['seq_len']} tokens",
              f"grad-accum {r['grad_accum']}", f"{r['gpus']} GPU(s): dp={r['dp']}"]
    for k in ("tp", "pp", "cp", "ep"):
        if r[k] > 1:
            parts.append(f"{k}={r[k]}")
        if k == "pp" and r.get("pp_virtual", 1) > 1:
            parts.append(f"pp-virtual={r['pp_virtual']}")
    if r["zero"]:
        parts.append(f"ZeRO-{r['zero']}")
    if r["offload"] != "none":
        parts.append(f"offload={r['offload']}")
    if r.get("compile"):
        parts.append(f"torch.compile ({r.get('compile_scope', 'blocks')})")
    engine = r.get("engine", "auto")
    if engine == "auto" and r["gpus"] > 1:  # one GPU runs the same under every engine
        parts.append(f"engine={'deepspeed' if r['zero'] else 'ddp'} (assumed from zero="
                     f"{r['zero']}; set --engine)")
    elif engine != "auto":
        parts.append(f"engine={engine}")
    return ", ".join(parts)


def _rank_table(rank: RankBreakdown) -> Table:
    t = Table(title=f"{rank.role} ({rank.ranks} rank{'s' if rank.ranks != 1 else ''})",
              title_justify="left", show_edge=False, pad_edge=False)
    t.add_column("category", no_wrap=True)
    t.add_column("item", ratio=1)
    t.add_column("bytes", justify="right", no_wrap=True)
    order = list(Category)
    for i in sorted(rank.items, key=lambda i: (order.index(i.category), -i.bytes)):
        t.add_row(str(i.category), i.name + _SUFFIX[i.pool], fmt_bytes(i.bytes))
    for c in rank.unmodelled:
        t.add_row(str(c), Text("not modelled yet", style="yellow"), "?")
    return t


def _totals(rank: RankBreakdown, capacity: int,
            max_micro_batch: int | None = None) -> Table:
    t = Table(show_header=False, show_edge=False, pad_edge=False, box=None)
    t.add_column(justify="right")
    t.add_column()
    for step in (Step.FIRST, Step.STEADY):
        peaks = rank.phase_peaks(step)
        t.add_row(f"{step} step, peak by phase",
                  "  ".join(f"{p}: {fmt_bytes(b)}" for p, b in peaks.items()))
    if rank.load_peak_allocated_bytes:
        t.add_row("load, before step 0", fmt_bytes(rank.load_peak_allocated_bytes))
    peak = rank.peak_moment
    when = "before the first step" if peak.step == Step.INIT else f"{peak.step} step"
    t.add_row("peak allocated", f"{fmt_bytes(rank.peak_allocated_bytes)}  at {peak.label} "
              f"({when})  = torch.cuda.max_memory_allocated")
    t.add_row("peak reserved", f"{fmt_bytes(rank.peak_reserved_bytes)}  = max_memory_reserved")
    t.add_row("device total", f"{fmt_bytes(rank.device_total_bytes)}  = nvidia-smi")
    for pool in (Pool.HOST, Pool.NVME):
        if rank.off_gpu_bytes(pool):
            t.add_row(f"offloaded to {_WHERE[pool]}", fmt_bytes(rank.off_gpu_bytes(pool)))
    head = capacity - rank.device_total_bytes
    verdict = Text("fits", style="bold green") if head >= 0 else Text("does NOT fit",
                                                                       style="bold red")
    t.add_row("verdict", Text.assemble(verdict, f"  (capacity {fmt_bytes(capacity)}, headroom "
                                                f"{fmt_bytes(head)})"))
    if max_micro_batch is not None:
        t.add_row("max micro-batch", f"{max_micro_batch}  (largest that fits, all else equal)"
                  if max_micro_batch else "none fits (not even 1)")
    return t


def render_breakdown(b: Breakdown) -> RenderableType:
    """The ``memplan estimate`` table: header, per-role items, totals and verdict."""
    m, r = b.model, b.recipe
    title = Text.assemble(
        ("memplan ", "bold"), (b.source, "bold cyan"), "  ", (m.id, "bold"), " on ",
        (b.device.name, "bold"), f" ({fmt_bytes(b.capacity_bytes)})")
    lines: list[RenderableType] = [
        Text(summary_line(b), style="bold"),
        title,
        Text(f"model: {fmt_count(m.params)} params ({m.params:,}), trainable "
             f"{fmt_count(m.trainable_params)} ({m.trainable_params:,}); "
             f"{m.layers} layers; config: {m.source.split(' (')[0]}"),
        Text(f"recipe: {_recipe_line(r)}"),
        # --from FILE: what was read, the "auto" values resolved, the keys not modelled
        *[Text(f"  {n}", style="dim") for n in r.get("notes") or ()],
        Text("lines: what is allocated at the peak moment of the step", style="dim"),
        Text(""),
    ]
    shown: Iterable[RankBreakdown] = b.ranks if len(b.ranks) <= 2 else (b.ranks[0], b.worst)
    if len(b.ranks) > 2:
        lines.append(_summary(b))
        lines.append(Text(""))
    seen = set()
    for rank in shown:
        if rank.role in seen:
            continue
        seen.add(rank.role)
        lines += [_rank_table(rank), _totals(rank, b.capacity_bytes, b.max_micro_batch), Text("")]
    for note in m.notes or ():
        lines.append(Text(f"note: {note}", style="dim"))
    if any(rank.unmodelled for rank in b.ranks):
        lines.append(Text("Categories marked 'not modelled yet' are missing from the totals: "
                          "the totals are a lower bound.", style="yellow"))
    lines += host_sections(b)
    return Group(*lines)


def _summary(b: Breakdown) -> Table:
    t = Table(title="per pipeline stage", title_justify="left", show_edge=False)
    t.add_column("role")
    for c in (Category.PARAMS, Category.GRADIENTS, Category.OPTIMIZER, Category.COMMUNICATION):
        t.add_column(str(c), justify="right")
    t.add_column("peak allocated", justify="right")
    t.add_column("device total", justify="right")
    for rank in b.ranks:
        cats = rank.categories_at_peak()
        t.add_row(rank.role, *(fmt_bytes(cats[c]) for c in (Category.PARAMS, Category.GRADIENTS,
                                                            Category.OPTIMIZER,
                                                            Category.COMMUNICATION)),
                  fmt_bytes(rank.peak_allocated_bytes), fmt_bytes(rank.device_total_bytes))
    return t


def render_models(rows: list[dict[str, Any]]) -> Table:
    t = Table(title="memplan model catalog (offline)", title_justify="left")
    for col, just in (("id", "left"), ("type", "left"), ("params", "right"), ("layers", "right"),
                      ("hidden", "right"), ("vocab", "right")):
        t.add_column(col, justify=just, overflow="fold")  # type: ignore[arg-type]
    for r in rows:
        if not r.get("estimable", True):
            n = r.get("published_params")
            t.add_row(r["id"], r["model_type"], fmt_count(n) if n else "?",
                      "[yellow]not yet estimable[/]", "", "")
            continue
        t.add_row(r["id"], r["model_type"], fmt_count(r["params"]), str(r["layers"]),
                  str(r["hidden_size"]), str(r["vocab_size"]))
    return t


def render_nodes(rows: list[dict[str, Any]]) -> Table:
    t = Table(title="memplan node catalog (--node)", title_justify="left")
    for col, just in (("name", "left"), ("GPUs", "right"), ("host RAM", "right"),
                      ("CPU cores", "right"), ("sockets", "right"), ("DRAM", "right"),
                      ("PCIe", "right"), ("NVMe", "right"), ("network/GPU", "right"),
                      ("aliases", "left")):
        t.add_column(col, justify=just, no_wrap=col == "name")  # type: ignore[arg-type]

    def opt(v: Any, unit: str = "") -> str:
        return "?" if v is None else f"{v:g}{unit}"

    for r in rows:
        t.add_row(r["name"], f"{r['gpus']} x {r['gpu']}", opt(r["host_ram_gib"], " GiB"),
                  opt(r["cpu_cores"]), opt(r["cpu_sockets"]), _dram(r), opt(r["pcie_gen"]),
                  opt(r["nvme_tb"], " TB"), opt(r["network_gbit_per_gpu"], " Gb/s"),
                  ", ".join(r["aliases"]))
    return t


def _dram(r: dict[str, Any]) -> str:
    """A node's theoretical DRAM bandwidth (channels x MT/s x 8 B), or '?'."""
    ch, mt = r.get("memory_channels"), r.get("memory_mt_per_s")
    return f"{dram_gb_per_s(ch, mt):g} GB/s" if ch and mt else "?"


def render_devices(rows: list[dict[str, Any]]) -> Table:
    t = Table(title="memplan GPU catalog", title_justify="left")
    for col, just in (("name", "left"), ("memory", "right"), ("HBM GB/s", "right"),
                      ("bf16 TFLOP/s", "right"), ("interconnect", "left"), ("aliases", "left")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for r in rows:
        bf16 = r["tflops"].get("bf16")
        t.add_row(r["name"], fmt_bytes(r["capacity_bytes"]), f"{r['hbm_gb_per_s'] or '?'}",
                  f"{bf16:g}" if bf16 else "-", r["interconnect"], ", ".join(r["aliases"]))
    return t
