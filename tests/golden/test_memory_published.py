"""Golden tests: memplan's per-GPU peak memory against published measurements.

Source: ``data/published.csv``, a copy of ``../shared/ground-truth/published.csv`` (its
README, copied next to it, describes the columns, the reliability grades A/B/C and the caveats
this file follows). Every usable row becomes one
``estimate()`` call; the counter the row read decides what we compare:

==============  =======================================================================
metric          predicted quantity
==============  =======================================================================
allocated       ``peak_allocated_bytes`` (``torch.cuda.max_memory_allocated``)
active          ``peak_allocated_bytes`` (active bytes peak; same blocks, no cache)
reserved        ``peak_reserved_bytes`` (``torch.cuda.max_memory_reserved``)
nvidia-smi      ``device_total_bytes`` (reserved + CUDA context + NCCL)
unknown         the band [``peak_allocated_bytes``, ``device_total_bytes``]
==============  =======================================================================

Where a source measured its own CUDA context (hf-transformers-perf-doc, GT119: 1.31 GiB on
CUDA 11.2, which predates lazy module loading), that value replaces memplan's 400 MiB in the
nvidia-smi prediction, as README caveat 1 suggests; the rest of ``device_total_bytes`` stays.

Tolerance (README caveats 1, 8, 9), fixed before looking at the results and never per row:
``tol = rel x value + abs`` with rel = 10 % (the README's per-row noise; caveat 9) and abs =
0.25 GiB on A rows (named counter, pinned config) or 0.5 GiB on B rows (the low end of the
allocator slack of caveat 1); +7 % rel where the source does not state its unit (caveat 8).
A row passes when ``lo - tol <= value <= hi + tol``. Rows whose sequence length is only a
maximum (``seq_len_is_upper_bound = 1``, caveat 4) are checked against both ends of the stated
range: ``lo(seq_len x SEQ_LO_FRACTION) - tol <= value <= hi(seq_len) + tol``.

Rows the estimator cannot express are skipped with a recorded reason (``SKIPPED``). Rows it
expresses but gets wrong are of two kinds: ``XFAIL`` (``xfail(strict=True)``) when the cause was
measured or computed (the diagnosis says how), and ``MISSES`` when it was not: those are not
xfails, they count as failures in the accuracy table and README, and
``test_unexplained_misses_still_miss`` keeps the list from going stale.
Run this file as a script for the per-group error table of validation/ground_truth_gpu.md:
``python tests/golden/test_memory_published.py``.
"""

from __future__ import annotations

import csv
import os
import re
import statistics
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

import pytest

from memplan import Breakdown, Category, Device, Pool, Recipe, estimate, get_device, load_model
from memplan.errors import MemplanError
from memplan.model.catalog import find
from memplan.model.hf import from_hf_config
from memplan.model.spec import LORA_TARGETS, ModelSpec
from memplan.model.traits import GRAPHS
from memplan.recipe import OPTIMIZERS
from memplan.units import GIB

CSV_PATH = Path(os.environ.get(
    "MEMPLAN_GROUND_TRUTH", Path(__file__).resolve().parent / "data" / "published.csv"))
"""A copy of ``../shared/ground-truth/published.csv`` (with its README) kept in the repository,
so that CI on a clean clone runs these tests."""

REL_TOL = 0.10
"""README caveat 9: treat any single row as +-10 %."""
ABS_TOL_GIB = {"A": 0.25, "B": 0.5}
"""A: counter named and config pinned, so only small framework buffers are unaccounted;
B: the low end of the 0.5-3 GiB allocator slack of README caveat 1."""
UNIT_TOL = 0.07
"""README caveat 8: values whose unit the source does not state may be off by about 7 %."""
MEDIAN_BOUND = 0.10
"""What the estimator should reach, set before looking at the results: README caveat 9 puts
the per-row noise of the data at +-10 %. If memplan's own error were negligible, the absolute
errors would be that noise, whose median lies below its +-10 % bound. A median above 10 % means
the estimator (or rows it cannot express) dominates the error. See ``test_median_error``."""
SEQ_LO_FRACTION = 0.25
"""Lower end of the range of an upper-bound row (README caveat 4), stated before looking at the
results: the logged peak is that of the longest padded batch the run met, and we assume that
batch was at least a quarter of ``max_seq_len`` long (Alpaca's prompt template alone is about
40 tokens and each batch is padded to its longest of 2-8 samples). An assumption about the data,
not a measurement: a row that fails at this end says memplan is too high even for batches a
quarter of the stated maximum."""

MODEL_ALIASES = {
    # Same architecture as the catalog model (the arch column is checked against the spec in
    # test_arch_column_matches_catalog_model); weights differ, memory does not.
    "meta-llama/Meta-Llama-3-8B": "meta-llama/Llama-3.1-8B",
    "meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Llama-3.1-8B",
}
STAND_IN_GPU = "A100-80GB"
"""For rows whose GPU is unstated or only a VRAM class ("24GB GPU"): memplan's counters depend
on the device only through the cuBLAS workspace (8 vs 32 MiB per handle); the capacity is not
used by a peak comparison. ``test_stand_in_gpu_does_not_matter`` checks that."""
STAND_IN_CHECK = ("A100-80GB", "H100-80GB", "RTX4090-24GB")

ADAPTER_DTYPE = {
    # torchtune builds LoRA modules in the model dtype (bf16 with dtype=bf16).
    "torchtune": "bf16",
    # PEFT casts adapters to fp32 (autocast_adapter_dtype=True, the default): memplan's
    # ``auto``, which also says what an engine does to them afterwards (DeepSpeed ZeRO-1/2
    # casts them to its 16-bit dtype; facts.adapter_dtypes).
    "peft": "auto",
}


DEEPSPEED_PRECISION = {"bf16-true": "bf16-mixed", "16-true": "16-mixed"}
"""The precision of a DeepSpeed row whose table says its weights were 16-bit: DeepSpeed's
``bf16``/``fp16`` config is a 16-bit model with an fp32 master in the ZeRO optimizer
(``stage_1_and_2.py`` ``single_partition_of_fp32_groups``, ``stage3.py``
``fp32_partitioned_groups_flat``, v0.12.3 and 0.19.8), memplan's ``*-mixed`` at zero >= 1, not
``*-true`` (no master). The Qwen-1 rows: the HF Trainer's ``--bf16 True`` fills
``"bf16": {"enabled": "auto"}`` of finetune/ds_config_zero{2,3}.json (transformers
``integrations/deepspeed.py`` ``trainer_config_process``)."""

# ---- reasons a row is not compared (short, stable strings: the report counts them) ------------
R_NOT_PEAK = "not a per-GPU training peak (host RAM, calibration point, buffer size)"
R_GRADE_C = "grade C: fit/no-fit evidence only"
R_MODEL = "model not in memplan's catalog"
R_OFFLOAD = "activation / other offload"
R_HEAD_LORA = "LoRA adapters on the embedding (not in Recipe.lora_targets)"
R_UNSTATED = "settings not published (empty cell)"
R_COVERED = "covered by tests/golden/test_weights_only.py"
R_NO_TORCH = ("family without an analytic graph: its generic path (memplan.generic) needs torch "
              "and transformers, not installed here")
R_COVERED_MISS = ("covered by tests/golden/test_weights_only.py, where it is a miss (cause not "
                  "measured): -19.8%, the 1.7 GiB reserved above the modelled load phase, as GT037")


@dataclass(frozen=True, kw_only=True, slots=True)
class Case:
    """One published row as one estimate and the quantity to compare."""

    id: str
    group: str
    grade: str
    model_id: str
    """Catalog id (after ``MODEL_ALIASES``)."""
    gpu: str
    stand_in_gpu: bool
    """The row's GPU is unstated or a VRAM class; ``gpu`` is ``STAND_IN_GPU``."""
    recipe: Recipe
    metric: str
    """``allocated``, ``reserved``, ``device`` or ``band``."""
    value_gib: float
    """Per GPU (summed rows divided by num_gpus)."""
    upper_bound: bool
    """seq_len is a maximum: the estimate at seq_len bounds the measurement from above, the one
    at ``seq_lo`` from below."""
    seq_lo: int
    """Lower end of the sequence range (``SEQ_LO_FRACTION`` of seq_len); seq_len otherwise."""
    tol_rel: float
    tol_abs_gib: float


