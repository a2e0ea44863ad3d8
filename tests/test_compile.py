"""``torch.compile``'s effect on memory (issue #11 item 4): ``estimate/activations/compiled.py``.

The saved sets are checked against what torch 2.13's own partitioner
(``min_cut_rematerialization_partition``) returned for the same tiny models on this machine:
the forward graph's extra outputs, listed node by node (FX and AOTAutograd caches off). The
whole-step peaks against real compiled CPU runs are in ``memplan validate``'s compile cases.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from typer.testing import CliRunner

from memplan.cli import app
from memplan.errors import ConfigError
from memplan.estimate.activations import _graph_args
from memplan.estimate.activations.compiled import _Net, compiled
from memplan.estimate.activations.families import stage_graph
from memplan.estimate.activations.graph import Graph, Tensor, simulate
from memplan.facts import dtypes
from memplan.model import load_model
from memplan.recipe import Recipe

TINY = "src/memplan/validate/tiny/{}.json"


def _layer_saved(model: str, **kw) -> int:
    spec = load_model(TINY.format(model))
    r = Recipe.of(micro_batch=2, device="cpu", compile=True, **kw)
    stage = SimpleNamespace(index=0, layers=range(spec.num_layers))
    ctx, args = _graph_args(spec, stage, r, dtypes(r))
    g = stage_graph(spec, stage.layers, ctx, **args)
    seen: dict[int, int] = {}
    for op in g.ops:
        if op.region == "layer 0":
            for t in op.saves:
                seen[id(t)] = t.nbytes
    return sum(seen.values())


@pytest.mark.parametrize(("model", "kw", "torch_saved"), [
    # primals_1 (the layer input) + rsqrt x2, q/k/v after rope, v, attention out + lse, o_proj
    # out, both norm outputs, gate/up/act: 429,056 B (tiny Qwen2, bf16-true, 2 x 64 tokens)
    ("qwen2", dict(precision="bf16-true", seq_len=64), 429_056),
    # the same under autocast, with the 16-bit weight copies the input gradients read (7 of
    # them, 294,912 B) and one 16-bit copy of each norm output (CSE of q/k/v's casts)
    ("llama", dict(precision="bf16-mixed", seq_len=128), 1_218_560),
    # LoRA r=8 on q,k,v,o,gate,up,down: the rank-8 intermediates and adapter weight copies
    ("llama", dict(precision="bf16-mixed", seq_len=128, method="lora", lora_rank=8), 912_384),
])
def test_layer_saves_what_the_partitioner_saved(model, kw, torch_saved):
    assert _layer_saved(model, **kw) == torch_saved


def test_min_cut_saves_the_cheaper_side():
    """source -> a (banned) -> b (cheap) -> sink: the cut is b's capacity."""
    net = _Net(6)
    net.add(0, 2, float("inf"))
    net.add(2, 3, 100.0)   # a: in -> out
    net.add(3, 4, float("inf"))
    net.add(4, 5, 10.0)    # b: in -> out
    net.add(5, 1, float("inf"))
    side = net.min_cut_source_side()
    assert 4 in side and 5 not in side and 2 in side


def test_fused_chain_is_recomputed_not_saved():
    """mm -> exp -> mul -> mm: the elementwise chain's saves become the first GEMM's output
    (the chain is recomputed from it), and its intermediates take no memory."""
    g = Graph()
    g.region = "layer 0"
    x = Tensor(1000)
    g.op([], (x,), kind="comm")
    a = Tensor(1000)
    g.op([x], (a,), [x], kind="mm")
    b = Tensor(1000)
    g.op([a], (b,), [a])          # exp saves its input
    c = Tensor(1000)
    g.op([b], (c,), [b])          # a mul saving the other operand
    d = Tensor(1000)
    g.op([c], (d,), [c], kind="mm")
    def saved_bytes() -> int:
        return sum({id(t): t.nbytes for op in g.ops for t in op.saves}.values())

    eager = saved_bytes()
    compiled(g, "blocks")
    saved = {id(t) for op in g.ops for t in op.saves}
    assert id(a) in saved and id(b) not in saved and b.nbytes == 0
    assert id(c) in saved  # the second GEMM reads it in the backward
    assert saved_bytes() == eager - 1000
    assert simulate(g)  # the rewritten graph still replays


