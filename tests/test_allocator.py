"""``estimate/allocator.py`` against reserved bytes worked out by hand from the rules of
``CUDACachingAllocator.cpp`` (pytorch/pytorch@001074d, the functions named in each test)."""

from __future__ import annotations

import pytest

from memplan.estimate.allocator import Allocator, allocation_size, replay, round_size
from memplan.units import MIB


def test_round_size_and_allocation_size() -> None:
    """``round_size``: multiples of 512 B, at least 512; ``get_allocation_size``: 2 MiB for
    small requests, 20 MiB under 10 MiB, else rounded up to 2 MiB."""
    assert round_size(1) == 512
    assert round_size(512) == 512
    assert round_size(700_000) == 1368 * 512 == 700_416
    assert allocation_size(MIB) == 2 * MIB
    assert allocation_size(MIB + 512) == 20 * MIB
    assert allocation_size(10 * MIB - 512) == 20 * MIB
    assert allocation_size(10 * MIB) == 10 * MIB
    assert allocation_size(11 * MIB + 512) == 12 * MIB


def test_three_700kb_requests_take_two_small_segments() -> None:
    """700,000 B rounds to 700,416 B (small pool). The first takes a new 2 MiB segment and is
    split (1,396,736 B left >= 512); the second is cut from that remainder (696,320 B left);
    the third does not fit in 696,320 B, so a second 2 MiB segment: 4 MiB reserved."""
    a = Allocator()
    for _ in range(3):
        a.malloc(700_000)
    assert a.reserved == a.peak_reserved == 4 * MIB
    assert a.allocated == 3 * 700_416
    assert a.segments == 2


def test_large_requests_under_10_mib_pack_into_20_mib_segments() -> None:
    """5 MiB requests share a 20 MiB ``kLargeBuffer``: four fill it (the last leaves 0, not
    split), the fifth opens a second one: 40 MiB reserved for 25 MiB allocated."""
    a = Allocator()
    for _ in range(5):
        a.malloc(5 * MIB)
    assert a.reserved == 40 * MIB
    assert a.allocated == 25 * MIB


def test_large_pool_keeps_a_remainder_of_1_mib_or_less_in_the_block() -> None:
    """``should_split`` in the large pool needs more than 1 MiB left: 19 MiB + 1 B rounds to a
    20 MiB segment whose 1 MiB - 512 B rest stays in the block, so 20 MiB count as allocated
    (``allocated_bytes`` counts block sizes)."""
    a = Allocator()
    a.malloc(19 * MIB + 1)
    assert a.reserved == 20 * MIB
    assert a.allocated == 20 * MIB


def test_best_fit_split_leaves_a_hole_a_larger_request_cannot_use() -> None:
    """100 MiB allocated and freed (cached); 60 MiB is cut from it (40 MiB left cached); 50 MiB
    fits no cached block, so a new 50 MiB segment: 150 MiB reserved, 110 MiB allocated."""
    a = Allocator()
    big = a.malloc(100 * MIB)
    a.free(big)
    a.malloc(60 * MIB)
    a.malloc(50 * MIB)
    assert a.reserved == a.peak_reserved == 150 * MIB
    assert a.allocated == a.peak_allocated == 110 * MIB


def test_best_fit_takes_the_smallest_block_that_fits() -> None:
    """Cached free blocks of 30 and 50 MiB (separate segments); a 28 MiB request takes the
    30 MiB one (2 MiB left is > 1 MiB, so split), then 50 MiB still fits the other: no new
    segment, 80 MiB reserved."""
    a = Allocator()
    x, y = a.malloc(30 * MIB), a.malloc(50 * MIB)
    a.free(x)
    a.free(y)
    assert a.malloc(28 * MIB).size == 28 * MIB
    a.malloc(50 * MIB)
    assert a.reserved == 80 * MIB


def test_freed_neighbours_merge() -> None:
    """Four 5 MiB blocks fill one 20 MiB segment; freeing the middle two merges them into one
    10 MiB block (``try_merge_blocks``), which then holds a 10 MiB request: still 20 MiB."""
    a = Allocator()
    blocks = [a.malloc(5 * MIB) for _ in range(4)]
    a.free(blocks[1])
    a.free(blocks[2])
    a.malloc(10 * MIB - 512)  # under kMinLargeAlloc: would open a 20 MiB segment if no fit
    assert a.reserved == 20 * MIB


def test_small_and_large_pools_do_not_share() -> None:
    """A freed 2 MiB small segment's blocks cannot serve a large request and vice versa: a
    1 MiB request after a freed 2 MiB (large) block opens a 2 MiB small segment."""
    a = Allocator()
    a.free(a.malloc(2 * MIB))  # large pool: a 20 MiB segment, now all free
    a.malloc(MIB)
    assert a.reserved == 22 * MIB


