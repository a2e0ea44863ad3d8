"""DeepSpeed ZeRO-3 gathered parameters per step (estimate/zero3_live.py), on hand-traced
module sequences: forward order a, b, c then backward c, b, a."""

from memplan.estimate.zero3_live import Use, live_gathered, trace_order


def peaks(mods, **kw):
    g = live_gathered(mods, **kw)
    return g.forward_peak, g.backward_peak

MODS = [Use(numel=10, nbytes=20), Use(numel=10, nbytes=20), Use(numel=10, nbytes=20)]


def test_no_reuse_no_prefetch_gathers_one_module_at_a_time():
    assert peaks(MODS, max_live=10**9, reuse=0, prefetch=0) == (20, 20)


def test_default_reuse_keeps_every_module_to_its_backward():
    # reuse 1e9 > the whole trace: nothing is released before its backward use
    g = live_gathered(MODS, max_live=10**9, reuse=10**9, prefetch=0)
    assert g.per_use == (20, 40, 60, 60, 40, 20) and g.after_forward == 60


def test_reuse_distance_keeps_only_modules_reused_soon():
    # c: reused at once (0 elements between) -> kept; b: c fwd + c bwd = 20 elements between,
    # not < 15 -> released; a: 40 -> released. Forward peak: a alone, b alone, then c.
    assert peaks(MODS, max_live=10**9, reuse=15, prefetch=0) == (20, 20)
    # reuse 25: b kept too (20 < 25); at c's forward b and c are gathered, c's backward as well
    assert peaks(MODS, max_live=10**9, reuse=25, prefetch=0) == (40, 40)


def test_prefetch_gathers_ahead_and_max_live_caps_it():
    # prefetch 10: at a, b is gathered ahead -> two modules at a time
    fwd, _ = peaks(MODS, max_live=10**9, reuse=0, prefetch=10)
    assert fwd == 40
    # max_live 10: a alone already holds 10 elements, so nothing is prefetched
    assert peaks(MODS, max_live=10, reuse=0, prefetch=10) == (20, 20)


def test_persistent_modules_are_not_counted():
    mods = [Use(numel=1, nbytes=2, persistent=True)] + MODS
    assert peaks(mods, max_live=10**9, reuse=0, prefetch=0) == (20, 20)


def test_reuse_zero_keeps_nothing_into_the_backward():
    assert live_gathered(MODS, max_live=10**9, reuse=0, prefetch=0).after_forward == 0


def test_each_release_is_recorded_for_the_next_use():
    # reuse 0: every use releases its module; the use after it still counts those bytes
    g = live_gathered([Use(numel=10, nbytes=20), Use(numel=5, nbytes=10),
                       Use(numel=1, nbytes=2)], max_live=10**9, reuse=1e9, prefetch=0)
    assert g.released == (0, 0, 0, 2, 10, 20)  # c is released only after its backward use
    assert [g.held_before(k) for k in range(6)] == [0, 0, 0, 0, 2, 10]
    g0 = live_gathered(MODS, max_live=10**9, reuse=0, prefetch=0)
    assert g0.released == (20,) * 6 and g0.held_before(3) == 20 and g0.held_before(0) == 0


def test_persistent_and_prefetched_modules_release_nothing():
    mods = [Use(numel=1, nbytes=2, persistent=True)] + MODS
    assert live_gathered(mods, max_live=10**9, reuse=0, prefetch=0).released[0] == 0


def test_trace_order_reruns_a_checkpointed_unit_before_its_backward():
    order, where = trace_order([1, 2, 1], [False, True, False])
    assert order == [0, 1, 2, 3, 3, 1, 2, 2, 1, 0]
    assert where[(1, True)] == [5, 6, 7, 8]