@dataclass(frozen=True, kw_only=True, slots=True)
class Skip:
    id: str
    group: str
    grade: str
    reasons: tuple[str, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class Result:
    case: Case
    lo_gib: float
    hi_gib: float
    """Predicted band (lo == hi for a named counter)."""
    floor_gib: float
    """The low edge of the band predicted at ``case.seq_lo`` (== lo_gib for fixed-length rows)."""

    @property
    def error(self) -> float:
        """Signed relative error of the prediction (positive: memplan is high). For a band, the
        distance from the value to the nearer edge (0 inside); an upper-bound row's band runs
        from the estimate at ``seq_lo`` to the one at seq_len."""
        v = self.case.value_gib
        if v < self.floor_gib:
            return (self.floor_gib - v) / v
        if v > self.hi_gib:
            return (self.hi_gib - v) / v
        return 0.0

    @property
    def tol_gib(self) -> float:
        return self.case.tol_rel * self.case.value_gib + self.case.tol_abs_gib

    @property
    def ok(self) -> bool:
        v, t = self.case.value_gib, self.tol_gib
        return self.floor_gib - t <= v <= self.hi_gib + t


# ---- the loader -------------------------------------------------------------------------------

@cache
def rows() -> tuple[dict[str, str], ...]:
    with CSV_PATH.open(newline="") as f:
        return tuple(csv.DictReader(f))


UNTIED_HEAD = "+untied-head"
"""Suffix of a catalog id whose output head is a tensor of its own although the catalog model
ties it to the embedding: litgpt fine-tunes untied. ``convert_hf_checkpoint.py`` copies
``transformer.wte.weight`` into ``lm_head.weight`` when the checkpoint has none, litgpt's
``GPT`` ties nothing, and ``finetune/lora.py`` / ``full.py`` refuse ``train.tie_embeddings``
(litgpt e7e8f7cf, 2024-09-27)."""


def _base_id(model_id: str) -> str:
    return model_id.removesuffix(UNTIED_HEAD)


@cache
def model(model_id: str) -> ModelSpec:
    """Catalog ids only (``_catalog_id``), so ``load_model`` never reaches a cache or the Hub."""
    entry = find(_base_id(model_id))
    assert entry is not None, model_id
    if model_id.endswith(UNTIED_HEAD):
        return from_hf_config({**entry.config(), "tie_word_embeddings": False}, entry.id,
                              where=f"catalog:{entry.file}", source="memplan catalog, head untied")
    return load_model(model_id)


def _catalog_id(row: dict[str, str]) -> str | None:
    mid = MODEL_ALIASES.get(row["model_id"], row["model_id"])
    entry = find(mid) if mid else None
    if entry is None:
        return None
    if row["source_group"].startswith("litgpt") and model(entry.id).tied_embeddings:
        return entry.id + UNTIED_HEAD
    return entry.id


def _family(model_id: str) -> str:
    entry = find(_base_id(model_id))
    assert entry is not None, model_id
    return entry.family


def is_generic(model_id: str) -> bool:
    """A catalog model whose family has no analytic graph (``model.traits.GRAPHS``), estimated
    through the generic path: the real transformers class on fake tensors, one step traced."""
    return _family(model_id) not in GRAPHS


@cache
def _has_torch() -> bool:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


_ROW_ESTIMATES: dict[tuple[str, Recipe, str], Breakdown] = {}


def estimate_row(model_id: str, recipe: Recipe, device: Device) -> Breakdown:
    """``estimate()`` for a catalog family with a graph, the generic path otherwise (the same
    dispatch as ``memplan estimate``, api.estimate_from_names); the allocator's slack replayed
    (``estimate/reserved.py``) where the graph gives the stream, the flat fraction otherwise.
    Kept per (model, recipe, device): the golden tests, ``scripts/underestimates.py`` and
    ``scripts/accuracy_claims.py`` ask for the same rows when they run in one process (a ``Device``
    holds a dict, so its repr is the key)."""
    key = (model_id, recipe, repr(device))
    if key not in _ROW_ESTIMATES:
        if is_generic(model_id):
            from memplan.generic import generic_estimate

            _ROW_ESTIMATES[key] = generic_estimate(model_id, _family(model_id), recipe, device)
        else:
            _ROW_ESTIMATES[key] = estimate(model(model_id), recipe, device,
                                           search_micro_batch=False, allocator="replay")
    return _ROW_ESTIMATES[key]


def _gpu(name: str) -> str | None:
    try:
        return get_device(name).name
    except MemplanError:
        return None


def _grad_accum(notes: str) -> int:
    m = re.search(r"gradient[ _]accumulation(?:_steps=| )(\d+)", notes)
    return int(m.group(1)) if m else 1


SEQ2SEQ_MAX_INPUT = re.compile(r"roughly <= (\d+) input tokens")
"""The PEFT README's 2022 encoder-decoder rows (T0_3B, mt0-xxl) publish no seq_len; their notes
give the data: ought/raft twitter_complaints tweets padded to the longest in the batch,
"roughly <= 100 input tokens and <= 4 target tokens". Such a row is read as an upper-bound row
(README caveat 4) at that maximum: memplan's T5 graph gives the decoder the encoder's length, so
the estimate at 100 tokens over-counts the 4-token decoder (the band's top) and the one at
``SEQ_LO_FRACTION`` x 100 = 25 tokens for both stacks is its bottom."""


def _seq_len(row: dict[str, str]) -> tuple[int, bool] | None:
    """(seq_len, is an upper bound) from the row, else from its notes; None when neither says."""
    if row["seq_len"]:
        return int(row["seq_len"]), row["seq_len_is_upper_bound"] == "1"
    m = SEQ2SEQ_MAX_INPUT.search(row["notes"])
    return (int(m.group(1)), True) if m else None


def _framework(group: str) -> str:
    return "torchtune" if group.startswith("torchtune") else "peft" if group.startswith(
        "peft") else group


def _reasons(row: dict[str, str]) -> list[str]:
    """Every reason the row cannot be compared (empty: usable)."""
    out = []
    q = row["quantity"]
    peak = q in ("gpu_mem_peak_per_gpu", "gpu_mem_total_all_gpus (apparently summed)",
                 "gpu_mem_nvidia_smi_after_training")
    if not peak or not row["value_gib"]:
        out.append(R_NOT_PEAK)
    if row["reliability"] == "C":
        out.append(R_GRADE_C)
    if (mid := _catalog_id(row)) is None:
        out.append(R_MODEL)
    elif is_generic(mid) and not _has_torch():
        out.append(R_NO_TORCH)
    if row["offload"] == "other" or (row["offload"] == "activations"
                                     and row["checkpointing"] != "full"):
        out.append(R_OFFLOAD)
    targets = set(row["lora_targets"].split(",")) - {""}
    if "embed" in targets or ("LoRA (emb)" in row["notes"]
                                           and not _saved_modules(row)):
        out.append(R_HEAD_LORA)
    needed = ["precision", "optimizer", "micro_batch", "checkpointing", "num_gpus",
              "zero_stage", "offload", "attention"]
    if row["method"] in ("lora", "qlora"):
        needed += ["lora_rank", "lora_targets"]
    if any(not row[k] for k in needed) or _seq_len(row) is None or row["attention"] == "unknown" or (
            row["optimizer"] not in OPTIMIZERS) or row["method"] not in ("full", "lora", "qlora"):
        out.append(R_UNSTATED)
    if row["id"] in ("GT038", "GT120"):
        out.append(R_COVERED)
    if row["id"] == "GT039":
        out.append(R_COVERED_MISS)
    return out


def _saved_modules(row: dict[str, str]) -> tuple[str, ...]:
    """PEFT ``modules_to_save`` the row trains whole: Qwen's "LoRA (emb)" rows train the
    embedding and lm_head (its finetune.py sets ``modules_to_save=["wte", "lm_head"]`` for base
    checkpoints, the row's notes)."""
    if "embedding (wte) and lm_head are FULLY trainable" in row["notes"]:
        return ("embed", "lm_head")
    return ()


def _loop(row: dict[str, str]) -> dict[str, object]:
    """The training loop a row's source ran, where it is not the HF Trainer of torch >= 2.0.

    hf-transformers-perf-doc (2022) ran the HF Trainer on torch 1.x: ``model.zero_grad()``
    had ``set_to_none=False`` as its default (torch 2.0 changed it; torch/nn/modules/module.py
    ``zero_grad``), and ``optim="adamw_hf"``, transformers' own ``AdamW``, steps one parameter
    at a time (optimization.py: ``denom = exp_avg_sq.sqrt().add_(eps)`` per parameter)."""
    if row["source_group"] != "hf-transformers-perf-doc":
        return {}
    impl = {"optimizer_impl": "for-loop"} if row["optimizer"] == "adamw" else {}
    return {"set_to_none": False, **impl}


LITGPT_GLOBAL_BATCH = {
    ("meta-llama/Llama-2-7b-hf", "full"): 64, ("meta-llama/Llama-2-7b-hf", "lora"): 8,
    ("meta-llama/Llama-2-7b-hf", "qlora"): 8,
    ("meta-llama/Meta-Llama-3-8B", "full"): 64, ("meta-llama/Meta-Llama-3-8B", "lora"): 8,
    ("meta-llama/Meta-Llama-3-8B", "qlora"): 8,
    ("mistralai/Mistral-7B-v0.1", "lora"): 8, ("mistralai/Mistral-7B-v0.1", "qlora"): 8,
    ("TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T", "full"): 32,
    ("TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T", "lora"): 8,
    ("TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T", "qlora"): 8,
    ("meta-llama/Llama-3.2-1B", "full"): 64, ("meta-llama/Llama-3.2-1B", "lora"): 8,
    ("meta-llama/Llama-3.2-1B", "qlora"): 8,
    ("meta-llama/Llama-3.2-3B", "full"): 64, ("meta-llama/Llama-3.2-3B", "lora"): 8,
    ("meta-llama/Llama-3.2-3B", "qlora"): 8,
    ("microsoft/phi-2", "full"): 8, ("microsoft/phi-2", "lora"): 8, ("microsoft/phi-2", "qlora"): 8,
}
"""``train.global_batch_size`` of litgpt's config hub (``config_hub/finetune/<model>/<method>.yaml``
at Lightning-AI/litgpt e7e8f7cf, 2024-09-27, the table's last edit), by checkpoint and method.
On one device the loop accumulates ``global_batch_size // micro_batch_size`` micro-batches per
optimizer step (``litgpt/args.py`` ``TrainArgs.gradient_accumulation_iters``; ``finetune/*.py``
``fabric.no_backward_sync`` then ``optimizer.step(); optimizer.zero_grad()``)."""


def _litgpt(row: dict[str, str]) -> dict[str, object]:
    """litgpt's loss and loop for its chunked-CE rows (``chunked_ce=1``): finetune/lora.py
    projects the head in 128-token chunks (``chunked-head``), finetune/full.py makes whole logits
    and chunks the cross-entropy (``chunked-ce``; the row's notes say which); both keep
    ``logits`` bound through the backward (``outputs="kept"``)."""
    if row["chunked_ce"] != "1":
        return {}
    if _framework(row["source_group"]) == "torchtune":  # CEWithChunkedOutputLoss
        return {"loss": "chunked"}
    head = "lm_head computed in 128-token chunks" in row["notes"]
    out: dict[str, object] = {"loss": "chunked-head" if head else "chunked-ce", "outputs": "kept"}
    if (gb := LITGPT_GLOBAL_BATCH.get((row["model_id"], row["method"]))) is not None:
        out["grad_accum"] = max(1, gb // (int(row["micro_batch"]) * int(row["num_gpus"])))
    return out


def _litgpt_adapters(row: dict[str, str]) -> dict[str, object]:
    """litgpt's adapters on its config hub LoRA / QLoRA rows, from litgpt's source:

    - built in the precision's dtype: ``finetune/lora.py`` creates the model under
      ``fabric.init_module()``, which under ``bf16-true`` makes every parameter bf16, the
      ``lora_A`` / ``lora_B`` parameters included (no fp32 upcast, unlike PEFT);
    - ``lora_dropout: 0.05`` (``config_hub/finetune/llama-2-7b/lora.yaml`` @08bf15dd, the value
      of every config hub yaml and of ``finetune/lora.py``'s default), applied once for q, k and
      v by the fused ``LoRAQKVLinear`` and once per ``LoRALinear`` (proj, MLP, head:
      ``litgpt/lora.py`` @a2bc1403)."""
    if not row["source_group"].startswith("litgpt"):
        return {}
    out: dict[str, object] = {"lora_dropout": 0.05, "lora_dropout_qkv_shared": True}
    if row["precision"] == "bf16-true":
        out["adapter_dtype"] = "bf16"
    return out


def _engine(row: dict[str, str]) -> str | None:
    """The engine the row names (its notes), None when it names none (memplan assumes).

    torchtune's 2024-04/05 distributed recipes wrap with FSDP1 ``FullyShardedDataParallel``
    (recipes/lora_finetune_distributed.py at the cited commits); FSDP2 came with torchtune 0.3."""
    notes = row["notes"]
    if int(row["zero_stage"] or 0) == 0:
        return None
    if "DeepSpeed" in notes:
        return "deepspeed"
    if "FSDP2" in notes:  # the row names it (GT022: lora_finetune_fsdp2)
        return "fsdp2"
    if "FSDP" in notes:
        return "fsdp1" if row["source_group"].startswith(("torchtune-readme-2024", "peft")) \
            else "fsdp2"
    return None


QWEN_DS_CONFIGS = {
    # QwenLM/Qwen finetune/ds_config_zero2.json at b5fad3d and e8e1596 (the profiling commits):
    # used by finetune_qlora_single_gpu.sh (--deepspeed finetune/ds_config_zero2.json) and as
    # finetune_lora_ds.sh's default DS_CONFIG_PATH.
    2: {"reduce_bucket_size": 200_000_000, "allgather_bucket_size": 200_000_000,
        "overlap_comm": True, "contiguous_gradients": True},
    # finetune/ds_config_zero3.json at the same commits (finetune_ds.sh; the README's 72B LoRA
    # row: "pass --deepspeed finetune/ds_config_zero3.json to finetune_lora_ds.sh").
    3: {"overlap_comm": True, "contiguous_gradients": True, "sub_group_size": 1_000_000_000,
        "stage3_max_live_parameters": 1_000_000_000},
}
"""DeepSpeed knobs of Qwen's own configs; memplan's defaults are DeepSpeed's (5e8 buckets, no
overlap_comm), which these rows did not use."""


def _qwen_deepspeed(row: dict[str, str]) -> dict[str, object]:
    """The ``zero_optimization`` knobs of the Qwen config a row ran (``QWEN_DS_CONFIGS``), with
    ds_config_zero3.json's ``"auto"`` entries as the HF Trainer fills them from the model's
    hidden size h: reduce_bucket_size = h*h, stage3_prefetch_bucket_size = int(0.9*h*h),
    stage3_param_persistence_threshold = 10*h (transformers integrations/deepspeed.py
    ``HfTrainerDeepSpeedConfig.trainer_config_finalize``)."""
    zero = int(row["zero_stage"] or 0)
    if row["source_group"] != "qwen-readme-profiling" or zero not in QWEN_DS_CONFIGS:
        return {}
    knobs = dict(QWEN_DS_CONFIGS[zero])
    if zero == 3:
        h = int(re.search(r"\bh=(\d+)", row["arch"]).group(1))
        knobs.update(reduce_bucket_size=h * h, stage3_prefetch_bucket_size=int(0.9 * h * h),
                     stage3_param_persistence_threshold=10 * h)
    return knobs


def _qwen_stack(row: dict[str, str], engine: str | None) -> dict[str, object]:
    """What the Qwen-1 profiling runs' software did differently from memplan's defaults (README:
    "CUDA 11.8 and Pytorch 2.0"; finetune.py runs the HF Trainer):

    - under DeepSpeed the loss runs in the logits' 16-bit dtype (``logits_upcast = none``):
      ``QWenLMHeadModel.forward`` calls ``CrossEntropyLoss()`` on ``lm_logits`` with no
      ``.float()`` (modeling_qwen.py of the Qwen-1 checkpoints), and the Trainer does not
      autocast under DeepSpeed ("deepspeed and SageMaker Model Parallel manage their own half
      precision", trainer.py ``Trainer.__init__``; accelerate sets ``native_amp`` only outside
      DeepSpeed), whose engine casts the module to 16 bits instead. Without DeepSpeed the
      Trainer's autocast runs ``log_softmax`` in fp32, memplan's default;
    - without DeepSpeed the Trainer steps ``torch.optim.AdamW`` (``optim="adamw_torch"``) with
      torch 2.0's foreach path, which holds two state-sized lists at once
      (``optimizer_impl = foreach-torch2.0``; ``estimate/optimizer_step.py``)."""
    if row["source_group"] != "qwen-readme-profiling":
        return {}
    if engine == "deepspeed":
        return {"logits_upcast": "none"}
    return {"optimizer_impl": "foreach-torch2.0"}


TORCHAO_01_GROUPS = ("torchtune-readme-2024-04", "torchtune-docs-qlora-tutorial")
"""torchtune sources whose commit pins ``torchao==0.1`` (pyproject.toml at c69fba18b and
0914d5cfb): NF4 quantised without chunks. Later torchtune rows use torchao >= 0.2 (chunked,
pytorch/ao #196, 2024-05-01)."""


TORCHTUNE_FUSED_ADAMW = ("torchtune-readme-2024-09", "torchtune-readme-flags-2024-11")
"""torchtune groups whose ``torch.optim.AdamW`` ran with ``fused: True``: pytorch/torchtune PR
#1575 (cca50f02e, 2024-09-14, "add fused = true to adam, except pagedAdam") set it in the
configs; at the cited commits 71 of 72 (30b8519e8, 2024-09-24: every llama3_1 config the
2024-09 table names) and 109 of 111 (437a8ff33, 2024-11-26) AdamW configs have it, none before
(0 of 30 at 2024-05-30). The flags table (2024-11) does not print its AdamW override of
3B_full_single_device's PagedAdamW8bit; torchtune's own AdamW configs are assumed. Fused
AdamW steps in one kernel per group: no state-sized temporaries (``optimizer_impl``)."""


def _quantizer(row: dict[str, str]) -> str:
    """The library that quantised the row's base at load time (``Recipe.quantizer``): litgpt's
    ``finetune/lora.py --quantize bnb.*`` runs Lightning's ``BitsandbytesPrecision`` with the
    bitsandbytes==0.42.0 its pyproject.toml pinned from 2024-03-15 to 2024-12-28 (litgpt
    929f9c79 / d2ed13c3), which covers the config hub table (last edit 2024-09-27)."""
    if row["source_group"].startswith("litgpt"):
        return "lightning-bnb"
    if not row["source_group"].startswith("torchtune"):
        return "bitsandbytes"  # PEFT / HF BitsAndBytesConfig, Qwen, Unsloth
    return "torchao-0.1" if row["source_group"] in TORCHAO_01_GROUPS else "torchao"


def _lora_dropout(detail: str) -> float:
    """The adapter dropout the row's source states (its ``peft_detail``: "LoRA r=64 alpha=16
    dropout 0.05" for the Qwen-1 rows, QwenLM/Qwen finetune.py ``LoraArguments.lora_dropout =
    0.05``; "dropout 0.1" for the PEFT README and docs rows, 0.05 for the QLoRA paper's); 0,
    PEFT's default, when it states none (torchtune, litgpt, Unsloth rows: not applied here)."""
    m = re.search(r"\bdropout (0?\.\d+)", detail)
    return float(m.group(1)) if m else 0.0


def _recipe(row: dict[str, str]) -> Recipe:
    method = row["method"]
    lora = method in ("lora", "qlora")
    targets = row["lora_targets"]
    kw = dict(
        precision=row["precision"], optimizer=row["optimizer"], method=method,
        micro_batch=int(row["micro_batch"]), seq_len=_seq_len(row)[0],
        grad_accum=_grad_accum(row["notes"]), checkpointing=row["checkpointing"],
        attention=row["attention"], gpus=int(row["num_gpus"]), zero=int(row["zero_stage"]),
        tp=int(row["tp"] or 1), pp=int(row["pp"] or 1), cp=int(row["cp"] or 1),
        offload="none" if row["offload"] == "activations" else row["offload"],
        # torchtune's activation offloading with checkpointing: the layer inputs on the host
        cpu_checkpointing=row["offload"] == "activations",
        # torchtune's compile: True compiles each layer and the loss (compile_scope=blocks)
        compile=row["compile"] == "1",
    )
    if lora:
        kw.update(lora_rank=int(row["lora_rank"]),
                  lora_targets=LORA_TARGETS if targets == "all-linear" else tuple(
                      targets.split(",")),
                  adapter_dtype=ADAPTER_DTYPE.get(_framework(row["source_group"]), "auto"),
                  lora_dropout=_lora_dropout(row["peft_detail"]))
    if method == "qlora":
        kw["quant"] = row["base_quant"]
        kw["quantizer"] = _quantizer(row)
    if saved := _saved_modules(row):
        kw["modules_to_save"] = saved
    kw.update(_loop(row))
    kw.update(_litgpt(row))
    if lora:
        kw.update(_litgpt_adapters(row))
    if _framework(row["source_group"]) == "torchtune" and "loss" not in kw:
        # torchtune's TransformerDecoder returns self.output(h).float() (0.6.1
        # modules/transformer.py unembed; the line of Meta's llama reference model.py it
        # started from, assumed for the earlier README commits too)
        kw["logits_upcast"] = "model"
    if row["optimizer_in_backward"] == "1":
        kw["optimizer_in_backward"] = True
    if row["source_group"] in TORCHTUNE_FUSED_ADAMW and row["optimizer"] == "adamw":
        kw["optimizer_impl"] = "fused"
    if engine := _engine(row):
        kw["engine"] = engine
        if engine == "deepspeed":
            kw.update(_qwen_deepspeed(row))
            kw["precision"] = DEEPSPEED_PRECISION.get(row["precision"], row["precision"])
        if engine == "fsdp1" and row["source_group"] == "peft-docs-70b":
            # huggingface/peft examples/sft/configs/fsdp_config.yaml (c1e2a40) and
            # fsdp_config_qlora.yaml (1948110): fsdp_backward_prefetch BACKWARD_PRE,
            # fsdp_use_orig_params false (the SFTTrainer wraps with PEFT's policy)
            kw |= {"fsdp1_backward_prefetch": "backward_pre", "use_orig_params": False}
    kw.update(_qwen_stack(row, engine))
    if "model loaded in fp32" in row["notes"] and engine in ("fsdp1", "fsdp2") and (
            row["precision"].endswith("-mixed")):
        kw["frozen_dtype"] = "fp32"  # FSDP keeps the loaded dtype (DeepSpeed casts to 16-bit)
    r = Recipe.of(**kw)
    dp_shard = int(row["dp_shard"] or 1)
    if r.parallelism.zero and dp_shard != r.parallelism.shard_degree:
        r = r.with_keys(hybrid_shard=dp_shard)
    return r


def _metric(row: dict[str, str]) -> str:
    return {"allocated": "allocated", "active": "allocated", "reserved": "reserved",
            "nvidia-smi": "device"}.get(row["metric"], "band")


def load() -> tuple[list[Case], list[Skip]]:
    """Usable A/B rows as ``Case``s, every other row as a ``Skip`` with its reasons."""
    cases, skips = [], []
    for row in rows():
        reasons = _reasons(row)
        if not reasons:
            try:
                recipe = _recipe(row)
            except MemplanError as e:
                reasons = [f"Recipe rejects it: {e}"]
        if reasons:
            skips.append(Skip(id=row["id"], group=row["source_group"], grade=row["reliability"],
                              reasons=tuple(reasons)))
            continue
        gpu = _gpu(row["gpu"]) if row["gpu"] else None
        value = float(row["value_gib"])
        if row["quantity"].startswith("gpu_mem_total_all_gpus"):
            value /= int(row["num_gpus"])  # README caveat 5: a sum over the GPUs
        rel = REL_TOL + (UNIT_TOL if "unit not stated" in row["notes"] else 0.0)
        upper = _seq_len(row)[1]
        cases.append(Case(
            id=row["id"], group=row["source_group"], grade=row["reliability"],
            model_id=_catalog_id(row) or "", gpu=gpu or STAND_IN_GPU, stand_in_gpu=gpu is None,
            recipe=recipe, metric=_metric(row), value_gib=value,
            upper_bound=upper,
            seq_lo=(max(1, int(recipe.batch.seq_len * SEQ_LO_FRACTION)) if upper
                    else recipe.batch.seq_len),
            tol_rel=rel, tol_abs_gib=ABS_TOL_GIB[row["reliability"]]))
    return cases, skips


@cache
def measured_context_gib(group: str) -> float | None:
    """The CUDA context a source group measured on its own stack (README caveat 1: 1.31 GiB on
    the V100 / CUDA 11.2 of hf-transformers-perf-doc, row GT119), if it published one."""
    for row in rows():
        if row["source_group"] == group and row["quantity"] == "gpu_mem_cuda_context_only":
            return float(row["value_gib"])
    return None


def _band(case: Case, recipe: Recipe, gpu: str) -> tuple[float, float]:
    """The predicted [lo, hi] of the row's counter for one recipe."""
    b = estimate_row(case.model_id, recipe, get_device(gpu))
    r = b.worst
    alloc, reserved, total = (x / GIB for x in (
        r.peak_allocated_bytes, r.peak_reserved_bytes, r.device_total_bytes))
    context = measured_context_gib(case.group)
    if context is not None:
        # nvidia-smi = reserved + context + NCCL: swap memplan's context (lazy loading, CUDA
        # >= 11.7) for the one the same source measured on its own stack.
        ours = sum(i.bytes for i in r.outside  # the context is memplan's only DEVICE overhead
                   if i.pool is Pool.DEVICE and i.category is Category.OVERHEAD) / GIB
        total = total - ours + context
    return {"allocated": (alloc, alloc), "reserved": (reserved, reserved),
            "device": (total, total), "band": (alloc, total)}[case.metric]


def predict(case: Case, gpu: str | None = None) -> Result:
    lo, hi = _band(case, case.recipe, gpu or case.gpu)
    floor = lo
    if case.seq_lo != case.recipe.batch.seq_len:
        floor = _band(case, case.recipe.with_keys(seq_len=case.seq_lo), gpu or case.gpu)[0]
    return Result(case=case, lo_gib=lo, hi_gib=hi, floor_gib=floor)


# ---- fit / no-fit rows (README caveat 3) -----------------------------------------------------

R_UNSLOTH = "Unsloth kernels column (offloaded checkpointing, fused CE: README caveat 3)"
"""Not expressible yet: memplan has no activation offload (no Recipe field; ``offload`` covers
optimizer / parameters only). Computed, not fitted: with full checkpointing the bf16 layer inputs
alone are L x S x h x 2 B = 83.7 GiB for GT261 (Llama-3.1-8B, S 342,733) and 109.1 GiB for GT263
(Llama-3.3-70B, S 89,389), above the 80 GB card, and 14.8 GiB for GT262 (70B, S 12,106) next to
about 37 GiB of NF4 weights on a 48 GB card; the whole bf16 logits would be 81.9 / 21.4 GiB. So
these rows fit only with the layer inputs on the host (Unsloth's offloaded checkpointer keeps one
layer input, 2.61 / 1.36 GiB, on the GPU) and a chunked or fused cross-entropy."""
R_LLMC = "llm.c (exact buffers and fused classifier, no PyTorch allocator)"

R_UNSLOTH_HF = ("Unsloth README, Hugging Face + FA2 column: dtype, 4-bit type, optimizer and "
                "checkpointing not published, so no settings to estimate (a fit row checked "
                "under settings we pick could only fail on a large overestimate)")


@dataclass(frozen=True, kw_only=True, slots=True)
class FitCase:
    id: str
    group: str
    grade: str
    model_id: str
    recipe: Recipe
    gpu: str
    """Catalog device the estimate runs on (``STAND_IN_GPU`` for a bare VRAM class)."""
    capacity_gib: float | None
    """The VRAM class of the row ("24GB GPU" -> 24 GiB); None: the catalog device's capacity."""
    fits: bool


def _fit_row(row: dict[str, str]) -> FitCase | list[str]:
    q = row["quantity"]
    boundary = q.startswith(("max_seq_len_that_fits", "max_batch_that_fits", "fits_in"))
    if not (boundary or row["oom"] == "1"):
        return []
    reasons = []
    if "Unsloth column" in row["notes"]:
        reasons.append(R_UNSLOTH)
    elif row["source_group"] == "unsloth-readme-context":
        reasons.append(R_UNSLOTH_HF)
    if row["source_group"] == "llm.c":
        reasons.append(R_LLMC)
    if (mid := _catalog_id(row)) is None:
        reasons.append(R_MODEL)
    elif is_generic(mid) and not _has_torch():
        reasons.append(R_NO_TORCH)
    if reasons:
        return reasons
    kw = {k: row[k] for k in ("precision", "base_quant", "optimizer", "checkpointing",
                              "offload")}
    if any(not v for v in kw.values()) or _seq_len(row) is None:
        return [R_UNSTATED]
    recipe = _recipe(row)
    gpu = _gpu(row["gpu"])
    return FitCase(id=row["id"], group=row["source_group"], grade=row["reliability"],
                   model_id=_catalog_id(row) or "", recipe=recipe, gpu=gpu or STAND_IN_GPU,
                   capacity_gib=None if gpu else float(row["value_gib"]),
                   fits=row["oom"] != "1")


def load_all() -> tuple[list[Case], list[FitCase], list[Skip]]:
    """Peak cases, fit cases, and every row used by neither with all its reasons."""
    cases, skips = load()
    fits, left = [], []
    for s in skips:
        row = next(r for r in rows() if r["id"] == s.id)
        got = _fit_row(row)
        if isinstance(got, FitCase):
            fits.append(got)
        else:  # a boundary / OOM row's own reasons come first
            left.append(replace(s, reasons=tuple(got) + tuple(r for r in s.reasons
                                                              if r not in got)))
    return cases, fits, left


# ---- expected failures: rows memplan expresses but gets clearly wrong --------------------------

_NF4_INIT = (
    "torchtune QLoRA with torchao 0.1: the reserved pool is set at model init, not in training "
    "(the tutorial logs 9.13 GB = 8.50 GiB reserved after init, GT039, vs 9.29 GB in "
    "training). memplan's load phase now holds it: 3.64 GiB of weights + torchao 0.1's to_nf4 of "
    "the 11008 x 4096 weight, 68 B per element = 2.86 GiB (measured on CPU, "
    "validation/load_transients.json) = 6.49 GiB allocated, 6.82 reserved with 5 % slack. The "
    "1.7 GiB left is reserved above that: likely the caching allocator splitting the freed "
    "1.34 GiB blocks for the NF4 tensors allocated next, so later quantisations need new "
    "blocks (224 of them); not measured (no GPU lent).")
_FSDP1_INIT = (
    "torchtune 2024-04 FSDP1 recipe: the published value matches memplan's UNSHARDED estimate "
    "({unsharded}). Full bf16 model per rank at init is ruled out by torch's source: FSDP1 "
    "materialises, broadcasts, flattens and shards one unit at a time (_init_utils.py); "
    "memplan's load phase models that (2 x the largest unit) and peaks at {load}, below the "
    "step. Cause unknown.")
XFAIL: dict[str, str] = {
    "GT008": "+190.8% (15.09 published, 43.89-47.01 predicted). The published number cannot "
             "hold at bs 4 x 2048 without activation checkpointing: memplan's saved activations "
             "alone exceed it. With checkpointing=full memplan gives 12.12-13.65 (-9.5%), so "
             "AC was on or the sequences were shorter (README caveat: how fixed-length inputs "
             "were produced is not published). Data, not estimator.",
    "GT011": "+87.1% (24.59 published, 46.00-49.36 predicted). Full AC at bs 4 x 4096 alone "
             "keeps 80 x 4 x 4096 x 8192 x 2 B = 20 GiB of layer inputs next to 16 GiB of "
             "sharded bf16 weights, above the published total. At seq 512 memplan gives "
             "22.79-25.00 (inside the band): the run most likely used unpacked Alpaca, not "
             "4096-token inputs. Data, not estimator.",
}
"""Row id -> measured error and a diagnosis that was measured or computed (the text says how;
validation/ground_truth_gpu.md has the long form)."""
_LITGPT_FULL = (
    "litgpt full.py on 1 A10G, bf16-true, torch AdamW: parameters, gradients and AdamW's two "
    "states are all bf16 (zeros_like), 8 B/param, so the model states alone are {states} GiB "
    "(computed: {params}e9 x 8 B, the head untied as litgpt fine-tunes it: UNTIED_HEAD), above "
    "the published {value} GiB before any activation. The "
    "source notes its 1xA10G and 4xA10G rows are often identical: the value is most likely "
    "the 4-GPU FSDP run's. Data, not estimator.")
XFAIL.update({
    "GT102": "+74.0% (8.10 published, 14.09-16.48 predicted). " + _LITGPT_FULL.format(
        states="11.16", params="1.50", value="8.10"),
    "GT105": "+119.3% (15.38 published, 33.73-35.90 predicted). " + _LITGPT_FULL.format(
        states="26.87", params="3.61", value="15.38"),
})


MISSES: dict[str, str] = {
    "GT002": "-33.4% vs the band top (19.51 published, 8.25-12.99 predicted). "
             + _FSDP1_INIT.format(unsharded="zero=0: 17.24-19.02 GiB, -2.5%",
                                  load="7.03 GiB allocated"),
    "GT005": "-17.7% vs the band top (21.33 published, 15.70-17.55 predicted at seq_len "
             "512). Same recipe generation as GT002 (FSDP1); its init is modelled (one unit at "
             "a time, load phase 3.89 GiB) and is not the cause. With engine=fsdp1 memplan counts "
             "torch AdamW's foreach sqrt(exp_avg_sq) copy over the shard (3.1 GiB, the "
             "optimizer step is the peak); it was -27.5% while every zero>=1 run was modelled "
             "as DeepSpeed FusedAdam.",
    "GT010": "-21.8% vs the band top (22.44 published, 15.71-17.55 predicted). Unexplained: "
             "the value equals GT009's (another config, 1 GPU) whose reproduction measured "
             "20.2 GB (PR #961), so possibly a copied cell; FSDP1 multi-stream allocator slack "
             "above memplan's 5 % is a candidate. The foreach AdamW copy (engine=fsdp1, see GT005) "
             "is counted but the optimizer step is not this row's peak.",
    "GT138": "-35.3% vs the band top (19.60 published, 11.20-12.68 predicted). Cause not "
             "identified. The same non-state memory is missing in GT137/GT140 (same model, "
             "bs 2 x 2048, reentrant AC); published GT140 - GT138 = 16.0 GiB matches "
             "memplan's 16.4 GiB NF4 shard, so the offload itself is modelled right.",
}
"""Rows outside tolerance whose cause was NOT measured (the text gives the error and the
candidates). They are not xfails: the accuracy table and README count them as misses, and
``test_unexplained_misses_still_miss`` fails when one starts to pass, so the list stays true."""

_QWEN_FIXED = (
    "Measured quantity, the same for every single-GPU Qwen-1 LoRA / Q-LoRA sweep at 256 "
    "tokens: published minus memplan's peak allocated is 2.0-2.5 GiB (1.8B and 7B, chat and "
    "'emb' rows alike; 14B 2.4-3.2), i.e. fixed and not proportional to the allocated bytes, "
    "while memplan adds 0.4 GiB CUDA context + 5 % reserve. Checked and ruled out (session 11, "
    "issue #11): QwenLM/Qwen holds no profiling script (no max_memory_*, nvidia-smi or pynvml "
    "call in its scripts at b5fad3d, e8e1596 or 2df8e8a), so the counter stays unknown; "
    "Qwen-1's QWenAttention registers only masked_bias (scalar) and logn_tensor (32,767 "
    "floats), no [P, P] causal-mask buffer (modeling_qwen.py, copy in alibaba/MNN@7cad2ee "
    "transformers/llm/export/llm_models/Qwen-1_8B); finetune.py at e8e1596 (the commit "
    "that published the 1.8B rows) loads with "
    "device_map='auto' and no torch_dtype, and QWenLMHeadModel casts itself to bf16 (its "
    "autoset_precision), so no fp32 copy of the weights; for GPTQ models PEFT's "
    "prepare_model_for_kbit_training skips the fp32 cast (is_gptq_quantized). Session 13: "
    "the stack's versions are pinned by QwenLM/Qwen e8e1596 (transformers==4.32.0; torch 2.0 "
    "with peft 0.5.x and auto-gptq < 0.5), and peft 0.5.0 keeps its adapters fp32 "
    "(self.to(device) only), as memplan assumes; the same team's inference table was measured "
    "as torch.cuda.max_memory_allocated() / 1024**3 printed as 'GB' (a public copy of the "
    "profile.py its README links), so the training rows may be allocated GiB too, 2.0-2.5 GiB "
    "above memplan's allocated peak for 1.8B and 7B. Candidates "
    "left, measurable as nvidia-smi minus torch.cuda.max_memory_allocated after one step on "
    "the stack of QwenLM/Qwen docker/Dockerfile at e8e1596 (torch 2.0.1, flash-attention "
    "v2.3.3 plus its csrc/layer_norm extension): the CUDA context with those kernels loaded, "
    "and the caching allocator's reserve on torch 2.0.")
_QWEN_LOW = (
    "Qwen-1 LoRA on a chat checkpoint (no DeepSpeed: the Trainer's autocast, torch 2.0 foreach "
    "AdamW, both modelled): the sweep's growth with seq_len matches (1.8B +15.10 vs +14.98 "
    "GiB from 256 to 8192) but a fixed 1.4 GiB stays above the band's nvidia-smi end (7B and "
    "14B: 1.2 GiB at 256 tokens, where torch 2.0's optimizer step is their peak). The 1.8B "
    "peak is in the backward, so the optimizer's torch 2.0 lists do not reach it. " + _QWEN_FIXED)
_QWEN_DS = (
    "Qwen-1 full fine-tuning with DeepSpeed ZeRO-3 on one GPU (finetune_ds.sh, "
    "ds_config_zero3.json): flat 43.5 for seq 256-2048, so model states and DeepSpeed buffers "
    "set it. memplan holds 16 B/param, the fp32 cast of one 1e9-element sub_group (3.7 GiB) and "
    "its flattened bf16 input (1.9 GiB, stage3.py _prepare_fp32_grad_for_sub_group) and the "
    "h*h contiguous-gradients bucket; about 8.5 GiB is still missing. The loss runs in bf16 "
    "(no autocast under DeepSpeed, Qwen-1's loss has no .float(): logits_upcast=none), so the "
    "4096/8192 rows are further below than with an fp32 loss. Not the parameters kept "
    "gathered under stage3_max_live_parameters / max_reuse_distance = 1e9: on one rank a "
    "gathered parameter is a view of its partition (DeepSpeed 0.19.8 partition_parameters.py "
    "_no_gather_coalesced -> NoGatherHandle: ds_tensor.data.to(the same device)), no extra "
    "bytes. Which finetune.py ran is not known: the one at e8e1596, which published these "
    "rows, passes device_map='auto' to from_pretrained for every run, and transformers of "
    "that time refuses a device_map under ZeRO-3 ('DeepSpeed Zero-3 is not compatible with "
    "low_cpu_mem_usage=True or with passing a device_map'); Qwen removed it for ZeRO-3 in "
    "23a01b0 (2024-01-08). Read in DeepSpeed of that time (v0.12.3, 2023-11-10, stage3.py), "
    "none of these adds to the step's peak: initialize_optimizer_states' fp32 "
    "gradient_buffer (largest sub_group) is released before the first step, "
    "_create_fp16_partitions_with_defragmentation moves the partitions through a host "
    "buffer and empties the cache, and "
    "the per-gradient norms run before the sub_group loop, below its peak. Candidates: "
    "what zero.Init and initialize_optimizer_states leave reserved; not measured.")
_QWEN_INT4 = (
    "Qwen-1 Q-LoRA on a GPTQ-int4 checkpoint (finetune_qlora_single_gpu.sh: fp16 through "
    "DeepSpeed ZeRO-2 on one GPU, so no autocast): the loss runs in fp16 (logits_upcast=none), "
    "auto-gptq's PyTorch path dequantises each linear to an fp16 weight that the matmul saves "
    "(quant_ops.py), the ZeRO-2 buckets and the step's flattened 16-bit copy of the gradient "
    "partition (stage_1_and_2.py step, DeepSpeed v0.12.3) are counted, and the LoRA adapters "
    "are fp16 as DeepSpeed casts them, with an fp32 master and no fp32 copies of their inputs "
    "(facts.adapter_dtypes; session 14: these rows moved by -3.5 to +2.1 points). Growth of the "
    "band top from 256 to 8192 tokens: 1.8B +10.0 measured vs +8.0 memplan, 7B +12.0 vs "
    "+9.6, while 14B (+9.2 vs +11.0) and 72B (+14.2 vs +14.1) match; a fixed 1.6 GiB (1.8B), "
    "1.7 GiB (7B) and 3.6 GiB (14B) stay at 256 tokens. "
    "Not attributed: the caching allocator's reserve of the 16-bit [S, V] loss blocks (2.3 "
    "GiB each at 8192 for V = 151,936) if the counter is nvidia-smi, and the CUDA context of "
    "that stack; not measured. " + _QWEN_FIXED)
_QWEN_MULTI = (
    "Qwen-1 7B LoRA on 2 nodes x 2 GPUs (finetune_lora_ds.sh, DeepSpeed ZeRO-2, bf16; the "
    "published value is the sum over the 4 GPUs, divided here): it grows by +20.2 GiB per GPU "
    "from 256 to 8192 tokens, more than the single-GPU 7B LoRA sweep (+16.5) and twice "
    "memplan's +9.2 with the bf16 loss DeepSpeed runs (no autocast: logits_upcast=none). The "
    "one Qwen sweep that contradicts the 16-bit loss; per-GPU values are not published. "
    "Mapped as DeepSpeed runs it since session 14 (bf16 model, fp32 master, the adapters cast "
    "to bf16: DEEPSPEED_PRECISION, facts.adapter_dtypes): -0.7 to -1.8 points on these rows. "
    "Unexplained.")
_TT_COMPILE = ("torchtune compiles each layer and the loss (compile_scope=blocks); its model "
               "returns fp32 logits made in eager code between them (logits_upcast=model, "
               "counted). ")
MISSES.update({
    "GT025": "-11.3% (51.00 active published, 45.26 predicted with compile; eager +13.6%). "
             + _TT_COMPILE + "The rest is not explained (without the eager upcast: -18.9%).",
    "GT006": "-25.1% vs the band top (11.46 published, 7.81-8.59 predicted with compile; eager "
             "-16.1%). " + _TT_COMPILE + "Unexplained (2024-05 QLoRA, NF4 at load: see GT002).",
    "GT030": "-13.1% (17.60 active published, 15.30 predicted). The step from GT029 (the same "
             "recipe before 8-bit AdamW, -2.8%) measured -4.2 GiB; memplan's -5.9 GiB is bf16 "
             "AdamW states (2 x 2 B/param) against 8-bit ones (2 x 1 B/param). Which 8-bit "
             "optimizer ran is not stated: torchtune's memory tutorial (437a8ff33) names "
             "torchao's AdamW8bit and bitsandbytes' PagedAdamW8bit; computed, bitsandbytes "
             "AdamW8bit on the device gives 15.30, PagedAdamW8bit (states in managed memory, "
             "outside the active counter) 9.22. Unexplained.",
    "GT022": "+24.6% (44.80 published, 55.83-59.68 predicted with compile). "
             "Unexplained (405B QLoRA on 8 GPUs, FSDP2: the row's recipe lora_finetune_fsdp2). "
             "Not the NF4 dequantisation: torchao's get_original_weight, which linear_nf4 runs "
             "in the forward and backward, measured 14.0 B per weight element on CPU (0.1 and "
             "0.6.1, validation/torchao_dequant.json) and is not counted; counting it would "
             "raise this row further.",
})
_REPLAYED = ("Inside tolerance with the flat 5 % allocator slack; the caching-allocator replay "
             "(estimate/reserved.py) of the simulated stream leaves less slack than 5 % of the "
             "peak, and nothing was fitted to bring it back. Unexplained: the counter is not "
             "named, and what the allocator holds beyond the simulated tensors (model loading, "
             "DeepSpeed's buffers: not in the stream) was not "
             "measured.")
MISSES.update({
    "GT003": "-13.3% vs the band top (16.00 published, 12.75-13.87 predicted at seq_len 512; "
             "flat slack: 14.27). " + _REPLAYED,
    "GT037": "-21.2% (8.65 GiB reserved published, 6.82 predicted). " + _NF4_INIT,
    "GT164": "-27.6% (5.80 published, 3.55-4.20 predicted). " + _QWEN_INT4,
    "GT165": "-27.1% (6.00 published, 3.79-4.37 predicted). " + _QWEN_INT4,
    "GT166": "-26.1% (6.60 published, 4.28-4.88 predicted). " + _QWEN_INT4,
    "GT167": "-24.3% (7.80 published, 5.25-5.91 predicted). " + _QWEN_INT4,
    "GT169": "-23.0% (15.80 published, 11.08-12.17 predicted). " + _QWEN_INT4,
    "GT201": "-26.2% (30.27 published per GPU, 20.42-22.36 predicted). " + _QWEN_MULTI,
    "GT202": "-29.0% (38.88 published per GPU, 24.96-27.61 predicted). " + _QWEN_MULTI,
    "GT170": "-19.5% (43.50 published, 32.98-35.02 predicted). " + _QWEN_DS,
    "GT171": "-19.5% (43.50 published, 32.98-35.02 predicted). " + _QWEN_DS,
    "GT172": "-19.5% (43.50 published, 32.98-35.02 predicted). " + _QWEN_DS,
    "GT173": "-19.5% (43.50 published, 32.98-35.02 predicted). " + _QWEN_DS,
    "GT174": "-25.6% (47.10 published, 32.98-35.02 predicted). " + _QWEN_DS,
    "GT175": "-22.6% (48.30 published, 35.23-37.38 predicted). " + _QWEN_DS,
})

if CSV_PATH.is_file():
    CASES, FITS, SKIPPED = load_all()
else:  # pragma: no cover - the shared checkout is absent
    CASES, FITS, SKIPPED = [], [], []
pytestmark = pytest.mark.skipif(not CSV_PATH.is_file(),
                                reason=f"ground truth not found at {CSV_PATH}")


@cache
def _predicted(case: Case) -> Result:
    return predict(case)


def _param(case: Case | FitCase):
    marks = [pytest.mark.xfail(strict=True, reason=XFAIL[case.id])] if case.id in XFAIL else []
    return pytest.param(case, id=f"{case.id}-{case.group}", marks=marks)


@pytest.mark.parametrize("case", [_param(c) for c in CASES if c.id not in MISSES])
def test_peak_matches_published(case: Case):
    res = _predicted(case)
    side = ("lo(seq_lo) - tol <= value <= hi(seq_len) + tol" if case.upper_bound
            else "lo - tol <= value <= hi + tol")
    assert res.ok, (f"{case.id} ({case.group}, {case.grade}): published {case.value_gib:.2f} "
                    f"GiB, predicted [{res.floor_gib:.2f}, {res.hi_gib:.2f}] GiB ({case.metric}), "
                    f"tol {res.tol_gib:.2f} GiB, need {side}; error {res.error:+.1%}")


@pytest.mark.parametrize("fc", [_param(c) for c in FITS])
def test_fit_matches_published(fc: FitCase):
    """oom=1: the estimate must not fit. Capacity boundaries: it must fit at that capacity.
    GT109 (litgpt, chunked CE) is usable here although its CE is chunked: the model states alone
    (8.03 B x 8 B in bf16-true AdamW) exceed 24 GB whatever the loss does."""
    b = estimate_row(fc.model_id, fc.recipe, get_device(fc.gpu))
    cap = b.capacity_bytes if fc.capacity_gib is None else fc.capacity_gib * GIB
    need = b.worst.device_total_bytes
    assert (need <= cap) == fc.fits, (
        f"{fc.id}: published {'fits' if fc.fits else 'OOM'} at {cap / GIB:.1f} GiB, memplan "
        f"needs {need / GIB:.2f} GiB")


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES if c.id in MISSES])
def test_unexplained_misses_still_miss(case: Case):
    """A listed miss that starts to pass must leave ``MISSES`` (the table would overstate the
    misses otherwise)."""
    assert not _predicted(case).ok, f"{case.id} now passes: remove it from MISSES"