def test_full_device_releases_cached_segments_and_retries() -> None:
    """Capacity 100 MiB: 60 MiB freed stays cached; a 70 MiB request fits no block and 60 + 70
    exceeds the device, so ``release_cached_blocks`` frees the whole cached segment and the
    retry succeeds: 70 MiB reserved, peak 70 MiB, no OOM."""
    a = Allocator(capacity=100 * MIB)
    a.free(a.malloc(60 * MIB))
    a.malloc(70 * MIB)
    assert (a.reserved, a.peak_reserved, a.ooms) == (70 * MIB, 70 * MIB, 0)


def test_split_segments_are_not_released() -> None:
    """A segment partly in use is not released (only whole cached segments are): capacity
    100 MiB, 60 MiB segment split 30 + 30 with one half live, then 50 MiB: 110 MiB > 100 MiB
    even after releasing, so it is counted as an OOM."""
    a = Allocator(capacity=100 * MIB)
    big = a.malloc(60 * MIB)
    a.free(big)
    a.malloc(30 * MIB)
    a.malloc(50 * MIB)
    assert a.ooms == 1
    assert a.peak_reserved == 110 * MIB


def test_max_split_size_keeps_oversize_blocks_whole() -> None:
    """``max_split_size_mb:64``: a cached 100 MiB block is oversize; a 60 MiB request (under
    the limit) may not take it, so a new segment (160 MiB); a 90 MiB request (over the limit)
    takes it only if it is under 90 + 20 MiB, which it is (not split): still 160 MiB."""
    a = Allocator(max_split_size=64 * MIB)
    big = a.malloc(100 * MIB)
    a.free(big)
    a.malloc(60 * MIB)
    assert a.reserved == 160 * MIB
    b = a.malloc(90 * MIB)
    assert b.size == 100 * MIB
    assert a.reserved == 160 * MIB


def test_expandable_segment_grows_in_20_mib_pages_and_reuses_its_tail() -> None:
    """``expandable_segments:True``: 30 MiB maps two 20 MiB pages (40 MiB), 10 MiB stays free
    at the end; freed, the 40 MiB block holds a 40 MiB request: 40 MiB reserved, where
    separate segments take 30 + 40 = 70 MiB."""
    a = Allocator(expandable=True)
    a.free(a.malloc(30 * MIB))
    a.malloc(40 * MIB)
    assert a.reserved == 40 * MIB
    plain = Allocator()
    plain.free(plain.malloc(30 * MIB))
    plain.malloc(40 * MIB)
    assert plain.reserved == 70 * MIB


def test_expandable_segment_maps_only_the_missing_pages() -> None:
    """5 MiB in an expandable segment maps one 20 MiB page; 12 MiB more is cut from the free
    15 MiB; then 30 MiB does not fit the 3 MiB left, so the free block at the end is extended:
    27 MiB more is two pages, 60 MiB reserved in all; small requests use 2 MiB pages."""
    a = Allocator(expandable=True)
    a.malloc(5 * MIB)
    a.malloc(12 * MIB)
    assert a.reserved == 20 * MIB
    a.malloc(30 * MIB)
    assert a.reserved == 60 * MIB
    a.malloc(1000)
    assert a.reserved == 62 * MIB


def test_expandable_segment_unmaps_free_pages_when_full() -> None:
    """Capacity 60 MiB: 40 MiB mapped and freed, then a 2 MiB small request needs a small
    page and a 50 MiB request cannot be served by the 40 MiB free block: the free pages are
    unmapped (40 MiB back) and 50 MiB is mapped as three pages: 60 + 2 MiB > 60 MiB, an OOM,
    peak 62 MiB; with 70 MiB it fits: 62 MiB peak, no OOM."""
    for cap, ooms in ((60 * MIB, 1), (70 * MIB, 0)):
        a = Allocator(expandable=True, capacity=cap)
        a.free(a.malloc(40 * MIB))
        a.malloc(1000)
        a.malloc(50 * MIB)
        assert a.ooms == ooms
        assert a.reserved == 62 * MIB


def test_replay_of_an_event_stream() -> None:
    """``replay``: (id, bytes) allocates, (id, 0) frees; the fragmentation of the best-fit
    test, through the stream interface."""
    a = replay([(1, 100 * MIB), (1, 0), (2, 60 * MIB), (3, 50 * MIB)])
    assert (a.peak_reserved, a.peak_allocated) == (150 * MIB, 110 * MIB)
    with pytest.raises(KeyError):
        replay([(1, 0)])
