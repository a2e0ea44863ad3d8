"""Host RAM per node, one small pure function per category. Bytes are ints; every function
states its formula and source (constants in ``host.toml``, facts in
../shared/facts/host-and-overheads.md §2).
"""

from __future__ import annotations

import math

from ..facts.constants import constant
from ..recipe.host import HostSetup

__all__ = ["next_pow2", "pinned_bytes", "process_baseline", "loading_bytes", "offload_buffers",
           "cpu_optimizer_temp_bytes", "dataloader_bytes", "checkpoint_save_bytes",
           "nvme_swap_buffer_bytes"]


def next_pow2(n: int) -> int:
    """Smallest power of two >= ``n`` (0 stays 0)."""
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


def pinned_bytes(buffers: list[int], rounding: bool = True) -> int:
    """Host bytes that pinned ``buffers`` occupy: PyTorch's CachingHostAllocator rounds each
    allocation up to the next power of two (pytorch/pytorch#95823: 8.1 GB pinned -> ~16 GB;
    #150517: 129.5 MB -> 256 MB). ``rounding=False`` models ``pinned_max_round_threshold_mb``."""
    return sum(next_pow2(b) if rounding else b for b in buffers)


def process_baseline(local_ranks: int) -> int:
    """Python + torch + CUDA libraries per rank x local ranks: 2.06 GB max RSS of a torch + CUDA
    process (pytorch/pytorch#113326; facts §2.8 gives 0.5-2.5 GB)."""
    return local_ranks * int(constant("process_baseline_cuda_bytes"))


def loading_bytes(mode: str, *, local_ranks: int, weights_bytes: int, model_shards: int,
                  unit_bytes: int, init_copy: bool) -> int:
    """Host RAM of one node while the pretrained checkpoint is read.

    - ``full``: every local rank holds the whole model: ``local x copies x W``;
    - ``rank0``: only rank 0 does (FSDP ``sync_module_states``, accelerate
      ``cpu_ram_efficient_loading``): ``copies x W`` on the first node;
    - ``sharded``: each rank reads its shard: ``local x copies x W / model_shards``;
    - ``meta``: meta init, one unit streamed at a time: ``local x unit``.

    ``copies`` = 2 with ``init_copy`` (random init + state dict: "two copies", HF big-models
    docs; DeepSpeedExamples#498 8 x 60 GB; pytorch/pytorch#105840 8 x 160 GB), else 1
    (``low_cpu_mem_usage``: "not more than 1x model size", transformers PR #16621).
    """
    copies = 2 if init_copy else 1
    if mode == "full":
        return local_ranks * copies * weights_bytes
    if mode == "rank0":
        return copies * weights_bytes
    if mode == "sharded":
        return local_ranks * copies * math.ceil(weights_bytes / model_shards)
    return local_ranks * unit_bytes


def offload_buffers(per_rank_bytes: int, buffer_bytes: int) -> list[int]:
    """Split a rank's offloaded bytes into the allocations DeepSpeed pins: flat buffers of at
    most one ``sub_group_size`` (1e9 elements; ``buffer_bytes`` = that x element size)."""
    if per_rank_bytes <= 0:
        return []
    full, rest = divmod(per_rank_bytes, buffer_bytes)
    return [buffer_bytes] * full + ([rest] if rest else [])


def cpu_optimizer_temp_bytes(impl: str, largest_param_elements: int, rank_elements: int) -> int:
    """Transient host bytes of one rank's CPU optimizer step, by the Adam that steps it
    (``recipe.engine.host_adam``):

    - ``for-loop`` (torch's CPU default, ``torch/optim/adam.py::_single_tensor_adam``):
      ``denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)``, two fp32 temporaries
      the size of the largest parameter (shard) alive at once;
    - ``foreach`` (``_multi_tensor_adam``): ``exp_avg_sq_sqrt = torch._foreach_sqrt(
      exp_avg_sqs)``, an fp32 copy of every state tensor of the rank (``rank_elements``); two
      before torch 2.1 (``foreach-torch2.0``, pytorch/pytorch#97712);
    - ``fused`` (``torch._fused_adamw_``) and ``deepspeed`` (``DeepSpeedCPUAdam.step`` calls
      ``ds_opt_adam.adam_update`` on ``p.data``, ``p.grad.data``, ``exp_avg``, ``exp_avg_sq``;
      deepspeed/ops/adam/cpu_adam.py @edaa722): in place, none."""
    if impl == "for-loop":
        return 2 * 4 * largest_param_elements
    if impl.startswith("foreach"):
        return (2 if impl == "foreach-torch2.0" else 1) * 4 * rank_elements
    return 0