def test_misses_and_xfails_are_rows():
    assert not set(MISSES) & set(XFAIL)
    assert set(MISSES) <= {c.id for c in CASES}


def status(case: Case) -> str:
    """``pass``, ``xfail`` (outside tolerance, cause measured) or ``miss`` (cause unknown)."""
    return "pass" if _predicted(case).ok else "xfail" if case.id in XFAIL else "miss"


def _two_sided() -> list[Case]:
    return [c for c in CASES if not c.upper_bound]




def test_median_error():
    """Median absolute error over the A+B rows with a fixed sequence length (an upper-bound
    row's error is a distance to a range, not comparable), xfail and miss rows included. Bound
    ``MEDIAN_BOUND`` = 10 %, set by what the estimator should reach (its docstring), not by
    what it reaches."""
    errors = [abs(_predicted(c).error) for c in _two_sided()]
    assert len(errors) >= 10
    assert statistics.median(errors) <= MEDIAN_BOUND, (
        f"median |error| {statistics.median(errors):.1%} over {len(errors)} rows")


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES if c.stand_in_gpu])
def test_stand_in_gpu_does_not_matter(case: Case):
    """The compared counters of a row with an unstated GPU barely depend on which GPU we
    assume (only the cuBLAS workspace does): across A100, H100 and RTX 4090 they move by less
    than a tenth of the row's tolerance, so the stand-in does not decide the outcome."""
    ref = _predicted(case)
    spread = 0.1 * ref.tol_gib  # a tenth of the row's tolerance
    for gpu in STAND_IN_CHECK:
        other = predict(case, gpu)
        assert other.lo_gib == pytest.approx(ref.lo_gib, abs=spread)
        assert other.hi_gib == pytest.approx(ref.hi_gib, abs=spread)