def test_recompute_keeps_the_layer_gathered_through_its_backward():
    # unit 1 (two modules of 10) recomputed: with reuse 25 each module stays from its rerun to
    # its backward, so both are gathered at once (40 B), never more than one before
    mods = [Use(numel=10, nbytes=20)] * 4
    order, _ = trace_order([1, 2, 1], [False, True, False])
    g = live_gathered(mods, max_live=10**9, reuse=25, prefetch=0, order=order)
    assert max(g.per_use[5:9]) == 40
    plain = live_gathered(mods, max_live=10**9, reuse=0, prefetch=0, order=order)
    assert max(plain.per_use) == 20


def _gathered(model, device, **kw):
    """'ZeRO-3 gathered parameters' per moment label of the steady step, and the peak."""
    from memplan import Recipe, estimate

    rank = estimate(model, Recipe.of(precision="bf16-mixed", engine="deepspeed", zero=3, **kw),
                    device).ranks[0]
    items = {f"{m.phase}/{m.label}": i.bytes for m in rank.moments for i in m.items
             if i.name == "ZeRO-3 gathered parameters"}
    return items, rank.peak_allocated_bytes


def test_reuse_distance_moves_the_estimate(llama8b, h100):
    # Llama-8B: the head (128256 x 4096) is used again right after its forward, so reuse 1e9
    # keeps it gathered at the loss; a layer's modules are further than 1e9 elements from their
    # backward (the head's forward and backward alone are 1.05e9), so they are released.
    # Reuse 0 releases every module after its use: nothing is gathered at the loss, but the
    # head's buffer, released last, is still counted there (rule 6: its all-gather's work
    # object may hold it until the communication thread drops it).
    keep, peak_keep = _gathered(llama8b, h100, gpus=8, stage3_prefetch_bucket_size=0)
    drop, peak_drop = _gathered(llama8b, h100, gpus=8, stage3_prefetch_bucket_size=0,
                                stage3_max_reuse_distance=0)
    head = 128256 * 4096 * 2
    loss = next(k for k in keep if k.startswith("backward") and k.endswith("loss"))
    assert (keep[loss], drop[loss]) == (head, head)
    # one module at a time plus the one released before it: the most is the head's backward
    # fetch while its forward buffer, released before the loss, may still be referenced
    assert max(drop.values()) == drop["backward/backward: head"] == 2 * head
    # the upper state of rule 6 costs reuse 0 one head at the head's backward fetch (reuse
    # 1e9 re-uses the kept one): the backward peak is then higher than with reuse 1e9
    assert keep["backward/backward: head"] == head
    assert peak_drop > peak_keep


def test_backward_holds_one_parameter_gradient_not_a_unit(llama8b, h100):
    # rule 7: the loss's backward holds no 16-bit gradient; a layer's backward its largest
    # parameter's (the 14336 x 4096 MLP matrix), not the whole layer's
    from memplan import Recipe, estimate

    rank = estimate(llama8b, Recipe.of(precision="bf16-mixed", engine="deepspeed", zero=3,
                                       gpus=8), h100).ranks[0]
    grads = {m.label: i.bytes for m in rank.moments for i in m.items
             if i.name == "16-bit gradient before its reduce hook"}
    names = {i.name for m in rank.moments for i in m.items}
    assert "unsharded gradients of one unit" not in names
    assert not any(k.endswith("loss") for k in grads)
    assert grads["backward: layer 3"] == 14336 * 4096 * 2


def test_one_gpu_gathers_nothing_extra(llama8b, h100):
    # a one-rank partition is the whole tensor: the gathered parameter is a view of it
    # (partition_parameters.py _no_gather_coalesced), so no item
    assert _gathered(llama8b, h100, gpus=1)[0] == {}


def test_reuse_distance_round_trips_through_the_ds_config():
    import json

    from memplan import Recipe
    from memplan.export import export
    from memplan.export.deepspeed import from_ds_config

    r = Recipe.of(engine="deepspeed", zero=3, gpus=2, stage3_max_reuse_distance=12345)
    cfg = json.loads(export(r, "deepspeed").text)
    assert cfg["zero_optimization"]["stage3_max_reuse_distance"] == 12345
    assert from_ds_config(cfg).keys["stage3_max_reuse_distance"] == 12345
