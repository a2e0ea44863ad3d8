"""The host side of a training job: host RAM per node by category and moment, pinned-memory
rounding, local NVMe (swap and checkpoints). See ``plan.estimate_host``."""

from ..hardware.node_hardware import NodeHardware, node_hardware, parse_size
from ..recipe.host import HostSetup
from ..results import HostEstimate, HostLine, NvmeEstimate
from .plan import RULE_OF_THUMB, estimate_host

__all__ = ["HostEstimate", "HostLine", "HostSetup", "NodeHardware", "NvmeEstimate",
           "RULE_OF_THUMB", "estimate_host", "node_hardware", "parse_size"]
