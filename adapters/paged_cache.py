#!/usr/bin/env python3
"""Paged sliding-window KV cache, as a kvcheck exec adapter.

    kvcheck check --impl exec:'python3 adapters/paged_cache.py --block-size 4'
    kvcheck check --impl exec:'python3 adapters/paged_cache.py --bug free-early'

Modelled on the sliding-window managers of vLLM and SGLang. Per layer, a pool
of states * (ceil(capacity / B) + 1) blocks of B rows (`--block-size B`,
default 4) with one shared free list, LIFO (the block freed last is reused
first, so a block freed too early is soon overwritten). Each request has a
block table: block index p // B -> block id, allocated when a row is first
written in it; row p lives in slot block_id * B + p % B (addressing "paged":
kvcheck treats slots as opaque). Rejected drafts' rows stay where they were
written; a later write at the same position overwrites them in place.

Blocks no query still to run can see are freed (the table entry is dropped):
after every write step and accept, and, in a load_then_store prefill (whose
queries read copies of the old window taken before anything is stored),
before each new row is stored, the old blocks that neither that row's query,
the later queries of the step nor any future query can see. Without that, a
chunk as long as the capacity would need the old window's blocks and the
chunk's at once and run out. With committed length L the next query sees
positions >= L - keys + 1; while a verify at p is pending the next committed
length is at least p + 1. Block j (rows jB .. jB + B - 1) is freed when
(j + 1) * B <= the first position still visible. finish and reset return all
of the request's blocks. A position whose block was freed reads as -1.

`--bug NAME` switches on a bug engines have shipped (`--list-bugs`); the
default cache passes every case kvcheck generates.
"""

import os
import sys

sys.dont_write_bytecode = True  # keep adapters/ free of __pycache__
# The kvcheck package: the repository's python/ when run from the repository,
# else the installed one.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

from kvcheck import protocol as kp  # noqa: E402
import window_cache  # noqa: E402


class PagedLayer(window_cache.Layer):
    def __init__(self, states, total_blocks):
        super().__init__(states)
        self.total = total_blocks
        self.free = []       # LIFO stack of freed block ids
        self.next_new = 0    # blocks never handed out yet: next_new .. total - 1

    def available(self):
        return len(self.free) + self.total - self.next_new

    def alloc(self):
        # Never-used blocks are handed out in order; freed ones first, latest first.
        if self.free:
            return self.free.pop()
        block = self.next_new
        self.next_new += 1
        return block


class PagedCache(window_cache.WindowCache):
    def __init__(self, spec, bugs, block_size):
        self.B = block_size
        self.blocks_per_state = -(-spec.capacity // block_size) + 1
        super().__init__(spec, bugs)
        # left-as-keys: the manager takes window.param for the number of keys,
        # whatever the convention (the attention itself reads the right keys).
        self.free_keys = spec.window_param if "left-as-keys" in bugs else spec.keys
        # free-early: one extra row counted as gone, so the block ending at
        # the first still visible row is freed.
        self.early = 1 if "free-early" in bugs else 0
        self.speculative = "free-speculative" in bugs

    def new_layer(self):
        return PagedLayer(self.spec.states, self.spec.states * self.blocks_per_state)

    def write_slot(self, layer, st, b, p):
        B = self.B
        block = st.table.get(p // B)
        if block is None:
            block = layer.alloc()  # reserve() made sure there is one
            st.table[p // B] = block
        return block * B + p % B

    def read_slot(self, layer, st, b, p):
        block = st.table.get(p // self.B)
        return -1 if block is None else block * self.B + p % self.B

    # -- freeing ---------------------------------------------------------------
    def _free_below(self, layer, st, first_visible):
        """Frees every block of the request all of whose rows are < first_visible."""
        B = self.B
        gone = sorted(j for j in st.table if (j + 1) * B <= first_visible)
        for j in gone:
            layer.free.append(st.table.pop(j))

    def _lts_limit(self, first, j):
        """Rows below this are needed by no query from the step's j-th on (nor
        later); capped at `first`: the step's own new rows are never freed
        while it runs (that would be two of its rows in one slot)."""
        return min(first + j - self.free_keys + 1 + self.early, first)

    def first_still_visible(self, st):
        if st.pending_drafts >= 0:
            # verify at p pending: the next committed length is >= p + 1 (the
            # free-speculative bug assumes all k drafts will be accepted).
            nxt = st.pending_first + 1 + (st.pending_drafts if self.speculative else 0)
        else:
            nxt = st.length
        return nxt - self.free_keys + 1 + self.early

    def after_step(self, layer, st, b):
        self._free_below(layer, st, self.first_still_visible(st))

    def before_store(self, layer, st, b, first, j):
        self._free_below(layer, st, self._lts_limit(first, j))

    def release(self, layer, st, b):
        self._free_below(layer, st, float("inf"))

    def reserve(self, layer, st, b, first, n, load_then_store):
        """Refuses (changing nothing) a step that would find the free list empty."""
        B = self.B
        table = st.table
        avail = layer.available()
        allocated = 0
        for j_block in range(first // B, (first + n - 1) // B + 1):
            if j_block in table:
                continue
            freeable = 0
            if load_then_store:
                # Blocks freed before the first new row of this block is stored.
                j = max(first, j_block * B) - first
                limit = self._lts_limit(first, j)
                freeable = sum(1 for i in table if (i + 1) * B <= limit)
            allocated += 1
            if allocated > avail + freeable:
                raise kp.Refusal("out-of-blocks",
                                 f"layer pool of {layer.total} blocks of {B} rows has none free "
                                 f"for position {max(first, j_block * B)} of state {b}")


class PagedAdapter(window_cache.WindowAdapter):
    """Paged sliding-window KV cache (kvcheck exec protocol v1)."""

    name = "paged-cache"
    addressing = "paged"
    bugs = {
        "free-speculative": "after verify(k), frees blocks using the speculative length p + k + 1 "
                            "before the accept arrives",
        "free-early": "frees a block one row too early: when (j+1)*B <= first still visible + 1",
        "left-as-keys": "the block manager takes window.param as the number of keys whatever "
                        "the convention (wrong for left and off-by-one)",
    }

    def __init__(self):
        super().__init__()
        self.block_size = 4

    def add_arguments(self, parser):
        parser.add_argument("--block-size", type=int, default=4, metavar="N",
                            help="rows per block (default 4)")

    def configure(self, args):
        if args.block_size < 1:
            raise SystemExit("paged-cache: --block-size must be >= 1")
        self.block_size = args.block_size

    def display_name(self):
        return f"{super().display_name()}/B={self.block_size}"

    def make_cache(self, spec):
        total = spec.states * (-(-spec.capacity // self.block_size) + 1) * self.block_size
        if total > window_cache.MAX_SLOTS:
            raise kp.OpenRefused(f"pool of {total} rows exceeds {window_cache.MAX_SLOTS}")
        return PagedCache(spec, self.active_bugs, self.block_size)


if __name__ == "__main__":
    kp.run(PagedAdapter)