def _arch(text: str) -> dict[str, int]:
    """The arch column as numbers; an encoder-decoder's ``L=24+24`` is both stacks' layers."""
    out = {}
    for key, value in re.findall(r"\b(h|d|L|H|KV|ffn|swiglu-inner|V)=(\d+(?:\+\d+)?)", text):
        out["ffn" if key == "swiglu-inner" else "h" if key == "d" else key] = sum(
            int(v) for v in value.split("+"))
    return out


def _config_arch(model_id: str) -> dict[str, int]:
    """A generic-path model's architecture from its catalog config.json, read through
    transformers' own config class (its ``attribute_map`` names: BLOOM's n_layer, n_head)."""
    from transformers import AutoConfig

    data = dict(find(_base_id(model_id)).config())
    cfg = AutoConfig.for_model(data.pop("model_type"), **data)
    heads = cfg.num_attention_heads
    return {"h": cfg.hidden_size, "L": cfg.num_hidden_layers, "H": heads,
            "KV": getattr(cfg, "num_key_value_heads", None) or heads, "V": cfg.vocab_size}


def _spec_arch(spec: ModelSpec) -> dict[str, int]:
    layer = spec.layers[0]
    assert layer.attention is not None and layer.ffn is not None
    return {"h": spec.hidden_size, "L": spec.num_layers, "H": layer.attention.num_heads,
            "KV": layer.attention.num_kv_heads, "ffn": layer.ffn.intermediate_size,
            "V": spec.vocab_size}


