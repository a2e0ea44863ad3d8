"""Pipeline stages for the step time: what one rank of each stage holds and does, and how the
stages' times make the step (issue #19).

A 1F1B pipeline of ``p`` stages and ``m`` micro-batches, where stage ``j`` spends ``c_j`` per
micro-batch (forward + backward), takes

    m x c_max + (sum_j c_j - c_max) / v

on its slowest stage: that stage works ``m x c_max``, and waits for the other stages' forward
of the first micro-batch before it (fill) and their backward of the last one after it (drain).
With ``v`` model chunks per rank (interleaved 1F1B) each fill/drain hop is a chunk, ``1/v`` of
a stage. For even stages this is Narayanan et al. 2021 (arXiv 2104.04473) §2.2's bubble,
``(p - 1) / (m v)`` of the ideal time; an uneven split (Megatron
``--decoder-first/last-pipeline-num-layers``, the head on the last stage) is set by its slowest
stage, as the same schedule analysis gives (every stage runs the same micro-batch sequence, so
a stage can go no faster than the slowest one feeds or drains it).

**Known limitations**: forward and backward are not timed apart (the fill uses forward and the
drain backward time; their sum is what is charged); the embedding lookup is memory-bound work
in the op graph of the first stage, not a GEMM.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..results import Traffic

__all__ = ["StageLoad", "pipeline_step"]


@dataclass(frozen=True, kw_only=True, slots=True)
class StageLoad:
    """One pipeline stage as one of its ranks sees it."""

    layers: range
    """Transformer layers the stage holds (``recipe.stages.stages_of``)."""
    trainable: float
    """Trainable elements on one rank of the stage (after TP / EP splits; the embedding on the
    first stage, the output layer on the last)."""
    expert_trainable: float = 0.0
    """Part of ``trainable`` in routed experts: their gradients reduce over the expert-data-
    parallel group and ZeRO shards them over it (``Parallelism.expert_shard_degree``)."""
    traffic: Traffic | None = None
    """Memory-bound bytes and kernel launches of one micro-batch through the stage (the
    estimator's op graph); None: not known."""


def pipeline_step(own: list[float], work: list[float], micro_batches: int,
                  virtual: int = 1) -> tuple[float, int, float]:
    """(step seconds, index of the stage that sets it, its bubble seconds) of a pipeline whose
    stage ``j`` takes ``own[j]`` per step on its own and passes ``work[j]`` of per-micro-batch
    work through the schedule: ``max_j own[j] + (sum(work) - work[j]) / (micro_batches x
    virtual)`` (module docstring: the stage waits for the others' fill and drain). One stage:
    no bubble."""
    if len(own) <= 1:
        return own[0], 0, 0.0
    total = sum(work)
    bubbles = [(total - w) / (micro_batches * virtual) for w in work]
    slowest = max(range(len(own)), key=lambda j: own[j] + bubbles[j])
    return own[slowest] + bubbles[slowest], slowest, bubbles[slowest]
