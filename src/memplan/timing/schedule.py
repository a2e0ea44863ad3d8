"""The step's time axis (issue #19, "time on the timeline"): when each moment of the memory
timeline comes, in seconds from the start of its step, on the clock of its pipeline stage.

The memory timeline draws one micro-batch, the step's last: its forward moments (embedding,
each layer, head, loss), its backward moments in reverse, then the optimizer step. On the time
axis (``stage_phases``):

- the step ends with its **serial tail**: the DP reduction the engine cannot hide, the GPU
  optimizer step, the CPU / NVMe optimizer step and the ZeRO-Offload upload (``StageTime``);
- before it runs the drawn micro-batch: the stage's forward-backward time over the step
  (its critical path, or the longest stream beside it when that is longer) divided by the
  micro-batches, split between forward and backward as the stage's kernels are: the
  forward's GEMMs, attention and memory-bound bytes (``StageTime.forward_busy``) against all
  of them; what runs beside the kernels (collectives, launches, contention) is shared out in
  the same proportion;
- before that, the earlier micro-batches and the pipeline bubble.

Inside a phase the moments are spread evenly in their order (``timed``): the layers of a
stage are alike, and the timeline has no finer clock.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..breakdown import Moment, Phase, Step
from ..recipe import Recipe
from ..results.time import StagePhases

if TYPE_CHECKING:
    from .step import Clock

__all__ = ["stage_phases", "timed"]


def stage_phases(c: Clock, recipe: Recipe) -> tuple[StagePhases, ...]:
    """One ``StagePhases`` per pipeline stage of ``c`` (module docstring)."""
    m = recipe.batch.grad_accum
    out = []
    for st in c.times:
        tail = st.dp.serial + st.optimizer_hbm + max(st.cpu, st.nvme_optimizer) + st.pcie_serial
        run = max([st.critical, *st.overlapped().values()]) - st.dp.serial - st.optimizer_hbm
        per_mb = max(run, 0.0) / m
        busy = st.busy - st.optimizer_hbm
        share = min(1.0, st.forward_busy / busy) if busy > 0 else 0.0
        tail_start = c.step - tail
        out.append(StagePhases(forward_start=tail_start - per_mb,
                               forward_seconds=share * per_mb,
                               backward_seconds=(1.0 - share) * per_mb, tail_start=tail_start))
    return tuple(out)


def timed(moments: tuple[Moment, ...], phases: StagePhases, step_seconds: float
          ) -> tuple[Moment, ...]:
    """``moments`` with ``seconds`` set for those of a training step (the load phase keeps
    None): evenly through the phase they belong to, each at its end."""
    spans = {Phase.FORWARD: (phases.forward_start, phases.forward_seconds),
             Phase.BACKWARD: (phases.forward_start + phases.forward_seconds,
                              phases.backward_seconds),
             Phase.OPTIMIZER: (phases.tail_start, step_seconds - phases.tail_start)}
    groups: dict[tuple[Step, Phase], list[int]] = {}
    for k, mo in enumerate(moments):
        if mo.phase in spans:
            groups.setdefault((mo.step, mo.phase), []).append(k)
    out = list(moments)
    for (_, phase), ks in groups.items():
        start, length = spans[phase]
        for i, k in enumerate(ks):
            out[k] = replace(moments[k], seconds=start + length * (i + 1) / len(ks))
    return tuple(out)
