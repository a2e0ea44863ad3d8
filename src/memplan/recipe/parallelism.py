"""``Parallelism``: how a job is split over GPUs (data, tensor, sequence, pipeline, context and
expert parallelism, ZeRO sharding), one part of ``Recipe``."""

from __future__ import annotations

from dataclasses import dataclass, field

from .check import check_part

__all__ = ["Parallelism"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Parallelism:
    """How the job is split over GPUs. The data-parallel size is derived:
    ``gpus / (tp * pp * cp)``."""

    gpus: int = field(default=1, metadata={"min": 1, "max": 1_000_000})
    """GPUs in the job (world size)."""
    gpus_per_node: int = field(default=0, metadata={"min": 0})
    """GPUs per node; 0 means min(gpus, 8) (or the --node preset's count)."""
    zero: int = field(default=0, metadata={"min": 0, "max": 3})
    """ZeRO stage over the data-parallel group: 0 (DDP), 1 (optimizer states sharded),
    2 (+ gradients), 3 (+ parameters; FSDP full shard)."""
    hybrid_shard: int = field(default=0, metadata={"min": 0})
    """FSDP hybrid shard / ZeRO++ hpZ: shard within groups of this many ranks (0 = all of
    DP)."""
    tp: int = field(default=1, metadata={"min": 1})
    """Tensor-parallel degree (Megatron column/row splits; must divide attention and kv
    heads)."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism: with tp > 1, norms, dropout and residual activations are
    split over the TP ranks along the sequence (Korthikanti et al. 2022, arXiv 2205.05198,
    §4.2.2)."""
    pp: int = field(default=1, metadata={"min": 1})
    """Pipeline-parallel stages."""
    pp_virtual: int = field(default=1, metadata={"min": 1})
    """Model chunks per pipeline rank (Megatron ``--num-layers-per-virtual-pipeline-stage``):
    1 is the plain 1F1B schedule, more is the interleaved schedule (smaller bubble, more
    activations in flight)."""
    pp_first_layers: int = field(default=0, metadata={"min": 0, "max": 100_000})
    """Transformer layers on the first pipeline stage (Megatron
    ``--decoder-first-pipeline-num-layers``); 0: not set. The stages without a set count
    share the other layers equally (Megatron requires that they divide)."""
    pp_last_layers: int = field(default=0, metadata={"min": 0, "max": 100_000})
    """Transformer layers on the last pipeline stage (Megatron
    ``--decoder-last-pipeline-num-layers``); 0: not set."""
    pp_split_embedding: bool = False
    """Count the embedding as one layer when the pipeline splits the layers (Megatron
    ``--account-for-embedding-in-pipeline-split``): the first stage builds one layer fewer."""
    pp_split_loss: bool = False
    """Count the output layer and loss as one layer when the pipeline splits the layers
    (Megatron ``--account-for-loss-in-pipeline-split``): the last stage builds one fewer."""
    cp: int = field(default=1, metadata={"min": 1})
    """Context-parallel degree (sequence split across ranks for attention)."""
    cp_comm_exposed: bool = False
    """The CP K/V exchange sits on the critical path instead of overlapping the attention
    kernels: Llama 3's all-gather CP (Dubey et al. 2024, arXiv 2407.21783, §3.3.2: 'the
    all-gather communication latency is exposed on the critical path'). False: the ring
    (PyTorch ``context_parallel``, Transformer Engine's p2p CP) hides it behind the blocks'
    kernels."""
    ep: int = field(default=1, metadata={"min": 1})
    """Expert-parallel degree (MoE experts split across ranks)."""
    etp: int = field(default=0, metadata={"min": 0})
    """Expert tensor-parallel degree (Megatron ``--expert-tensor-parallel-size``): each
    expert's weights split over this many ranks; 0 means tp, Megatron's default. With MoE
    parallel folding the experts' ep x etp ranks are drawn from all tp x cp x dp ranks of a
    stage, so ep need not divide dp x cp."""
    moe_capacity_factor: float = field(default=0.0, metadata={"min": 0, "max": 1024})
    """MoE expert capacity as a multiple of the balanced share ``tokens x top_k / experts``,
    inputs padded to it (GShard; Megatron ``--moe-expert-capacity-factor`` with
    ``--moe-pad-expert-input-to-capacity``). 0: dropless, every routed token once."""

    def __post_init__(self) -> None:
        check_part(self)

    @property
    def dp(self) -> int:
        """Data-parallel size: gpus / (tp * pp * cp)."""
        return max(1, self.gpus // (self.tp * self.pp * self.cp))

    @property
    def shard_degree(self) -> int:
        """Ranks over which ZeRO/FSDP shards dense states: dp*cp (Megatron shards the
        distributed optimizer over DP x CP), or the hybrid-shard group size."""
        return self.hybrid_shard or self.dp * self.cp

    @property
    def expert_tp(self) -> int:
        """The experts' tensor-parallel degree: ``etp``, or ``tp`` when it is 0."""
        return self.etp or self.tp

    def tp_of(self, experts: int) -> int:
        """The TP degree a tensor is split by: ``expert_tp`` for routed experts, else ``tp``."""
        return self.expert_tp if experts > 1 else self.tp

    @property
    def expert_shard_degree(self) -> int:
        """Ranks over which ZeRO shards expert states: the expert-data-parallel size,
        tp x cp x dp / (ep x etp) (Megatron-Core ``parallel_state``: the expert groups fold
        over the stage's ranks; dp x cp / ep when etp = tp), or the hybrid group / ep."""
        if self.hybrid_shard:
            return max(1, self.hybrid_shard // self.ep)
        return max(1, self.tp * self.dp * self.cp // (self.ep * self.expert_tp))

    @property
    def local_gpus(self) -> int:
        """GPUs on one node."""
        return self.gpus_per_node or min(self.gpus, 8)
