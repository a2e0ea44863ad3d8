"""memplan.runtime.stepping (memplan.measure.measure_step): exact live-tensor byte counts of real CPU training steps."""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from memplan.measure import CATEGORIES, PHASES, StepMeasurement, measure_step  # noqa: E402

F32 = 4


def _linear_case(optimizer_cls, **opt_kwargs):
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 512)
    optimizer = optimizer_cls(model.parameters(), lr=0.1, **opt_kwargs)
    batch = {"x": torch.randn(8, 256), "y": torch.randn(8, 512)}
    return model, optimizer, batch


def _mse(model, batch):
    # Written out rather than F.mse_loss: on CPU, F.mse_loss returns a 0-d tensor that keeps
    # the whole unreduced (8, 512) buffer as its storage (16 KiB for a scalar), which this
    # harness duly counts but which makes the hand derivation less obvious.
    return ((model(batch["x"]) - batch["y"]) ** 2).mean()


def _check_consistent(m: StepMeasurement) -> None:
    assert set(m.phase_peaks) == set(PHASES)
    assert set(m.at_peak) == set(CATEGORIES)
    assert m.peak_phase in PHASES
    assert m.peak_bytes == max(m.phase_peaks.values()) == m.phase_peaks[m.peak_phase]
    assert sum(m.at_peak.values()) == m.peak_bytes
    assert all(v >= 0 for v in m.at_peak.values())
    assert m.start_bytes <= min(m.phase_peaks.values())


def test_linear_sgd_peak_is_exact():
    model, optimizer, batch = _linear_case(torch.optim.SGD)
    res = measure_step(model, batch, optimizer, loss_fn=_mse, steps=2)
    assert [m.step for m in res] == [0, 1]

    W = 512 * 256 * F32  # 524288
    b = 512 * F32  # 2048
    x = 8 * 256 * F32  # 8192
    y = act = 8 * 512 * F32  # 16384: y, and every (8, 512) activation or its gradient
    loss = seed = F32  # 0-d loss; backward()'s ones_like(loss) seed
    start = W + b + x + y  # 550912: parameters and the batch; SGD has no state, no grads yet

    # Forward: addmm -> out; sub -> diff (out still alive while sub runs, then freed);
    # pow -> sq (diff saved by pow); mean -> loss (then sq freed). Highest after mean:
    fwd = start + act + act + loss  # diff + sq + loss = 583684
    # Backward: seed; MeanBackward: div -> g_sq; PowBackward: pow(diff, 1), *2, *g_sq (each
    # (8, 512)), all freed; AddmmBackward with grad_out g (8, 512): mm -> W.grad (laid out so
    # AccumulateGrad adopts it without a copy), sum -> b.grad. Highest right after the sum:
    bwd = start + loss + seed + act + W + b  # 1093640
    # SGD without momentum: in-place p.add_(grad); the seed is gone.
    opt = start + loss + W + b  # 1077252

    for m in res:
        _check_consistent(m)
        assert m.start_bytes == start
        assert m.phase_peaks == {"forward": fwd, "backward": bwd, "optimizer-step": opt}
        assert m.peak_bytes == bwd == 1_093_640
        assert m.peak_phase == "backward"
        assert m.at_peak == {
            "params": W + b,
            "gradients": W + b,
            "optimizer": 0,
            "activations": x + loss,  # x saved by addmm (for W.grad); loss outlives the forward
            "temporary": y + seed + act,  # y is not saved (sub needs no inputs); grad of out
        }
        assert m.end_bytes == start + W + b  # grads are carried into the next step


def test_adamw_states_created_in_step0_and_alive_in_step1():
    model, optimizer, batch = _linear_case(torch.optim.AdamW)
    res = measure_step(model, batch, optimizer, loss_fn=_mse, steps=2)
    W, b = 512 * 256 * F32, 512 * F32
    start0 = W + b + 8 * 256 * F32 + 8 * 512 * F32
    states = 2 * (W + b) + 2 * F32  # exp_avg + exp_avg_sq per param, plus 0-d fp32 `step`s

    s0, s1 = res
    for m in res:
        _check_consistent(m)
        # Peak: W's update, with all states alive and two W-sized temporaries:
        # exp_avg_sq.sqrt() and its division by the bias correction (the denom).
        assert m.peak_phase == "optimizer-step"
        assert m.peak_bytes == start0 + W + b + F32 + states + 2 * W  # + grads + loss
        assert m.at_peak["optimizer"] == states
        assert m.at_peak["gradients"] == W + b
        assert m.at_peak["temporary"] == 8 * 512 * F32 + 2 * W  # y, sqrt, denom
    assert s0.start_bytes == start0
    # The states did not exist before step 0's optimizer step ...
    assert s0.phase_peaks["backward"] == start0 + 8 * 512 * F32 + 2 * F32 + W + b
    # ... and step 1 starts (and runs forward and backward) with them alive.
    assert s1.start_bytes == start0 + states
    assert s1.phase_peaks["forward"] == s0.phase_peaks["forward"] + states
    assert s1.phase_peaks["backward"] == s0.phase_peaks["backward"] + states
    assert s0.end_bytes == s1.end_bytes == start0 + W + b + states


def _tiny_llama(**kw):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        use_cache=False,
        **kw,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    ids = torch.randint(0, 256, (2, 32))
    return model, {"input_ids": ids, "labels": ids}


