"""bitsandbytes 4-bit bases in the activation graph (``Ctx.dequant``): the dequantised weight of
every quantised linear in the forward and the backward, checked against a CPU measurement of
bitsandbytes' own ``MatMul4Bit``; and Lightning's ``BitsandbytesPrecision`` as litgpt runs it
(``quantizer = "lightning-bnb"``): the head quantised, each 4-bit linear's input kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memplan import Recipe, estimate, get_device, load_model
from memplan.estimate.activations.blocks import Blocks
from memplan.estimate.activations.context import Ctx
from memplan.estimate.activations.graph import Graph, Tensor, simulate

MEASURED = Path(__file__).resolve().parents[1] / "validation" / "bnb_matmul4bit.json"


def _one_linear(rows: int, cols: int, tokens: int, dequant: tuple[int, int],
                saves_input: bool = False, made_before: bool = True) -> tuple[int, int, int]:
    """Forward peak, backward peak and saved bytes of one frozen 4-bit linear whose bf16 input
    (made before, as in the measurement) needs a gradient."""
    ctx = Ctx(batch=1, seq=tokens, act=2, half=2, amp=False, trained=False, dequant=dequant,
              dequant_saves_input=saves_input)
    g = Graph()
    x = Tensor(tokens * cols * 2, 2, grad=True, external=made_before)
    if not made_before:
        g.op([], (x,))
    Blocks(g, ctx).linear(x, cols, rows, role=("q",))
    pts = simulate(g)
    fwd = max(p.total for p in pts if p.phase == "forward")
    bwd = max(p.total for p in pts if p.phase == "backward")
    return fwd, bwd, max(p.saved for p in pts)


@pytest.mark.parametrize("run", json.loads(MEASURED.read_text())["runs"],
                         ids=lambda r: f"{r['quant_dtype']}-{r['shape'][0]}x{r['shape'][1]}")
def test_dequant_matches_the_cpu_measurement(run):
    """Exact bytes against ``scripts/measure_bnb_matmul4bit.py`` (its own dispatch-mode
    counter on bitsandbytes 0.49.2's ``MatMul4Bit``): fp16 quant_state with bf16 compute holds
    4 B per weight element at the copy, a bf16 one 2 B, in the forward and in the backward."""
    rows, cols = run["shape"]
    cast = 2 if run["quant_dtype"] != run["compute_dtype"] else 0
    fwd, bwd, _ = _one_linear(rows, cols, run["tokens"], (2, cast))
    assert (fwd, bwd) == (run["forward_peak_bytes"], run["backward_peak_bytes"])


def test_without_a_4bit_base_nothing_is_dequantised():
    fwd, bwd, _ = _one_linear(4096, 4096, 64, (0, 0))
    assert fwd == 64 * 4096 * 2 and bwd == 64 * 4096 * 2  # the output, the input gradient


def test_bitsandbytes_042_keeps_each_4bit_linears_input():
    """bitsandbytes < 0.43.2 ``ctx.tensors = (A, B)`` (PR #1270 removed ``A``)."""
    assert _one_linear(4096, 4096, 64, (2, 2), made_before=False)[2] == 0
    assert _one_linear(4096, 4096, 64, (2, 2), saves_input=True,
                       made_before=False)[2] == 64 * 4096 * 2


def _worst(quantizer: str, **kw):
    r = Recipe.of(precision="bf16-true", method="qlora", quant="nf4", quantizer=quantizer,
                  lora_rank=32, lora_targets=("q", "v"), micro_batch=2, seq_len=512,
                  optimizer="paged-adamw", **kw)
    return estimate(load_model("meta-llama/Llama-2-7b-hf"), r, get_device("A10G-24GB"),
                    search_micro_batch=False).worst


def _bytes(rank, category: str, name: str) -> int:
    return sum(i.bytes for i in rank.peak_moment.items
               if str(i.category) == category and i.name.startswith(name))


def test_lightning_quantises_the_head_and_keeps_the_inputs():
    """Llama-2-7B: the 32000 x 4096 head leaves the 16-bit frozen weights for the NF4 base
    (Lightning replaces every nn.Linear), and the kept inputs raise the saved activations."""
    hf, lt = _worst("bitsandbytes"), _worst("lightning-bnb")
    head = 32000 * 4096
    assert _bytes(hf, "params", "frozen") - _bytes(lt, "params", "frozen") == head * 2
    assert _bytes(lt, "params", "quantized") > _bytes(hf, "params", "quantized")
    assert _bytes(lt, "activations", "saved") > _bytes(hf, "activations", "saved")


def _chain_last_backward_saved(saves_input: bool, tokens: int) -> int:
    """``x -> 4-bit linear (512 -> 1024) -> * 2 -> 4-bit linear (1024 -> 256)``, the chain of
    the ``--kept`` measurement: saved bytes when the backward reaches the first linear."""
    ctx = Ctx(batch=1, seq=tokens, act=2, half=2, amp=False, trained=False, dequant=(2, 2),
              dequant_saves_input=saves_input)
    g, x = Graph(), Tensor(tokens * 512 * 2, 2, grad=True, external=True)
    b = Blocks(g, ctx)
    b.linear(b.scale(b.linear(x, 512, 1024, role=("q",))), 1024, 256, role=("o",))
    return [p for p in simulate(g) if p.phase == "backward"][-1].saved


@pytest.mark.parametrize("run", json.loads(MEASURED.read_text())["kept"],
                         ids=lambda r: r["matmul4bit"])
def test_042_inputs_live_until_the_graph_dies(run):
    """Measured: with 0.42.0's ``MatMul4Bit`` the inner input outlives the backward while the
    output is bound and dies with it; with 0.49.2 it is gone after the forward. The simulator
    keeps a ``held`` tensor through the whole backward."""
    old = run["matmul4bit"].startswith("0.42")
    kept = run["after_backward_y_kept"] - run["y_bytes"] - run["x_grad_bytes"]
    assert kept == (run["h_bytes"] if old else 0)
    assert run["after_del_y"] == run["x_grad_bytes"]
    assert _chain_last_backward_saved(old, run["tokens"]) == kept


def test_lightning_loop_keeps_the_inputs_through_the_next_forward():
    """litgpt keeps ``logits`` (``outputs = "kept"``): the held inputs are a line of the
    optimizer step and, on the steady step, of the next forward; not with transformers'
    bitsandbytes (>= 0.43.2)."""
    lt = _worst("lightning-bnb", loss="chunked-head", outputs="kept")
    hf = _worst("bitsandbytes", loss="chunked-head", outputs="kept")
    names = {i.name for m in lt.moments for i in m.items}
    assert "4-bit linears' inputs on the kept graph" in names
    assert not {n for m in hf.moments for i in m.items if "4-bit" in (n := i.name)}
    held = next(i.bytes for m in lt.moments for i in m.items
                if i.name == "4-bit linears' inputs on the kept graph")
    # per layer: the MLP input and the o and down inputs (bf16, 2 x 512 tokens); the first
    # layer's attention input needs no gradient, the other 31 keep it too; plus the head's
    tokens = 2 * 512
    assert held == tokens * 2 * (32 * (4096 + 4096 + 11008) + 31 * 4096 + 4096)


def test_lightning_bnb_needs_a_4bit_quant():
    from memplan.errors import ConfigError

    with pytest.raises(ConfigError, match="quantizer=lightning-bnb with quant=int8"):
        Recipe.of(precision="bf16-true", method="qlora", quant="int8", quantizer="lightning-bnb")


def test_compile_keeps_the_dequantised_weight():
    """Inductor cannot fuse bitsandbytes' dequantisation (a ctypes call in 0.42.0, a library op
    later: ``Op.origin = "opaque"``): under ``compile_scope = blocks`` the fp16 weight and its
    bf16 copy are still written, 4 B per element at the copy."""
    from memplan.estimate.activations.compiled import compiled

    ctx = Ctx(batch=1, seq=64, act=2, half=2, amp=False, trained=False, dequant=(2, 2),
              compile="blocks")
    g = Graph(region="layer 0")
    x = Tensor(64 * 4096 * 2, 2, grad=True, external=True)
    Blocks(g, ctx).linear(x, 4096, 4096, role=("q",))
    pts = simulate(compiled(g, "blocks"))
    assert max(p.total for p in pts if p.phase == "forward") == 4 * 4096 * 4096
