"""The clock: FLOPs of the real architecture, communication volumes, bandwidths, step time,
MFU, GPU idle time and the bottleneck. See ``step.estimate_time``."""

from .flops import TokenFlops, token_flops
from ..results import RESOURCES, ResourceTime, TimeEstimate
from .step import estimate_time

__all__ = ["RESOURCES", "ResourceTime", "TimeEstimate", "TokenFlops", "estimate_time",
           "token_flops"]