def _nbytes(tensors) -> int:
    storages = {}
    for t in tensors:
        st = t.untyped_storage()
        storages[st.data_ptr()] = st.nbytes()
    return sum(storages.values())


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_tiny_llama_numbers_are_plausible(attn):
    model, batch = _tiny_llama(attn_implementation=attn)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    res = measure_step(model, batch, optimizer, steps=2)

    params = list(model.parameters())
    param_bytes = _nbytes(params)
    buffer_bytes = _nbytes(model.buffers())  # rotary inv_freq: counted under "params"
    grad_bytes = _nbytes(p.grad for p in params)
    state_bytes = _nbytes(t for s in optimizer.state.values() for t in s.values())
    batch_bytes = _nbytes(batch.values())  # labels is input_ids: one storage
    assert param_bytes == sum(p.numel() * 4 for p in params)
    assert grad_bytes == param_bytes
    assert state_bytes == 2 * param_bytes + 4 * len(params)

    s0, s1 = res
    for m in res:
        _check_consistent(m)
        assert m.at_peak["params"] == param_bytes + buffer_bytes
        assert m.at_peak["gradients"] in (0, grad_bytes) or m.peak_phase == "backward"
        assert m.phase_peaks["forward"] > m.start_bytes  # activations were allocated
        # Everything allocated during the step is freed except the new grads (and states).
        assert m.end_bytes == param_bytes + buffer_bytes + grad_bytes + state_bytes + batch_bytes
    assert s0.start_bytes == param_bytes + buffer_bytes + batch_bytes
    assert s1.start_bytes == s0.start_bytes + state_bytes
    assert s0.at_peak["optimizer"] in (0, state_bytes)
    # Same computation, states alive: forward and backward shift by exactly the states.
    assert s1.phase_peaks["forward"] == s0.phase_peaks["forward"] + state_bytes
    assert s1.phase_peaks["backward"] == s0.phase_peaks["backward"] + state_bytes
    # Steady state peaks in the forward/backward with activations alive, not in the update.
    assert s1.peak_phase in ("forward", "backward")
    assert s1.at_peak["activations"] > 0
    assert s1.at_peak["optimizer"] == state_bytes


def test_tiny_llama_agrees_with_the_allocator_seen_by_the_profiler():
    """Independent check: the profiler's allocator-level [memory] events (which also see
    memory allocated and freed inside kernels) give the same step-1 peak over the start."""
    profiler = pytest.importorskip("torch.profiler")

    def build():
        model, batch = _tiny_llama(attn_implementation="eager")
        return model, batch, torch.optim.AdamW(model.parameters(), lr=1e-3)

    model, batch, optimizer = build()
    s1 = measure_step(model, batch, optimizer, steps=2)[1]

    model, batch, optimizer = build()

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()

    step()  # step 0, unprofiled: creates the states
    optimizer.zero_grad(set_to_none=True)
    with profiler.profile(activities=[profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        step()  # its zero_grad frees nothing: the grads are already gone
    results = getattr(prof.profiler, "kineto_results", None)
    if results is None:
        pytest.skip("profiler results not available")
    mem = [e for e in results.events() if e.name() == "[memory]"]
    mem.sort(key=lambda e: e.start_ns())
    live = peak = 0
    for e in mem:
        live += e.nbytes()
        peak = max(peak, live)
    assert live == s1.end_bytes - s1.start_bytes  # the new grads
    # Up to a few bytes of scalar scratch inside kernels that no op returns.
    assert 0 <= peak - (s1.peak_bytes - s1.start_bytes) <= 64


def test_bf16_autocast_linear_grad_cast_is_counted():
    model, optimizer, batch = _linear_case(torch.optim.SGD)
    (m,) = measure_step(
        model, batch, optimizer, loss_fn=_mse, steps=1, autocast_dtype=torch.bfloat16
    )
    _check_consistent(m)
    W, b, BF16 = 512 * 256 * F32, 512 * F32, 2
    start = W + b + 8 * 256 * F32 + 8 * 512 * F32
    # Forward: bf16 copies of b, W and x (autocast cache), bf16 addmm output; x does not need a
    # grad, so W's bf16 copy is not saved and dies when autocast exits.
    # Backward peak: W's grad is computed in bf16 by the mm, then cast to fp32 (ToCopyBackward)
    # while the bf16 one and the bf16 bias grad are still alive.
    assert m.peak_phase == "backward"
    assert m.peak_bytes == start + 2 * F32 + 512 * 256 * BF16 + W + 512 * BF16
    assert m.at_peak["gradients"] == W  # the fp32 bias grad does not exist yet
    # The batch is temporary now: addmm saved x's bf16 copy (already freed here), not x.
    batch_bytes = 8 * 256 * F32 + 8 * 512 * F32
    assert m.at_peak["temporary"] == batch_bytes + F32 + 512 * 256 * BF16 + 512 * BF16
    assert m.at_peak["activations"] == F32  # the loss


def test_bf16_autocast_tiny_llama_runs():
    model, batch = _tiny_llama()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    fp32 = measure_step(model, batch, optimizer, steps=2)
    model, batch = _tiny_llama()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    bf16 = measure_step(model, batch, optimizer, steps=2, autocast_dtype=torch.bfloat16)
    for m in bf16:
        _check_consistent(m)
    assert bf16[1].start_bytes == fp32[1].start_bytes  # master weights and states stay fp32
    assert bf16[1].phase_peaks["forward"] != fp32[1].phase_peaks["forward"]


def test_memplan_import_does_not_import_torch():
    code = "import sys, memplan; assert 'torch' not in sys.modules, 'memplan imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True)
