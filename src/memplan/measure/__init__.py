"""Measuring real training steps (imports torch; import explicitly: ``import memplan.measure``).

``measure_step`` counts, exactly, the bytes of live tensor storages during real PyTorch
training steps, per phase and per category; see ``memplan.measure.live``.
"""

from .live import CATEGORIES, PHASES, StepMeasurement, measure_step

__all__ = ["CATEGORIES", "PHASES", "StepMeasurement", "measure_step"]
