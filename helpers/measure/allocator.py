"""A model of PyTorch's CUDA caching allocator: what a step *reserves*, replayed from a dry run's allocations.

Tensor bytes (what the tracker counts) are not what a GPU holds. The caching allocator asks CUDA for whole segments,
cuts blocks out of them and keeps freed blocks cached for reuse; `torch.cuda.memory_reserved()` is the segments, and
a run dies when one more segment cannot be had. This module replays the exact sequence of allocations and frees
of a step through the allocator's rules (`helpers.measure.reserved` replays the tracker's event log through it and
reports, per phase, allocated and reserved bytes, the largest free cached block, and fragmentation).

Which rules, and how we know them: read from PyTorch's `c10/cuda/CUDACachingAllocator.cpp` (the copy read is
pytorch/pytorch at commit 001074d2, a 2.x main-branch snapshot; the installed torch 2.13.0 is a CPU wheel without the
.cpp, so these are the rules of that source, which we take to hold for 2.13) and `c10/core/AllocatorConfig.cpp`
(commit 0ac71663) for the options. The names below are the source's:
- every request is rounded up to a multiple of kMinBlockSize (512 B) (`round_size`);
- requests <= kSmallSize (1 MiB) use the small pool, whose segments are kSmallBuffer (2 MiB); larger ones the large
  pool, whose segments are kLargeBuffer (20 MiB) for requests under kMinLargeAlloc (10 MiB), else the request
  rounded up to kRoundLarge (2 MiB) (`get_allocation_size`);
- a request takes the smallest cached block that fits (ties: lowest address) (`get_free_block`); with
  `max_split_size_mb` set, a request under it never takes a block at or over it, and a request at or over it takes a
  block only if that is less than kLargeBuffer bigger;
- a block is split when the rest is worth keeping: in the small pool (or with expandable segments) when the rest is
  >= kMinBlockSize; in the large pool when the rest is > kSmallSize and the request is under max_split_size
  (`should_split`); a freed block merges with free neighbours of its segment (`free_block`, `try_merge_blocks`);
- freed blocks stay cached (reserved); when CUDA cannot give a new segment (here: when it would pass `limit_bytes`),
  the allocator first frees cached oversize blocks (only with max_split_size set: `release_available_cached_blocks`),
  then every cached block that is a whole segment (`release_cached_blocks`, what `torch.cuda.empty_cache()` does),
  and retries once before raising out of memory;
- `expandable_segments:True`: one segment per pool that grows by mapping pages (2 MiB small, 20 MiB large) for the
  rounded request rather than cudaMalloc-ing alloc sizes; a new request maps at the lowest address with room; freeing
  memory (empty_cache, or before an OOM) unmaps only whole free pages (`try_allocate_expandable_block`, `map_block`,
  `unmap_block`).

Left out: streams (one stream; cross-stream frees and `record_stream` delays), NCCL's own allocations (its buffers
are outside this allocator; `helpers.gpus` adds them), CUDA graphs' private pools, `roundup_power2_divisions`,
`garbage_collection_threshold`, `max_non_split_rounding_mb` (its default, kLargeBuffer, is used), per-process memory
fractions, and scratch memory inside one op that the tracker cannot see.

Addresses: best fit breaks ties between free blocks of one size by address, so where CUDA puts a new segment
decides which of two equal blocks is cut, and through later merges what the reserve becomes. Each new segment is
placed below the ones before it: on an H100 (driver 580.159.04, torch 2.11.0+cu130) cudaMalloc handed out 634 of
645 segments of a Qwen3-8B step below the previous one (`python -m helpers.bench gpu`, recorded allocator trace).
Replayed on that run's own allocations and frees, segments laid out upwards gave a reserve of 70.78 GiB, laid out
downwards 75.41 GiB: the GPU's own figure to the MiB.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from helpers.errors import InputError
from helpers.units import MiB

kMinBlockSize = 512                # all sizes are rounded to at least 512 bytes
kSmallSize = 1 * MiB               # largest "small" allocation
kSmallBuffer = 2 * MiB             # "small" allocations are packed in 2 MiB segments
kLargeBuffer = 20 * MiB            # "large" allocations may be packed in 20 MiB segments
kMinLargeAlloc = 10 * MiB          # allocations between 1 and 10 MiB may use kLargeBuffer
kRoundLarge = 2 * MiB              # large allocations are rounded up to 2 MiB
SOURCE = ("pytorch/pytorch c10/cuda/CUDACachingAllocator.cpp (commit 001074d2) and c10/core/AllocatorConfig.cpp "
          "(commit 0ac71663)")
_VA = 1 << 50                      # an expandable segment's address space (the source: 1.125 x the GPU's memory)


@dataclass(frozen=True)
class Config:
    """The allocator's settings, as PYTORCH_CUDA_ALLOC_CONF sets them."""

    expandable_segments: bool = False
    max_split_size: int | None = None        # bytes; None: unlimited (the default, SIZE_MAX)

    @classmethod
    def parse(cls, text: str | None) -> "Config":
        """'expandable_segments:True,max_split_size_mb:128' -> Config; InputError naming a bad key or value."""
        fields = {}
        for part in (text or "").split(","):
            if not part.strip():
                continue
            key, _, value = (s.strip() for s in part.partition(":"))
            if key == "expandable_segments" and value in ("True", "False"):
                fields["expandable_segments"] = value == "True"
            elif key == "max_split_size_mb" and value.isascii() and value.isdigit() and int(value) >= kLargeBuffer // MiB:
                fields["max_split_size"] = int(value) * MiB
            else:
                raise InputError(
                    f"allocator setting must be expandable_segments:True|False or max_split_size_mb:N with N >= "
                    f"{kLargeBuffer // MiB} (PyTorch's minimum), comma-separated, got {part.strip()!r}")
        return cls(**fields)

    def __str__(self) -> str:
        parts = (["expandable_segments:True"] if self.expandable_segments else []) + (
            [f"max_split_size_mb:{self.max_split_size // MiB}"] if self.max_split_size else [])
        return ",".join(parts) or "default"


