"""Every ``memplan export --to`` target parsed by its engine's own loader, on CPU (issue #14).

Where a loader silently ignores unknown keys (DeepSpeed's top level, accelerate's fsdp_config,
TrainingArguments via ``**kwargs`` would raise, Lightning's Trainer), the keys are also checked
against the engine's own schema: the loader's signature or argument parser. Each test skips,
naming the package, where the engine is not installed (CI installs them: the ``engines``
extra, and torchtitan without its data-loading dependencies, see .ci/run).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import inspect
import json
import pathlib
import shlex
import sys
import tomllib
import types

import pytest

from memplan.export import ExportContext, export
from memplan.model import load_model
from memplan.recipe import Recipe

SPEC = load_model("meta-llama/Llama-3.2-1B")
CTX = ExportContext(model=SPEC, planned_for="test")


def _text(target: str, **keys) -> str:
    return export(Recipe.of(**keys), target, CTX).text


class _Mpu:
    """What DeepSpeedConfig asks a model-parallel unit: the data-parallel world size (without
    a process group it would take world size 1 and fail the batch-size check)."""

    def __init__(self, dp: int) -> None:
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp

    def get_sequence_parallel_world_size(self) -> int:
        return 1


DS_RECIPES = [
    dict(zero=0, gpus=1),
    dict(zero=1, gpus=8, micro_batch=2, grad_accum=4),
    dict(zero=2, gpus=16, gpus_per_node=8, precision="16-mixed", overlap_comm=True),
    dict(zero=3, gpus=8, offload="optimizer", offload_pin_memory=True),
    dict(zero=3, gpus=8, offload="params+optimizer", stage3_max_live_parameters=10**8,
         checkpointing="full", precision="32-true"),
    dict(zero=3, gpus=64, gpus_per_node=8, offload="nvme", offload_buffer_count=8,
         sub_group_size=10**8, grad_dtype="fp32"),
]


@pytest.fixture
def ds_config_cls(monkeypatch):
    """DeepSpeedConfig as a launched rank sees it. It reads the data-parallel size from the
    ``mpu`` only after ``dist.get_rank()`` answers; without a process group it falls back to
    world size 1 and fails its own batch check, so rank 0 of a group is simulated."""
    pytest.importorskip("deepspeed", reason="pip install 'memplan[engines]'")
    import deepspeed.runtime.config as ds_cfg

    monkeypatch.setattr(ds_cfg.dist, "get_rank", lambda *a, **k: 0)
    return ds_cfg.DeepSpeedConfig


@pytest.mark.parametrize("keys", DS_RECIPES, ids=lambda k: f"zero{k['zero']}")
def test_deepspeed_config_loads(keys, ds_config_cls):
    DeepSpeedConfig = ds_config_cls

    recipe = Recipe.of(**keys)
    cfg = json.loads(export(recipe, "deepspeed", CTX).text)
    ds = DeepSpeedConfig(cfg, mpu=_Mpu(recipe.parallelism.dp))
    assert ds.zero_optimization_stage == recipe.parallelism.zero
    assert ds.train_micro_batch_size_per_gpu == recipe.batch.micro_batch
    assert ds.gradient_accumulation_steps == recipe.batch.grad_accum
    assert ds.train_batch_size == recipe.global_batch
    assert ds.bfloat16_config.enabled == (recipe.precision.kind == "bf16-mixed")
    # DeepSpeed ignores unknown top-level keys: each one written must be a DeepSpeed key
    import deepspeed.runtime.constants as c

    known = {v for k, v in vars(c).items() if k.isupper() and isinstance(v, str)}
    assert set(cfg) - known - {"zero_optimization", "optimizer", "data_types",
                               "activation_checkpointing"} == set()


def test_deepspeed_rejects_what_memplan_must_not_write(ds_config_cls):
    """The loader is strict where the test relies on it: an unknown zero key is an error."""
    DeepSpeedConfig = ds_config_cls

    cfg = json.loads(_text("deepspeed", zero=2, gpus=2))
    cfg["zero_optimization"]["not_a_key"] = 1
    with pytest.raises(Exception, match="not_a_key"):
        DeepSpeedConfig(cfg, mpu=_Mpu(2))


ACCELERATE_RECIPES = [
    dict(gpus=8),
    dict(engine="deepspeed", zero=2, gpus=8, grad_accum=4),
    dict(engine="deepspeed", zero=3, gpus=16, gpus_per_node=8, offload="params+optimizer"),
    dict(engine="fsdp2", zero=3, gpus=8, checkpointing="full"),
    dict(engine="fsdp1", zero=2, gpus=8, precision="16-mixed"),
    dict(engine="fsdp2", zero=3, gpus=8, offload="params+optimizer", reshard_after_forward=False),
    dict(engine="fsdp1", zero=3, gpus=8, method="lora", use_orig_params=False),
]


@pytest.mark.parametrize("keys", ACCELERATE_RECIPES, ids=str)
def test_accelerate_config_loads(keys, tmp_path):
    pytest.importorskip("accelerate")
    pytest.importorskip("yaml")
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.commands.launch import launch_command_parser

    recipe = Recipe.of(**keys)
    path = tmp_path / "accelerate.yaml"
    path.write_text(export(recipe, "accelerate", CTX).text)
    cfg = ClusterConfig.from_yaml_file(path)
    assert cfg.num_processes == recipe.parallelism.gpus
    engine = str(recipe.engine_kind)
    ddp = "MULTI_GPU" if recipe.parallelism.gpus > 1 else "NO"
    want = {"deepspeed": "DEEPSPEED", "fsdp1": "FSDP", "fsdp2": "FSDP"}.get(engine, ddp)
    assert str(cfg.distributed_type).rsplit(".", 1)[-1] == want
    # accelerate passes fsdp_config keys on as `accelerate launch` flags and ignores unknown
    # ones: each must be one of the launcher's own arguments
    dests = {a.dest for a in launch_command_parser()._actions}
    assert set(cfg.fsdp_config or {}) <= dests
    assert set(cfg.deepspeed_config or {}) <= dests | {"deepspeed_config_file"}


HF_RECIPES = [
    dict(gpus=1),
    dict(engine="fsdp2", zero=3, gpus=8, checkpointing="full"),
    dict(engine="fsdp1", zero=3, gpus=8, offload="params+optimizer"),
    dict(engine="fsdp1", zero=3, gpus=8, use_orig_params=False),
    dict(engine="deepspeed", zero=2, gpus=8, optimizer="adamw"),
    dict(gpus=1, optimizer="sgd-momentum", precision="16-mixed", micro_batch=4, grad_accum=8),
]


@pytest.mark.parametrize("keys", HF_RECIPES, ids=str)
def test_hf_training_arguments_load(keys, tmp_path):
    pytest.importorskip("transformers")
    from transformers import TrainingArguments

    recipe = Recipe.of(**keys)
    args = json.loads(export(recipe, "hf-trainer", CTX).text)
    if "deepspeed" in args:
        pytest.importorskip("deepspeed", reason="pip install 'memplan[engines]'")
    # an unknown keyword is a TypeError here, so the keys are checked by the constructor
    params = set(inspect.signature(TrainingArguments.__init__).parameters)
    assert set(args) <= params
    fsdp_cfg = args.get("fsdp_config")
    if fsdp_cfg is not None:
        # TrainingArguments drops unknown fsdp_config keys silently; these are the ones
        # transformers' FSDP integration reads (transformers/training_args.py, 5.23; the
        # offload key is cpu_offload, line 2830: "offload_params" would be dropped silently)
        assert set(fsdp_cfg) <= {"version", "reshard_after_forward", "cpu_offload",
                                 "activation_checkpointing", "min_num_params",
                                 "transformer_layer_cls_to_wrap", "backward_prefetch",
                                 "forward_prefetch", "limit_all_gathers", "use_orig_params",
                                 "sync_module_states", "cpu_ram_efficient_loading",
                                 "state_dict_type"}
        args = {k: v for k, v in args.items() if k not in ("fsdp", "fsdp_config")}
        # FSDP needs a process group to build its plugin; the rest is checked on CPU
    args["output_dir"] = str(tmp_path)
    ta = TrainingArguments(**args, use_cpu=True)
    assert ta.per_device_train_batch_size == recipe.batch.micro_batch
    assert ta.gradient_accumulation_steps == recipe.batch.grad_accum


def _torchtitan_config_manager():
    """torchtitan 0.2.x's ConfigManager, imported without running ``torchtitan/__init__.py``
    (which imports its quantisation components, and with them triton)."""
    pytest.importorskip("tyro", reason="pip install 'memplan[engines]'")
    if "torchtitan" not in sys.modules:
        spec = importlib.util.find_spec("torchtitan")
        if spec is None or spec.origin is None:
            pytest.skip("torchtitan 0.2.x is not installed (pip install --no-deps "
                        "torchtitan==0.2.0)")
        root = str(pathlib.Path(spec.origin).parent)
        pkg = types.ModuleType("torchtitan")
        pkg.__path__ = [root]
        pkg.__spec__ = importlib.machinery.ModuleSpec("torchtitan", None, is_package=True)
        pkg.__spec__.submodule_search_locations = [root]
        sys.modules["torchtitan"] = pkg
    from torchtitan.config import ConfigManager

    return ConfigManager


TITAN_RECIPES = [
    dict(zero=3, gpus=8, tp=2, checkpointing="full"),
    dict(zero=0, gpus=4),
    dict(zero=3, gpus=8, offload="params+optimizer", checkpointing="selective"),
    dict(zero=3, gpus=8, checkpointing="op"),
    dict(zero=3, gpus=8, checkpointing="full", checkpoint_every=2),
    dict(zero=3, gpus=16, gpus_per_node=8, tp=2, pp=2, precision="32-true"),
    dict(zero=3, gpus=8, cp=2, seq_len=8192, reshard_after_forward=False),
]


@pytest.mark.parametrize("keys", TITAN_RECIPES, ids=str)
def test_torchtitan_job_config_loads(keys, tmp_path):
    manager = _torchtitan_config_manager()
    recipe = Recipe.of(**keys)
    path = tmp_path / "job.toml"
    path.write_text(export(recipe, "torchtitan", CTX).text)
    job = manager().parse_args(["--job.config_file", str(path)])  # unknown keys raise here
    par = recipe.parallelism
    assert job.parallelism.tensor_parallel_degree == par.tp
    assert job.parallelism.pipeline_parallel_degree == par.pp
    assert job.parallelism.context_parallel_degree == par.cp
    assert job.training.local_batch_size == recipe.batch.micro_batch
    assert job.training.seq_len == recipe.batch.seq_len
    assert tomllib.loads(path.read_text())  # and it is plain TOML


def test_torchtitan_loader_rejects_unknown_keys(tmp_path):
    manager = _torchtitan_config_manager()
    path = tmp_path / "job.toml"
    path.write_text(_text("torchtitan", zero=3, gpus=8) + "\n[model]\nnot_a_key = 1\n")
    with pytest.raises(ValueError, match="not_a_key"):
        manager().parse_args(["--job.config_file", str(path)])


MEGATRON_RECIPES = [
    dict(zero=1, gpus=8, tp=2),
    dict(zero=0, gpus=16, gpus_per_node=8, tp=2, pp=2, checkpointing="full"),
    dict(zero=1, gpus=8, tp=4, sequence_parallel=True, precision="16-mixed"),
    dict(zero=1, gpus=8, tp=2, cp=2, checkpointing="selective"),
]


@pytest.mark.filterwarnings("ignore::UserWarning")  # megatron's own deprecation notices
@pytest.mark.parametrize("keys", MEGATRON_RECIPES, ids=str)
def test_megatron_configs_load(keys):
    pytest.importorskip("megatron.core", reason="pip install 'memplan[engines]'")
    import torch
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer import TransformerConfig

    recipe = Recipe.of(**keys)
    cfg = json.loads(export(recipe, "megatron", CTX).text)

    def typed(d):  # dtype names -> torch dtypes, as the file's dtype_fields says
        return {k: getattr(torch, v) if k in cfg["dtype_fields"] else v for k, v in d.items()}

    tc = TransformerConfig(**typed(cfg["TransformerConfig"]))  # __post_init__ validates
    oc = OptimizerConfig(**typed(cfg["OptimizerConfig"]))
    ddp = DistributedDataParallelConfig(**cfg["DistributedDataParallelConfig"])
    par = recipe.parallelism
    assert tc.tensor_model_parallel_size == par.tp and tc.pipeline_model_parallel_size == par.pp
    assert tc.num_layers == SPEC.num_layers and tc.hidden_size == SPEC.hidden_size
    assert oc.use_distributed_optimizer == (par.zero == 1) == ddp.use_distributed_optimizer


LIGHTNING_RECIPES = [
    dict(engine="deepspeed", zero=2, gpus=4),
    dict(engine="deepspeed", zero=3, gpus=8, offload="optimizer"),
    dict(engine="fsdp2", zero=3, gpus=8),
    dict(engine="ddp", gpus=4, precision="16-mixed", grad_accum=2),
    dict(engine="fsdp1", zero=3, gpus=8, use_orig_params=False),
]


@pytest.mark.parametrize("keys", LIGHTNING_RECIPES, ids=str)
def test_lightning_strategy_loads(keys):
    lp = pytest.importorskip("lightning.pytorch", reason="pip install 'memplan[engines]'")
    recipe = Recipe.of(**keys)
    cfg = json.loads(export(recipe, "lightning", CTX).text)
    if cfg["strategy"] == "DeepSpeedStrategy":
        pytest.importorskip("deepspeed", reason="pip install 'memplan[engines]'")
    strategy = getattr(lp.strategies, cfg["strategy"])(**cfg["strategy_kwargs"])
    if cfg["strategy"] == "DeepSpeedStrategy":
        assert strategy.config["zero_optimization"]["stage"] == recipe.parallelism.zero
    # a GPU Trainer cannot be built on CPU: its arguments are checked against its signature
    assert set(cfg["trainer"]) <= set(inspect.signature(lp.Trainer.__init__).parameters)
    assert cfg["trainer"]["precision"] in {"32-true", "16-mixed", "bf16-mixed", "16-true",
                                           "bf16-true", "transformer-engine"} | {"fp8-mixed"}


@pytest.mark.parametrize("keys", [dict(gpus=8), dict(gpus=16, gpus_per_node=8),
                                  dict(gpus=64, gpus_per_node=8, zero=3)], ids=str)
def test_torchrun_command_parses(keys):
    pytest.importorskip("torch")
    from torch.distributed.run import get_args_parser

    recipe = Recipe.of(**keys)
    line = next(s for s in _text("torchrun", **keys).splitlines() if s.startswith("torchrun "))
    argv = shlex.split(line.replace("${NODE_RANK}", "0").replace(
        "${MASTER_ADDR}:${MASTER_PORT:-29500}", "10.0.0.1:29500"))[1:]
    args = get_args_parser().parse_args(argv)
    nodes = -(-recipe.parallelism.gpus // recipe.parallelism.local_gpus)
    assert int(args.nproc_per_node) * nodes == recipe.parallelism.gpus
    assert args.nnodes == str(nodes) and args.training_script == "train.py"


def test_torchrun_numa_binding_parses_and_reads_back():
    """``numa_bound = true`` in the recipe's [host] table puts torchrun's own binding flag in
    the launch line (torch >= 2.9 parses it); reading the line back says what to set."""
    pytest.importorskip("torch")
    from torch.distributed.run import get_args_parser

    from memplan.export.torchrun import read_text

    text = export(Recipe.of(gpus=8), "torchrun", ExportContext(
        model=SPEC, planned_for="test", numa_bound=True)).text
    line = next(s for s in text.splitlines() if s.startswith("torchrun "))
    assert get_args_parser().parse_args(shlex.split(line)[1:]).numa_binding == "node"
    back = read_text(text, "run.sh")
    assert any("numa_bound = true" in r for r in back.resolved)
    assert "--numa-binding" not in back.ignored
    assert "--numa-binding" not in _text("torchrun", gpus=8)