@pytest.mark.parametrize("row_id", sorted({c.id for c in CASES} | {f.id for f in FITS}))
def test_arch_column_matches_catalog_model(row_id: str):
    """The catalog model we estimate (after ``MODEL_ALIASES``) has the row's architecture."""
    row = next(r for r in rows() if r["id"] == row_id)
    published = _arch(row["arch"])
    mid = _catalog_id(row) or ""
    ours = _config_arch(mid) if is_generic(mid) else _spec_arch(model(mid))
    if "KV" not in published and "H" in published:
        published["KV"] = published["H"]
    assert {k: ours[k] for k in published} == published


def test_every_row_is_accounted_for():
    """Each CSV row is compared, fit-checked or skipped with at least one reason."""
    ids = [c.id for c in CASES] + [f.id for f in FITS] + [s.id for s in SKIPPED]
    assert sorted(ids) == sorted(r["id"] for r in rows())
    assert all(s.reasons for s in SKIPPED)
    assert set(XFAIL) <= {c.id for c in CASES} | {f.id for f in FITS}


# ---- the report of validation/ground_truth_gpu.md ---------------------------------------------

def _p90(xs: list[float]) -> float:
    """Nearest-rank 90th percentile."""
    s = sorted(xs)
    return s[max(0, -(-9 * len(s) // 10) - 1)]


def report() -> str:
    out = []
    groups = sorted({c.group for c in CASES})
    out.append("| source_group | grade | rows (upper-bound) | median abs err | p90 abs err | "
               "median, fixed-length rows | within tolerance | xfail (cause measured) | "
               "miss (cause unknown) |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    for g in groups:
        for grade in ("A", "B"):
            cs = [c for c in CASES if c.group == g and c.grade == grade]
            if not cs:
                continue
            errs = [abs(_predicted(c).error) for c in cs]
            fixed = [abs(_predicted(c).error) for c in cs if not c.upper_bound]
            ok = sum(_predicted(c).ok for c in cs)
            out.append(f"| {g} | {grade} | {len(cs)} ({sum(c.upper_bound for c in cs)}) | "
                       f"{statistics.median(errs):.1%} | {_p90(errs):.1%} | "
                       + (f"{statistics.median(fixed):.1%}" if fixed else "-")
                       + f" | {ok}/{len(cs)} | {_count(cs, 'xfail')} | {_count(cs, 'miss')} |")
    for grade in ("A", "B", "A+B"):
        cs = [c for c in CASES if grade == "A+B" or c.grade == grade]
        errs = [abs(_predicted(c).error) for c in cs]
        fixed = [abs(_predicted(c).error) for c in cs if not c.upper_bound]
        out.append(f"| **all** | {grade} | {len(cs)} ({sum(c.upper_bound for c in cs)}) | "
                   f"{statistics.median(errs):.1%} | {_p90(errs):.1%} | "
                   f"{statistics.median(fixed):.1%} | {sum(_predicted(c).ok for c in cs)}/"
                   f"{len(cs)} | {_count(cs, 'xfail')} | {_count(cs, 'miss')} |")
    out.append("")
    out.append("| id | group | grade | model | GPU | counter | published GiB | predicted GiB | "
               "error | tol GiB | status |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for c in CASES:
        r = _predicted(c)
        pred = f"{r.lo_gib:.2f}" if r.lo_gib == r.hi_gib else f"{r.lo_gib:.2f}-{r.hi_gib:.2f}"
        if c.upper_bound:
            pred = f"{r.floor_gib:.2f} (s{c.seq_lo}) .. {r.hi_gib:.2f} (s{c.recipe.batch.seq_len})"
        out.append(f"| {c.id} | {c.group} | {c.grade} | {c.model_id} | {c.gpu}"
                   f"{' (stand-in)' if c.stand_in_gpu else ''} | {c.metric}"
                   f"{' (seq max)' if c.upper_bound else ''} | {c.value_gib:.2f} | {pred} | "
                   f"{r.error:+.1%} | {r.tol_gib:.2f} | {status(c)} |")
    out.append("")
    out.append("| id | group | grade | expected | capacity GiB | memplan needs GiB | ok |")
    out.append("|---|---|---|---|---|---|---|")
    for f in FITS:
        b = estimate_row(f.model_id, f.recipe, get_device(f.gpu))
        cap = b.capacity_bytes / GIB if f.capacity_gib is None else f.capacity_gib
        need = b.worst.device_total_bytes / GIB
        out.append(f"| {f.id} | {f.group} | {f.grade} | {'fits' if f.fits else 'OOM'} | "
                   f"{cap:.1f} | {need:.2f} | {'yes' if (need <= cap) == f.fits else 'no'} |")
    out.append("")
    first: dict[str, list[str]] = {}
    for s in SKIPPED:
        first.setdefault(s.reasons[0], []).append(s.id)
    out.append(f"Skipped rows: {len(SKIPPED)} (by first reason)")
    out.append("")
    out.append("| reason | rows | ids |")
    out.append("|---|---|---|")
    for reason, ids in sorted(first.items(), key=lambda kv: -len(kv[1])):
        out.append(f"| {reason} | {len(ids)} | {_ranges(ids)} |")
    every: dict[str, list[str]] = {}
    for s in SKIPPED:
        for reason in s.reasons:
            every.setdefault(reason, []).append(s.id)
    out.append("")
    out.append("Every reason (a row can have several)")
    out.append("")
    out.append("| reason | rows |")
    out.append("|---|---|")
    for reason, ids in sorted(every.items(), key=lambda kv: -len(kv[1])):
        out.append(f"| {reason} | {len(ids)} |")
    return "\n".join(out)


def _count(cs: list[Case], what: str) -> int:
    return sum(status(c) == what for c in cs)


def summary() -> dict[str, object]:
    """The figures the accuracy claims quote (scripts/accuracy_claims.py), as plain data."""
    def block(cs: list[Case]) -> dict[str, object]:
        fixed = [abs(_predicted(c).error) for c in cs if not c.upper_bound]
        return {"rows": len(cs), "upper_bound_rows": sum(c.upper_bound for c in cs),
                "pass": _count(cs, "pass"), "xfail": _count(cs, "xfail"),
                "miss": _count(cs, "miss"),
                "median_abs_error_fixed_length": round(statistics.median(fixed), 4)}
    fits_ok = sum(_fit_ok(f) for f in FITS)
    return {
        "source": "tests/golden/test_memory_published.py",
        "tolerance": {"rel": REL_TOL, "abs_gib": ABS_TOL_GIB, "unit_rel": UNIT_TOL,
                      "seq_lo_fraction": SEQ_LO_FRACTION, "median_bound": MEDIAN_BOUND},
        "A": block([c for c in CASES if c.grade == "A"]),
        "B": block([c for c in CASES if c.grade == "B"]),
        "all": block(CASES),
        "fit_rows": len(FITS), "fit_rows_ok": fits_ok, "skipped_rows": len(SKIPPED),
        "rows": {c.id: {"status": status(c), "error": round(_predicted(c).error, 4)}
                 for c in CASES},
    }


def _fit_ok(f: FitCase) -> bool:
    b = estimate_row(f.model_id, f.recipe, get_device(f.gpu))
    cap = b.capacity_bytes if f.capacity_gib is None else f.capacity_gib * GIB
    return (b.worst.device_total_bytes <= cap) == f.fits


def _ranges(ids: list[str]) -> str:
    nums = sorted(int(i[2:]) for i in ids)
    spans, start = [], nums[0]
    for a, b in zip(nums, nums[1:] + [None]):
        if b != a + 1:
            spans.append(f"GT{start:03d}" + (f"-GT{a:03d}" if a != start else ""))
            if b is not None:
                start = b
    return ", ".join(spans)


if __name__ == "__main__":
    print(report())