def round_size(nbytes: int) -> int:
    """A request's size as the allocator books it: a multiple of kMinBlockSize (512 B), at least 512."""
    return max(kMinBlockSize, -(-nbytes // kMinBlockSize) * kMinBlockSize)


def allocation_size(size: int) -> int:
    """The segment cudaMalloc'd for a (rounded) request that no cached block can serve."""
    if size <= kSmallSize:
        return kSmallBuffer
    if size < kMinLargeAlloc:
        return kLargeBuffer
    return -(-size // kRoundLarge) * kRoundLarge


class OutOfMemory(Exception):
    """No cached block fits and a new segment would pass the limit, even after freeing the cache."""

    def __init__(self, requested: int, segment: int):
        super().__init__(f"out of memory: asked for {requested} bytes (a {segment}-byte segment)")
        self.requested, self.segment = requested, segment


class Block:
    __slots__ = ("addr", "size", "pool", "prev", "next", "allocated", "mapped")

    def __init__(self, addr: int, size: int, pool: "Pool", mapped: bool = True):
        self.addr, self.size, self.pool, self.mapped = addr, size, pool, mapped
        self.prev = self.next = None
        self.allocated = False

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def link_before(self, other: "Block") -> None:
        """Put this (new) block in front of `other` in its segment's list."""
        self.prev, self.next = other.prev, other
        if other.prev is not None:
            other.prev.next = self
        other.prev = self

    def link_after(self, other: "Block") -> None:
        """Put this (new) block right after `other` in its segment's list."""
        self.prev, self.next = other, other.next
        if other.next is not None:
            other.next.prev = self
        other.next = self


class Pool:
    """Cached free blocks of one pool, ordered by (size, address) as the source's BlockComparatorSize does."""

    def __init__(self, small: bool):
        self.small = small
        self.page = kSmallBuffer if small else kLargeBuffer      # an expandable segment's page
        self.keys: list[tuple[int, int]] = []
        self.blocks: dict[int, Block] = {}
        self.unmapped: list[Block] = []                          # expandable segments' unmapped ranges

    def insert(self, b: Block) -> None:
        bisect.insort(self.keys, (b.size, b.addr))
        self.blocks[b.addr] = b

    def remove(self, b: Block) -> None:
        i = bisect.bisect_left(self.keys, (b.size, b.addr))
        del self.keys[i]
        del self.blocks[b.addr]

    def largest(self) -> int:
        return self.keys[-1][0] if self.keys else 0


class CachingAllocator:
    """One device's caching allocator (one stream). `limit_bytes`: what CUDA can give it (None: no limit)."""

    def __init__(self, config: Config = Config(), limit_bytes: int | None = None):
        self.config, self.limit = config, limit_bytes
        self.small, self.large = Pool(True), Pool(False)
        self.allocated = self.reserved = self.requested = 0
        self.segments = 0
        self._next_addr = 1 << 40                 # expandable segments' address space, upwards
        self._next_top = 1 << 52                  # cudaMalloc'd segments, downwards (CUDA's order: see the module)
        self._expandable: dict[bool, bool] = {}

    # -- public ------------------------------------------------------------------------------------------------
    def malloc(self, nbytes: int) -> Block:
        """A block for `nbytes`; OutOfMemory when the limit forbids a new segment even after freeing the cache."""
        size = round_size(nbytes)
        pool = self.small if size <= kSmallSize else self.large
        block = self._get_free_block(pool, size)
        if block is None:
            alloc = allocation_size(size)
            block = (self._alloc_block(pool, size, alloc)
                     or (self._release_available(pool, size) and self._alloc_block(pool, size, alloc))
                     or (self.empty_cache() or self._alloc_block(pool, size, alloc)))
            if not block:
                raise OutOfMemory(size, size if self.config.expandable_segments else alloc)
        if self._should_split(block, size):
            block = self._split(block, size)
        block.allocated = True
        self.allocated += block.size
        return block

    def free(self, block: Block) -> None:
        """Return a block to its pool, merged with free neighbours; its segment stays reserved."""
        block.allocated = False
        self.allocated -= block.size
        pool = block.pool
        for other in (block.prev, block.next):
            self._try_merge(block, other, pool)
        pool.insert(block)

    def empty_cache(self) -> None:
        """torch.cuda.empty_cache(): free every cached block that is a whole segment (unmap free pages when expandable)."""
        for pool in (self.large, self.small):
            to_unmap = []
            for size, addr in list(pool.keys):
                b = pool.blocks[addr]
                if self._in_expandable(b):
                    to_unmap.append(b)
                elif not b.is_split():
                    pool.remove(b)
                    self.reserved -= b.size
                    self.segments -= 1
            for b in to_unmap:
                self._unmap(b)

    def largest_free(self) -> int:
        """The largest cached free block (bytes): the biggest request served without a new segment."""
        return max(self.small.largest(), self.large.largest())

    # -- the source's private functions ---------------------------------------------------------------------------
    def _in_expandable(self, b: Block) -> bool:
        return self._expandable.get(b.pool.small, False)

    def _get_free_block(self, pool: Pool, size: int) -> Block | None:
        i = bisect.bisect_left(pool.keys, (size, -1))
        if i == len(pool.keys):
            return None
        block = pool.blocks[pool.keys[i][1]]
        if self.config.expandable_segments and self._in_expandable(block):
            # best fit counts the unmapped room after a block as part of it (the source's expandable_size walk)
            def room(b):
                return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)
            while i + 1 < len(pool.keys) and room(nxt := pool.blocks[pool.keys[i + 1][1]]) < room(block):
                i, block = i + 1, nxt
        cap = self.config.max_split_size
        if cap is not None:
            if size < cap and block.size >= cap:
                return None                              # do not return an oversized block for a smaller request
            if size >= cap and block.size >= size + kLargeBuffer:
                return None                              # an oversized block may be rounded up only so far
        pool.remove(block)
        return block

    def _alloc_block(self, pool: Pool, size: int, alloc: int) -> Block | None:
        if self.config.expandable_segments:
            return self._alloc_expandable(pool, size)
        if self.limit is not None and self.reserved + alloc > self.limit:
            return None
        self._next_top -= alloc
        block = Block(self._next_top, alloc, pool)
        self.reserved += alloc
        self.segments += 1
        return block

    def _release_available(self, pool: Pool, size: int) -> bool:
        """With max_split_size: free one cached oversize segment that fits, or the largest ones until enough."""
        cap = self.config.max_split_size
        if cap is None:
            return False
        want = max(size, cap)
        i = bisect.bisect_left(pool.keys, (want, -1))
        if i < len(pool.keys):
            victims = [pool.blocks[pool.keys[i][1]]]
        else:
            victims, total = [], 0
            for s, addr in reversed(pool.keys):
                if s < cap or total >= want:
                    break
                victims.append(pool.blocks[addr])
                total += s
            if total < want:
                victims = []
        victims = [b for b in victims if not b.is_split()]
        for b in victims:
            pool.remove(b)
            self.reserved -= b.size
            self.segments -= 1
        return bool(victims)

    def _should_split(self, block: Block, size: int) -> bool:
        rest = block.size - size
        if block.pool.small or self.config.expandable_segments:
            return rest >= kMinBlockSize
        cap = self.config.max_split_size
        return (cap is None or size < cap) and rest > kSmallSize

    def _split(self, block: Block, size: int) -> Block:
        """Cut `size` bytes off the front of a free block; the rest goes back to the pool."""
        head = Block(block.addr, size, block.pool)
        head.link_before(block)
        block.addr += size
        block.size -= size
        block.pool.insert(block)
        return head

    def _try_merge(self, dst: Block, src: Block | None, pool: Pool) -> None:
        if src is None or src.allocated or src.mapped != dst.mapped:
            return
        if src.mapped:
            pool.remove(src)
        else:
            pool.unmapped.remove(src)
        if dst.prev is src:                     # [src dst]
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:                                   # [dst src]
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size

    # -- expandable segments -------------------------------------------------------------------------------------
    def _alloc_expandable(self, pool: Pool, size: int) -> Block | None:
        if not self._expandable.get(pool.small):
            seg = Block(self._next_addr - self._next_addr % pool.page + pool.page, _VA, pool, mapped=False)
            self._next_addr = seg.addr + _VA
            pool.unmapped.append(seg)
            self._expandable[pool.small] = True
            self.segments += 1
        candidate = None
        for c in sorted(pool.unmapped, key=lambda b: b.addr):          # the lowest address with room
            if c.prev is not None and not c.prev.allocated and c.prev.mapped:
                c = c.prev
            room, b = 0, c
            while room < size and b is not None and not b.allocated:
                room, b = room + b.size, b.next
            if room >= size:
                candidate = c
                break
        if candidate is None:
            return None
        if not candidate.mapped:
            candidate = self._map(candidate, min(candidate.size, size))
            if candidate is None:
                return None
        while candidate.size < size:
            candidate = self._map(candidate.next, min(size - candidate.size, candidate.next.size))
            if candidate is None:
                return None
        pool.remove(candidate)
        return candidate

    def _map(self, block: Block, size: int) -> Block | None:
        """Map whole pages at the start of an unmapped block (merged with free mapped neighbours)."""
        pool = block.pool
        mapped = -(-size // pool.page) * pool.page
        if self.limit is not None and self.reserved + mapped > self.limit:
            return None
        pool.unmapped.remove(block)
        block.mapped = True
        if mapped < block.size:
            rest = Block(block.addr + mapped, block.size - mapped, pool, mapped=False)
            rest.link_after(block)
            pool.unmapped.append(rest)
            block.size = mapped
        self._try_merge(block, block.prev, pool)
        self._try_merge(block, block.next, pool)
        pool.insert(block)
        self.reserved += mapped
        return block

    def _unmap(self, block: Block) -> None:
        """Give back the whole pages inside a free block of an expandable segment."""
        pool, page = block.pool, block.pool.page
        start = -(-block.addr // page) * page
        end = (block.addr + block.size) // page * page
        if start >= end:
            return
        pool.remove(block)
        if start > block.addr:
            before = Block(block.addr, start - block.addr, pool)
            before.link_before(block)
            pool.insert(before)
        if end < block.addr + block.size:
            after = Block(end, block.addr + block.size - end, pool)
            after.link_after(block)
            pool.insert(after)
        block.addr, block.size, block.mapped = start, end - start, False
        self.reserved -= end - start
        pool.unmapped.append(block)
        self._try_merge(block, block.prev, pool)
        self._try_merge(block, block.next, pool)
