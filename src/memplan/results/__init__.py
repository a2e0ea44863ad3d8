"""The result types every producer fills, below all of them: nothing here imports estimate,
host, timing, trace or measure. ``Breakdown`` (``memplan.breakdown``) carries these."""

from .host import MOMENTS, HostEstimate, HostLine, NvmeEstimate
from .info import AllocatorCounters, DeviceInfo, ModelInfo
from .time import RESOURCES, ResourceTime, StagePhases, TimeEstimate
from .traffic import Traffic

__all__ = ["AllocatorCounters", "DeviceInfo", "HostEstimate", "HostLine", "ModelInfo",
           "MOMENTS", "NvmeEstimate", "RESOURCES", "ResourceTime", "StagePhases",
           "TimeEstimate", "Traffic"]
