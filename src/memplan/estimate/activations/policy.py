"""Activation-checkpointing policies as the engines define them: which layers are checkpointed,
which ops inside a layer keep their outputs, and where a checkpoint's inputs live.

=================  ===========================================================================
recipe             engine and source
=================  ===========================================================================
``selective``      Megatron-Core 0.16.1 ``--recompute-granularity selective``: the modules of
                   ``recompute_modules``, default ``["core_attn"]``
                   (``megatron/core/transformer/transformer_config.py``, ``__post_init__``):
                   the attention core (scores, softmax, dropout, ``@ v``, or the fused kernel)
                   is recomputed, its inputs q, k, v kept (Korthikanti et al. 2022, arXiv
                   2205.05198, §5).
``op``             torchtitan 0.2.0 ``selective_ac_option = "op"``
                   (``torchtitan/distributed/activation_checkpoint.py``, ``_apply_op_sac``):
                   each block is checkpointed with ``create_selective_checkpoint_contexts``;
                   outputs of the ops of ``_op_sac_save_list``
                   (``torchtitan/models/llama3/infra/parallelize.py``: ``aten.mm``,
                   ``_scaled_dot_product_flash_attention``, ``_..._efficient_attention``,
                   ``reduce_scatter_tensor``, ``max``) are saved, "except every second mm"
                   (the 2nd, 4th, ... ``mm`` of the block); the MoE router's ``mm`` is
                   always recomputed and not counted
                   (``per_op_sac_force_recompute_mm_shapes_by_fqns = ["moe.router.gate"]``).
``full``           each checkpointed layer keeps only its input: HF
                   ``gradient_checkpointing_enable`` (``GradientCheckpointingLayer``),
                   torchtitan ``mode = "full"``, Megatron ``full`` with ``uniform`` and 1 layer.
``checkpoint_      torchtitan ``selective_ac_option = k`` (``_apply_layer_sac``): a counter
every = k``        over blocks, starting at 1; a block is wrapped when ``count % k == 0``:
                   layers k-1, 2k-1, ... (0-based) of the stage.
``checkpoint_      Megatron ``--recompute-method block --recompute-num-layers N``: "only a set
layers = N``       number of transformer layers per pipeline stage" (the first N).
``partition_       DeepSpeed 0.19.8 ``runtime/activation_checkpointing/checkpointing.py``
activations``      (``partition_activations``; Megatron-Core's ``distribute_saved_activations``,
                   refused with sequence parallelism): each floating-point checkpoint input is cut
                   to ``numel / mp_size`` and cloned (``get_partition_size``); the full
                   tensor is all-gathered again before the recompute.
``cpu_             DeepSpeed ``cpu_checkpointing``: the (partitioned) inputs are copied to
checkpointing``    ``torch.device('cpu')`` (``copy_to_device`` / ``partition.cpu()``) and
                   back for the recompute: no device bytes, host bytes instead.
=================  ===========================================================================

Known limitations: ``op`` counts one ``mm`` per linear as Hugging Face code runs it (a linear
with a bias is ``addmm``, not in the save list: recomputed); MoE expert linears count as one
``mm`` per role, where HF loops over experts; LoRA adapters' small ``mm`` s are not counted.
On CPU, SDPA runs ``_scaled_dot_product_flash_attention_for_cpu``, which is not in the save
list: ``op`` recomputes it there (``device = cpu``), as the real policy does.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...recipe import Checkpointing

__all__ = ["Policy", "policy_of", "host_checkpoint_bytes"]


@dataclass(frozen=True, slots=True)
class Policy:
    """What the activation simulator needs of ``Recipe.checkpointing`` (hashable: a memo
    key)."""

    kind: str = "none"
    """``none``, ``selective``, ``op``, ``full``."""
    every: int = 1
    """``full``: one layer in ``every`` is checkpointed (torchtitan layer SAC)."""
    layers: int = 0
    """``full``: only the first ``layers`` layers of the stage (0: all; Megatron block)."""
    stash: float | None = None
    """``full`` under DeepSpeed: the fraction of a checkpoint's inputs kept on the device
    (1/tp partitioned, 0 on the host); None: the inputs themselves are held (torch)."""

    def layer_checkpointed(self, j: int) -> bool:
        """Whether the stage's ``j``-th layer (0-based, within the stage) is one checkpoint."""
        if self.kind != "full":
            return False
        if self.layers:
            return j < self.layers
        return (j + 1) % self.every == 0

    @property
    def period(self) -> int:
        """Layers after which the policy repeats within a stage (``compose.py`` composes a stage
        from short simulations per unit of this many layers); 0 when it never repeats (the first
        ``layers`` layers)."""
        return 0 if self.layers else self.every

    @property
    def selective(self) -> bool:
        return self.kind == "selective"

    @property
    def per_op(self) -> bool:
        return self.kind == "op"


def policy_of(c: Checkpointing, tp: int, sequence_parallel: bool) -> Policy:
    """The ``Policy`` of a recipe's checkpointing on ``tp`` tensor-parallel ranks.

    DeepSpeed's partition divides by ``mp_size`` (the tensor-parallel group it is given); under
    Megatron sequence parallelism the layer input is already split over those ranks, so it is
    kept as it is."""
    stash: float | None = None
    if c.kind == "full":
        if c.cpu_checkpointing:
            stash = 0.0
        elif c.partition_activations and tp > 1 and not sequence_parallel:
            stash = 1.0 / tp
    return Policy(kind=str(c.kind), every=c.checkpoint_every, layers=c.checkpoint_layers,
                  stash=stash)


def host_checkpoint_bytes(c: Checkpointing, layers: int, input_bytes: int, tp: int,
                          inflight: float) -> int:
    """Host RAM per rank of DeepSpeed ``cpu_checkpointing``: one input per checkpointed layer
    of the stage (``input_bytes``, split over ``tp`` under ``partition_activations``), for
    every micro-batch the stage holds in flight:
    ``checkpointed layers x input bytes / (tp if partitioned) x inflight``."""
    if c.kind != "full" or not c.cpu_checkpointing:
        return 0
    policy = policy_of(c, tp, False)
    n = sum(1 for j in range(layers) if policy.layer_checkpointed(j))
    split = tp if c.partition_activations else 1
    return int(n * (input_bytes // split) * inflight)