def dataloader_bytes(setup: HostSetup, micro_batch: int, seq_len: int) -> dict[str, int]:
    """Host RAM of one rank's input pipeline, by part:

    - ``workers``: ``num_workers x`` forked-worker baseline (12 MiB measured here, host.toml);
    - ``batches``: ``max(1, workers x prefetch) x batch`` in flight (DataLoader docstring:
      "2 * num_workers batches prefetched across all workers"), batch = micro_batch x seq_len x
      24 B (3 int64 tensors); ``pin_memory`` adds a pinned copy of each, power-of-two rounded;
    - ``dataset``: 0 for mmap (page cache, reclaimable; HF Datasets "RAM memory used: 9 MB"),
      ``dataset_bytes`` for in-RAM arrays (shared with forked workers), ``dataset_bytes x
      (1 + workers)`` for Python objects (copy-on-read, pytorch/pytorch#13246);
    - ``tokenize``: raw text of the prefetched samples (4 B per token, OpenAI's ~4 chars/token).
    """
    per_token = setup.sample_bytes_per_token or int(constant("batch_bytes_per_token"))
    batch = micro_batch * seq_len * per_token
    in_flight = max(1, setup.workers * setup.prefetch)
    pinned = in_flight * next_pow2(batch) if setup.pin_memory else 0
    if setup.dataset == "mmap":
        dataset = 0
    elif setup.dataset == "in-ram":
        dataset = setup.dataset_bytes
    else:
        dataset = setup.dataset_bytes * (1 + setup.workers)
    text = (in_flight * micro_batch * seq_len * int(constant("text_bytes_per_token"))
            if setup.tokenize else 0)
    return {"workers": setup.workers * int(constant("dataloader_worker_baseline_bytes")),
            "batches": in_flight * batch + pinned, "dataset": dataset, "tokenize": text}


def checkpoint_save_bytes(setup: HostSetup, *, local_ranks: int, state_bytes: int,
                          shards: int, largest_tensor_bytes: int) -> int:
    """Host RAM of one node while a checkpoint is written (``state_bytes`` = the full training
    state, ``shards`` = ranks it is split over):

    - ``full-rank0``: the gathered state on rank 0's host (FSDP ``FullStateDictConfig(
      offload_to_cpu=True, rank0_only=True)``, pytorch/pytorch PR #75908);
    - ``full-all-ranks``: on every rank: ``local x state`` (facebookresearch/fairscale#844);
    - ``sharded``: each rank copies one tensor at a time to the host (``local x largest``);
      with ``async_save`` it stages its whole shard (``local x state / shards``, DCP
      ``async_save``; pytorch/pytorch#118520 shows the full-size trap).
    """
    if setup.checkpoint == "none":
        return 0
    if setup.checkpoint == "full-rank0":
        return state_bytes
    if setup.checkpoint == "full-all-ranks":
        return local_ranks * state_bytes
    if setup.async_save:
        return local_ranks * math.ceil(state_bytes / shards)
    return local_ranks * largest_tensor_bytes


def nvme_swap_buffer_bytes(*, params_on_nvme: bool, sub_group_elements: int) -> int:
    """Pinned host buffers one rank needs for ZeRO-Infinity NVMe offload (DeepSpeed defaults,
    offload_config.py; facts §2.3): optimizer swap ``buffer_count (4) x one sub-group (<=
    1e9 elements) x 4 B``; with parameters on NVMe also ``buffer_count (5) x buffer_size (1e8)
    x 2 B`` plus ``max_in_cpu (1e9) x 2 B`` kept in CPU. Each buffer is pinned and rounded."""
    opt = int(constant("ds_optimizer_swap_buffer_count")) * [sub_group_elements * 4]
    total = pinned_bytes(opt)
    if params_on_nvme:
        total += pinned_bytes(int(constant("ds_param_swap_buffer_count"))
                              * [int(constant("ds_param_swap_buffer_elements")) * 2])
        total += int(constant("ds_param_max_in_cpu_elements")) * 2
    return total