def test_whole_model_scope_is_refused_with_the_reason():
    with pytest.raises(ConfigError) as e:
        Recipe.of(compile=True, compile_scope="model")
    assert "compile_scope=model" in str(e.value) and "compile_scope=blocks" in str(e.value)


def test_cli_whole_model_scope_exits_2():
    r = CliRunner().invoke(app, ["estimate", "meta-llama/Llama-3.2-1B", "--compile",
                                 "--compile-scope", "model"])
    assert r.exit_code == 2 and "compile_scope=model" in r.output


def test_compile_lowers_saved_activations_of_a_catalog_model():
    """Llama-3.2-3B, bf16, 2 x 4096 tokens, no checkpointing (torchtune's '+ Compile' row):
    the compiled estimate is well below the eager one, and the recipe line says compile."""
    from memplan.estimate import estimate
    from memplan.hardware import get_device as gpu

    spec = load_model("meta-llama/Llama-3.2-3B")
    kw = dict(precision="bf16-true", micro_batch=2, seq_len=4096)
    eager = estimate(spec, Recipe.of(**kw), gpu("H100-80GB")).worst.peak_allocated_bytes
    comp = estimate(spec, Recipe.of(compile=True, **kw), gpu("H100-80GB")).worst.peak_allocated_bytes
    assert comp < 0.8 * eager


def test_torchtitan_export_carries_compile_and_reads_it_back():
    from memplan.export import export
    from memplan.export.torchtitan import read_text

    r = Recipe.of(precision="bf16-mixed", gpus=8, zero=3, engine="torchtitan", compile=True)
    out = export(r, "torchtitan")
    assert '[compile]\nenable = true\ncomponents = ["model", "loss"]' in out.text
    assert "compile" not in out.not_carried
    assert read_text(out.text, "job.toml").keys["compile"] is True


def test_torchtitan_compile_without_the_loss_is_refused():
    from memplan.export.torchtitan import read_text

    with pytest.raises(ConfigError, match="components"):
        read_text('[compile]\nenable = true\ncomponents = ["model"]\n', "job.toml")


@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
def test_measure_session_measures_a_compiled_run_compiled():
    """``memplan.measure``'s session used to make Dynamo run compiled code eagerly (a dispatch
    mode on the stack) and measured the eager peak. Now the compiled step is measured: its peak
    is the one ``measure_step`` records for the same compiled run, and well below eager's."""
    torch = pytest.importorskip("torch")
    from memplan.measure.loop import Session
    from memplan.runtime.compiled import compile_model
    from memplan.runtime.labels import layer_stack
    from memplan.runtime.workload import build_model, build_workload

    r = Recipe.of(precision="bf16-true", micro_batch=2, seq_len=64, device="cpu")

    def peak(compile_it: bool) -> int:
        w = build_workload(build_model(TINY.format("qwen2"), r, device="cpu"), r)
        m, opt = w.model, w.optimizer
        loss_fn = compile_model(m, "blocks", layer_stack(m)) if compile_it else None
        with Session(model=m, optimizer=opt, plot=False) as s:
            for _ in range(2):
                loss = loss_fn(m, w.batch) if loss_fn else m(**w.batch).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                del loss
        return s.steps[-1].peak_bytes

    torch.manual_seed(0)
    assert peak(True) < 0.8 * peak(False)


def test_logits_upcast_in_the_model_costs_memory_only_under_compile():
    """torchtune's model returns fp32 logits: eager, the same ops run (the 16-bit logits die
    sooner, so never more memory); compiled per block, the fp32 logits are written by eager
    code and saved by the compiled loss, where HF's in-loss upcast is fused away."""
    from memplan.estimate import estimate
    from memplan.hardware import get_device

    spec, dev = load_model("meta-llama/Llama-3.2-1B"), get_device("H100-80GB")
    kw = dict(precision="bf16-true", micro_batch=2, seq_len=2048)

    def peak(**more) -> int:
        return estimate(spec, Recipe.of(**kw, **more), dev).worst.peak_allocated_bytes

    assert peak(logits_upcast="model") <= peak()
    fp32_logits = 2 * 2048 * spec.vocab_size * 4
    assert peak(compile=True, logits_upcast="model") - peak(compile=True) >= fp32_logits // 2


def test_trace_refuses_compile_rather_than_report_the_eager_step():
    r = CliRunner().invoke(app, ["trace", TINY.format("llama"), "--device", "cpu", "--compile"])
    assert r.exit_code == 2 and "trace runs the model eagerly" in r.output
