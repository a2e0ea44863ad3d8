"""A replay of PyTorch's CUDA caching allocator: reserved memory from a stream of allocations
and frees.

``max_memory_reserved`` is set by the allocator's rules, which are deterministic given the
sizes and order of the requests. ``Allocator`` applies the rules of
``c10/cuda/CUDACachingAllocator.cpp`` (pytorch/pytorch@001074d25084fdb87a799823e395a50f5ec044d3,
``DeviceCachingAllocator``), one stream, no CUDA graphs, no ``roundup_power2_divisions``, no
garbage-collection threshold (the defaults):

- ``round_size``: requests are rounded up to a multiple of 512 B (``kMinBlockSize``);
- ``get_pool``: rounded sizes <= 1 MiB (``kSmallSize``) go to the small pool, others to the
  large pool; each pool caches its own free blocks;
- ``get_allocation_size``: a new segment is 2 MiB (``kSmallBuffer``) for a small request,
  20 MiB (``kLargeBuffer``) for a large one under 10 MiB (``kMinLargeAlloc``), else the request
  rounded up to 2 MiB (``kRoundLarge``);
- ``get_free_block``: best fit, the smallest cached free block of the pool at least as large
  (ties: the lower address); with ``max_split_size`` set, a request under it never takes a
  block at or over it, and one at or over it takes a block only if under request + 20 MiB;
- ``should_split``: the found block is split when what remains is >= 512 B (small pool, or
  expandable segments) or > 1 MiB (large pool, and the request is under ``max_split_size``);
  the request takes the front, the remainder stays cached;
- ``free_block`` / ``try_merge_blocks``: a freed block merges with free neighbours of its
  segment; segments are never returned to CUDA on a free;
- ``malloc`` when no cached block fits: ``alloc_block`` (cudaMalloc); if the device is full,
  ``release_available_cached_blocks`` (only with ``max_split_size``), then
  ``release_cached_blocks`` (every cached block that is a whole segment is cudaFree'd) and a
  retry; reserved is the sum of segments held, so ``max_memory_reserved`` is its maximum;
- expandable segments (``expandable_segments:True``, Note [Expandable Segments]): one segment
  per pool that maps physical pages of 2 MiB (small pool) or 20 MiB (large pool,
  ``find_expandable_block``'s ``segment_size``) at its end as it grows (``map_block``,
  ``try_allocate_expandable_block``); a best-fit block that ends at the unmapped tail counts
  the tail in its size (``get_free_block``); when full, the free pages are unmapped
  (``unmap_block``).

Addresses are modelled as segments laid out in creation order (cudaMalloc's real addresses
are not known; they only break ties between free blocks of equal size). A request the device
cannot hold even after releasing the cache is counted in ``ooms`` and granted anyway, so the
reserved peak then exceeds the capacity.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable

__all__ = ["Allocator", "round_size", "allocation_size", "replay", "K_MIN_BLOCK", "K_SMALL_SIZE",
           "K_SMALL_BUFFER", "K_LARGE_BUFFER", "K_MIN_LARGE_ALLOC", "K_ROUND_LARGE"]

K_MIN_BLOCK = 512
"""``kMinBlockSize``: all sizes are rounded to at least 512 bytes."""
K_SMALL_SIZE = 1048576
"""``kSmallSize``: the largest "small" allocation, 1 MiB."""
K_SMALL_BUFFER = 2097152
"""``kSmallBuffer``: small allocations are packed in 2 MiB segments (and expandable pages)."""
K_LARGE_BUFFER = 20971520
"""``kLargeBuffer``: large allocations under 10 MiB are packed in 20 MiB segments (and the
large pool's expandable pages are 20 MiB)."""
K_MIN_LARGE_ALLOC = 10485760
"""``kMinLargeAlloc``: allocations between 1 and 10 MiB may use a ``kLargeBuffer``."""
K_ROUND_LARGE = 2097152
"""``kRoundLarge``: larger allocations are rounded up to 2 MiB."""
_NO_LIMIT = 1 << 62
"""``max_split_size`` default: ``std::numeric_limits<size_t>::max()`` (no limit)."""
_ADDRESS_SPACE = 1 << 46
"""Virtual address space of one expandable segment (the allocator reserves 1 1/8 x the GPU's
memory; any size larger than the run's peak behaves the same)."""


def round_size(size: int) -> int:
    """``round_size``: up to a multiple of ``kMinBlockSize`` (512 B), at least 512 B."""
    if size < K_MIN_BLOCK:
        return K_MIN_BLOCK
    return K_MIN_BLOCK * ((size + K_MIN_BLOCK - 1) // K_MIN_BLOCK)


def allocation_size(size: int) -> int:
    """``get_allocation_size``: the segment cudaMalloc'd for a rounded request no cached block
    fits: 2 MiB (<= 1 MiB), 20 MiB (< 10 MiB), else the request rounded up to 2 MiB."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * ((size + K_ROUND_LARGE - 1) // K_ROUND_LARGE)


class Block:
    """A range of a segment (``struct Block``): allocated, cached free, or (expandable)
    unmapped address space."""

    __slots__ = ("size", "ptr", "small", "allocated", "prev", "next", "mapped", "expandable",
                 "requested")

    def __init__(self, size: int, ptr: int, small: bool, expandable: bool = False) -> None:
        self.size, self.ptr, self.small, self.expandable = size, ptr, small, expandable
        self.allocated = False
        self.requested = 0
        self.mapped = True
        self.prev: Block | None = None
        self.next: Block | None = None

    @property
    def key(self) -> tuple[int, int]:
        """``BlockComparatorSize`` on one stream: by size, then address."""
        return (self.size, self.ptr)


class _Pool:
    """``BlockPool``: the cached free blocks, ordered by (size, address); and (expandable) the
    unmapped blocks, by address."""

    __slots__ = ("small", "keys", "blocks", "unmapped")

    def __init__(self, small: bool) -> None:
        self.small = small
        self.keys: list[tuple[int, int]] = []
        self.blocks: dict[tuple[int, int], Block] = {}
        self.unmapped: dict[int, Block] = {}

    def insert(self, b: Block) -> None:
        k = (b.size, b.ptr)  # Block.key, spelled out: the replay's innermost call
        insort(self.keys, k)
        self.blocks[k] = b

    def erase(self, b: Block) -> None:
        k = (b.size, b.ptr)
        del self.keys[bisect_left(self.keys, k)]
        del self.blocks[k]


class Allocator:
    """One device's caching allocator, replayed. ``capacity``: bytes cudaMalloc can hand out
    (None: unlimited, nothing is ever released); ``expandable``: ``expandable_segments:True``;
    ``max_split_size``: ``max_split_size_mb`` in bytes (None: unlimited, the default)."""

    def __init__(self, *, capacity: int | None = None, expandable: bool = False,
                 max_split_size: int | None = None) -> None:
        self.capacity = capacity
        self.expandable = expandable
        self.max_split = _NO_LIMIT if max_split_size is None else max_split_size
        self.pools = {True: _Pool(True), False: _Pool(False)}
        self.reserved = self.allocated = self.requested = 0
        self.peak_reserved = self.peak_allocated = self.peak_requested = 0
        """``reserved_bytes``, ``allocated_bytes`` (block sizes), ``requested_bytes`` (the
        requests' own bytes): current and peak."""
        self.segments = 0
        self.ooms = 0
        self._next_ptr = K_LARGE_BUFFER

    # -- malloc -------------------------------------------------------------------------------
    def malloc(self, nbytes: int) -> Block:
        """``malloc``: a block of ``round_size(nbytes)`` bytes."""
        size = K_MIN_BLOCK * ((nbytes + K_MIN_BLOCK - 1) // K_MIN_BLOCK) or K_MIN_BLOCK
        pool = self.pools[size <= K_SMALL_SIZE]
        block = self._get_free_block(pool, size)
        if block is None:
            block = self._alloc_block(pool, size)
            if block is None and self._release_available(pool, size):
                block = self._alloc_block(pool, size)
            if block is None:
                self._release_cached()
                block = self._alloc_block(pool, size)
            if block is None:  # out of memory: counted, and granted beyond the capacity
                self.ooms += 1
                block = self._alloc_block(pool, size, force=True)
        assert block is not None
        if self._should_split(block, size):
            rest = Block(block.size - size, block.ptr + size, block.small, block.expandable)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            pool.insert(rest)
        block.allocated, block.requested = True, nbytes
        self.allocated += block.size
        self.requested += nbytes
        if self.allocated > self.peak_allocated:
            self.peak_allocated = self.allocated
        if self.requested > self.peak_requested:
            self.peak_requested = self.requested
        return block

    def _should_split(self, block: Block, size: int) -> bool:
        """``should_split``."""
        remaining = block.size - size
        if block.small or self.expandable:
            return remaining >= K_MIN_BLOCK
        return size < self.max_split and remaining > K_SMALL_SIZE

    def _get_free_block(self, pool: _Pool, size: int) -> Block | None:
        """``get_free_block``: best fit, with the expandable tail and ``max_split_size``."""
        keys = pool.keys
        i = bisect_left(keys, (size, -1))
        if i == len(keys):
            return None
        b = pool.blocks[keys[i]]
        if b.expandable:
            if self.expandable:
                def grow(x: Block) -> int:
                    return x.size + (x.next.size if x.next is not None and not x.next.mapped
                                     else 0)
                j = i + 1
                while b.expandable and j < len(keys) and grow(pool.blocks[keys[j]]) < grow(b):
                    b, j = pool.blocks[keys[j]], j + 1
            else:  # expandable blocks made earlier are skipped once the option is off
                j = i
                while j < len(keys) and pool.blocks[keys[j]].expandable:
                    j += 1
                if j == len(keys):
                    return None
                b = pool.blocks[keys[j]]
        if size < self.max_split <= b.size:
            return None
        if size >= self.max_split and b.size >= size + K_LARGE_BUFFER:
            return None
        pool.erase(b)
        return b

    def _fits(self, nbytes: int) -> bool:
        return self.capacity is None or self.reserved + nbytes <= self.capacity

    def _alloc_block(self, pool: _Pool, size: int, force: bool = False) -> Block | None:
        """``alloc_block``: a new segment (cudaMalloc), or pages mapped onto the pool's
        expandable segment; None when the device cannot hold it."""
        if self.expandable:
            return self._expandable_block(pool, size, force)
        alloc = allocation_size(size)
        if not (force or self._fits(alloc)):
            return None
        b = Block(alloc, self._next_ptr, pool.small)
        self._next_ptr += alloc
        self._grow(alloc)
        self.segments += 1
        return b

    def _grow(self, nbytes: int) -> None:
        self.reserved += nbytes
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def _release_available(self, pool: _Pool, size: int) -> bool:
        """``release_available_cached_blocks``: with ``max_split_size``, free the smallest
        oversize whole block that covers the request, else oversize blocks from the largest
        down until enough is freed."""
        if self.max_split == _NO_LIMIT:
            return False
        want = max(size, self.max_split)
        keys = pool.keys
        i = bisect_left(keys, (want, -1))
        if i < len(keys):
            self._release_block(pool, pool.blocks[keys[i]])
            return True
        freed = 0
        for k in reversed(list(keys)):
            b = pool.blocks[k]
            if freed >= want or b.size < self.max_split:
                break
            freed += b.size
            self._release_block(pool, b)
        return freed >= want

    def _release_block(self, pool: _Pool, b: Block) -> None:
        """``release_block``: cudaFree of a cached block (``release_blocks`` only passes whole
        segments)."""
        pool.erase(b)
        self.reserved -= b.size
        self.segments -= 1

    def _release_cached(self) -> None:
        """``release_cached_blocks``: every cached block that is a whole segment is freed;
        expandable segments unmap their free pages (``release_blocks``)."""
        for pool in self.pools.values():
            for k in list(pool.keys):
                b = pool.blocks[k]
                if b.expandable:
                    self._unmap(pool, b)
                elif b.prev is None and b.next is None:
                    self._release_block(pool, b)

    # -- free ---------------------------------------------------------------------------------
    def free(self, block: Block) -> None:
        """``free`` / ``free_block``: the block is cached, merged with free neighbours."""
        assert block.allocated, "double free"
        block.allocated = False
        self.allocated -= block.size
        self.requested -= block.requested
        pool = self.pools[block.small]
        for other in (block.prev, block.next):
            if other is not None and not other.allocated:
                self._merge(block, other, pool)
        pool.insert(block)

    @staticmethod
    def _merge(dst: Block, src: Block | None, pool: _Pool) -> None:
        """``try_merge_blocks``: absorb a free neighbour of the same mapping."""
        if src is None or src.allocated or src.mapped != dst.mapped:
            return
        if src.mapped:
            pool.erase(src)
        else:
            del pool.unmapped[src.ptr]
        if dst.prev is src:
            dst.ptr, dst.prev = src.ptr, src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size

    # -- expandable segments ------------------------------------------------------------------
    @staticmethod
    def _page(pool: _Pool) -> int:
        return K_SMALL_BUFFER if pool.small else K_LARGE_BUFFER

    def _expandable_block(self, pool: _Pool, size: int, force: bool) -> Block | None:
        """``try_allocate_expandable_block``: map pages at the lowest address with room."""
        c = self._find_expandable(pool, size)
        if not c.mapped and not self._map(pool, c, min(c.size, size), force):
            return None
        while c.size < size:
            nxt = c.next
            assert nxt is not None and not nxt.mapped
            if not self._map(pool, nxt, min(size - c.size, nxt.size), force):
                return None
            c = nxt
        pool.erase(c)
        return c

    def _find_expandable(self, pool: _Pool, size: int) -> Block:
        """``find_expandable_block``: the lowest unmapped range (with the free block before
        it) that holds ``size``; else a new segment's whole address space."""
        def free(b: Block | None) -> bool:
            return b is not None and not b.allocated

        for ptr in sorted(pool.unmapped):
            c = pool.unmapped[ptr]
            if free(c.prev) and c.prev.mapped:  # type: ignore[union-attr]
                c = c.prev  # type: ignore[assignment]
            room, b = 0, c
            while room < size and free(b):
                room += b.size  # type: ignore[union-attr]
                b = b.next  # type: ignore[union-attr]
            if room >= size:
                return c
        step = K_LARGE_BUFFER  # page-aligned start, for ``_unmap``'s page arithmetic
        self._next_ptr = step * (-(-self._next_ptr // step))
        c = Block(_ADDRESS_SPACE, self._next_ptr, pool.small, expandable=True)
        c.mapped = False
        self._next_ptr += _ADDRESS_SPACE
        pool.unmapped[c.ptr] = c
        self.segments += 1
        return c

    def _map(self, pool: _Pool, b: Block, size: int, force: bool) -> bool:
        """``map_block``: back the first ``size`` bytes of unmapped ``b`` with whole pages,
        merged with free mapped neighbours and cached."""
        page = self._page(pool)
        mapped = page * ((size + page - 1) // page)
        if not (force or self._fits(mapped)):
            return False
        del pool.unmapped[b.ptr]
        b.mapped = True
        if mapped < b.size:
            rest = Block(b.size - mapped, b.ptr + mapped, b.small, expandable=True)
            rest.mapped = False
            rest.prev, rest.next = b, b.next
            if b.next is not None:
                b.next.prev = rest
            b.next = rest
            pool.unmapped[rest.ptr] = rest
            b.size = mapped
        self._merge(b, b.prev, pool)
        self._merge(b, b.next, pool)
        pool.insert(b)
        self._grow(mapped)
        return True

    def _unmap(self, pool: _Pool, b: Block) -> None:
        """``unmap_block``: the whole pages inside free ``b`` go back to CUDA."""
        page = self._page(pool)
        begin = page * (-(-b.ptr // page))  # segments start on a 20 MiB boundary
        end = page * ((b.ptr + b.size) // page)
        if begin >= end:
            return
        pool.erase(b)
        for lo, hi in ((b.ptr, begin), (end, b.ptr + b.size)):
            if hi > lo:
                part = Block(hi - lo, lo, b.small, expandable=True)
                if lo < begin:
                    part.prev, part.next = b.prev, b
                    if b.prev is not None:
                        b.prev.next = part
                    b.prev = part
                else:
                    part.prev, part.next = b, b.next
                    if b.next is not None:
                        b.next.prev = part
                    b.next = part
                pool.insert(part)
        b.ptr, b.size, b.mapped = begin, end - begin, False
        self.reserved -= b.size
        self._merge(b, b.prev, pool)
        self._merge(b, b.next, pool)
        pool.unmapped[b.ptr] = b


def replay(events: Iterable[tuple[int, int]], **options: object) -> Allocator:
    """Replay ``events`` through a fresh ``Allocator(**options)``: ``(tensor id, bytes)`` with
    bytes > 0 allocates the tensor, 0 frees it (a tensor is allocated at most once at a
    time)."""
    a = Allocator(**options)  # type: ignore[arg-type]
    live: dict[int, Block] = {}
    for tid, nbytes in events:
        if nbytes:
            live[tid] = a.malloc(nbytes)
        else:
            a.free(live.pop(tid))
    return a
