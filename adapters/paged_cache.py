#!/usr/bin/env python3
"""Paged sliding-window KV cache, as a kvcheck exec adapter.

    kvcheck check --impl exec:'python3 adapters/paged_cache.py --block-size 4'
    kvcheck check --impl exec:'python3 adapters/paged_cache.py --bug free-early'

Modelled on the sliding-window managers of vLLM and SGLang. Per layer, a pool
of `pool_blocks` blocks of B rows (`--block-size B`, default 4; hello
declares "addressing": "paged" with "block_size": B, and open gives the pool
in blocks) with one shared free list, LIFO (the block freed last is reused
first, so a block freed too early is soon overwritten). Each request has a
block table: block index p // B -> block id, allocated when a row is first
written in it; row p lives in slot block_id * B + p % B. Rejected drafts'
rows stay where they were written; a later write at the same position
overwrites them in place.

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
Every answer lists the slots of the blocks the step freed ("freed"), and
hello declares the bound "resident_bound": blocks per request (the pool over
the states): kvcheck fails a free of a row still visible and a request that
holds more (--bug no-window-free).

`--store-first` frees nothing while a step stores, in either order, as an
engine that stores a step's rows before its queries attend: it holds
keys - 1 + C rows of a request at once, which the pool kvcheck gives
(pool_blocks) covers and `capacity` alone may not.

`--trims` lists trim in hello. A trim takes a request back over rows its
window had passed, so the cache then also keeps the last `capacity`
positions it wrote (kvcheck's trim profile grows the capacity by the depth
its trims reach) and frees only below both limits; a store_then_load step
frees what neither its queries nor a rewind need before it stores. Without
`--trims` the cache frees by its window alone (the bug switches are
measured that way).

`--lookahead N` takes, with every write step, the blocks for N positions
past the step's last row before the step stores (vLLM's
num_lookahead_tokens for a draft model's or EAGLE's speculative decoding),
and hello declares "lookahead_slots": N; `--free-deferral N` frees
out-of-window blocks only on every (N+1)-th write step of a request (and on
the accept of such a verify), frees nothing while a step stores, and
declares "free_deferral_steps": N (SGLang's hybrid sliding-window allocator,
which frees every `eviction_interval` decodes). kvcheck's pool makes room
for both and fails a free later than declared.

`--shared-pool` gives all layers one pool (vLLM's hybrid KV cache manager
draws every layer group's block ids from one block pool; SGLang's hybrid
sliding-window allocator likewise): one free list and one memory, a slot
naming the same row whichever layer stored it, and hello declares
"shared_pool": open's pool_blocks is then the one pool, which kvcheck sizes
as the sum of every layer's share. Sliding layers free by their windows
into it and global layers take from it; kvcheck judges a write over a row
another layer still sees as a collision (--bug shared-pool-double).

`--preempt` lists preempt in hello (docs/semantics.md "Preemption"): a
preempt returns all of the request's blocks (freed; with the prefix cache,
its full committed blocks cached) and keeps nothing of the request but its
state id; the begin that resumes it (a prefix begin from itself, carrying
its committed rows) stores again, whole, the blocks of the rows its next
query can see (as the request held them), in new blocks, or with the
prefix cache takes back the cached blocks that still
hold them (vLLM's recompute with prefix hits) and stores only the rest.
With `--trims` the resume stores the last `capacity` positions again (a
trim may take the request back to them); with `--lookahead` and
`--free-deferral` a preempt frees the lookahead blocks and the blocks
whose free was deferred with the rest. `--bug preempt-stale-table` (the
plain paged cache's) takes the old block table back; `--bug resume-stale-cached` (the prefix cache's) takes back by
id the blocks the preempt cached, even one evicted in between.

`--bug NAME` switches on a bug engines have shipped (`--list-bugs`); the
default cache passes every case kvcheck generates. `--store-first`,
`--bug double-free` and `--bug no-window-free` are the plain paged cache's:
with the prefix cache (`--prefix-cache` or a prefix bug) they are refused.
"""

import collections
import os
import sys

sys.dont_write_bytecode = True  # keep adapters/ free of __pycache__
# The kvcheck package: the repository's python/ when run from the repository,
# else the installed one.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

from kvcheck import protocol as kp  # noqa: E402
import window_cache  # noqa: E402


class BlockPool:
    """Block ids 0 .. total - 1, their free list and the rows stored in their
    slots: one per layer, or one that every layer draws from (--shared-pool,
    as vLLM's hybrid manager and SGLang's hybrid allocator share one pool)."""

    def __init__(self, total_blocks):
        self.total = total_blocks
        self.free = []       # LIFO stack of freed block ids
        self.next_new = 0    # blocks never handed out yet: next_new .. total - 1
        self.rows = {}       # slot -> (stored key row, stored value row)


class PagedLayer(window_cache.Layer):
    def __init__(self, states, pool):
        super().__init__(states)
        self.pool = pool
        self.rows = pool.rows  # a shared pool's slots are one memory for every layer
        self.top = [0] * states  # per state: one past the highest position written since begin or reset

        self.writes = [0] * states  # per state: write steps since begin (--free-deferral counts them)

    # The layer's pool: its own, or the one all layers share.
    @property
    def total(self):
        return self.pool.total

    @property
    def free(self):
        return self.pool.free

    @property
    def next_new(self):
        return self.pool.next_new

    def available(self):
        return len(self.free) + self.total - self.next_new

    def alloc(self):
        # Never-used blocks are handed out in order; freed ones first, latest first.
        if self.free:
            return self.free.pop()
        block = self.pool.next_new
        self.pool.next_new += 1
        return block


def pool_blocks(spec, block_size, shared=False):
    """Blocks in a pool: what open gives (pool_blocks: per layer, or the one
    pool of --shared-pool), else, from a kvcheck that sends none, states *
    (ceil(capacity / B) + 1) per layer (times the layers for one shared pool)."""
    if spec.pool_blocks:
        return spec.pool_blocks
    return (spec.layers if shared else 1) * spec.states * (-(-spec.capacity // block_size) + 1)


class PagedCache(window_cache.WindowCache):
    def __init__(self, spec, bugs, block_size, shared_pool=False):
        self.B = block_size
        self.pool_blocks = pool_blocks(spec, block_size, shared_pool)
        # --shared-pool: every layer draws block ids from one pool, and a slot
        # is one memory whichever layer stores there (hello "shared_pool").
        # shared-pool-double: a window free returns one block too many to the
        # pool, the next block of the request's table, which stays in the
        # table (an off-by-one in the count of blocks the window skipped):
        # the pool hands it to another layer while this one still reads it.
        self.shared = BlockPool(self.pool_blocks) if shared_pool else None
        self.shared_double = "shared-pool-double" in bugs
        # double-free: a block freed by the window stays in the request's
        # books as well, so finish and reset free it a second time (two
        # later allocations then get the same block).
        self.double_free = "double-free" in bugs
        super().__init__(spec, bugs)
        # left-as-keys: the manager takes window.param for the number of keys,
        # whatever the convention (the attention itself reads the right keys).
        self.param_offset = spec.keys - spec.window_param if "left-as-keys" in bugs else 0
        # free-early: one extra row counted as gone, so the block ending at
        # the first still visible row is freed.
        self.early = 1 if "free-early" in bugs else 0
        self.speculative = "free-speculative" in bugs
        # no-window-free: blocks out of every window are kept until finish or
        # reset, and new blocks are taken past the pool instead of refusing
        # (the request's memory grows with its length, past its bound).
        self.no_window_free = "no-window-free" in bugs
        # --lookahead N: the blocks of N positions past each write step's last
        # row are taken before it stores. lookahead-shared: they are taken
        # from the free list without leaving it (the next allocation hands
        # the same block out again); lookahead-leak: finish and reset return
        # only the blocks of written positions, so the lookahead blocks past
        # the end stay taken for good.
        self.lookahead = 0
        self.lookahead_shared = "lookahead-shared" in bugs
        self.lookahead_leak = "lookahead-leak" in bugs
        # --free-deferral N: out-of-window blocks go only on every (N+1)-th
        # write step of the request (and the accept of such a verify).
        # free-late: every (N+2)-th, one step later than declared.
        self.free_deferral = 0
        self.free_late = "free-late" in bugs
        self.ahead_now = []  # lookahead blocks the step under way takes once its rows are stored
        # --trims: a trim takes a request back over rows its window already
        # passed, so the cache also keeps the last `keep_rows` (the capacity)
        # positions written, top - capacity .. top - 1 (top: one past the
        # highest written since begin or reset); kvcheck's trim profile grows
        # the capacity by the depth its trims reach. None: frees by the window only.
        self.keep_rows = None
        # --store-first: no block is freed while a step stores (a
        # load_then_store step too): the engine holds keys - 1 + C rows of a
        # request at once, the pool kvcheck sizes (pool_blocks).
        self.store_first = False
        # --preempt (the adapter sets it); preempt-stale-table: the resume
        # takes the request's old block table back without storing the rows
        # again, though the preempt returned those blocks to the free list
        # (another request may have taken them since).
        self.preempts = False
        self.stale_table = "preempt-stale-table" in bugs

    def new_layer(self):
        layer = PagedLayer(self.spec.states, self.shared or BlockPool(self.pool_blocks))
        layer.freed = [[] for _ in range(self.spec.states)]  # double-free: blocks freed by the window
        layer.stale = {}  # preempt-stale-table, resume-stale-cached: preempted request -> its old block table
        return layer

    # -- preemption (--preempt) ---------------------------------------------------
    def preempt(self, layer, state, request):
        """The request's blocks all go back and its state is let go; kvcheck
        keeps the state for it and resumes it with a begin from itself. A
        pending verify's rows go (its committed length is what is resumed).
        preempt-stale-table: the old block table is kept for the resume."""
        lay, st = self._busy_state(layer, state, request)
        st.pending_first = st.pending_drafts = -1
        if self.stale_table:
            lay.stale[request] = dict(st.table)
        self.release(lay, st, state)
        st.busy = False
        st.request = None
        st.length = 0
        st.table = None
        return self.events()

    def begin(self, layer, state, request, prefix=None):
        if prefix is None:
            return super().begin(layer, state, request)
        if not self.preempts or prefix.request != request:
            raise kp.Refusal("no-prefix", "this cache begins from no other request's prefix")
        return self._resume(layer, state, request, prefix)

    def _resume(self, layer, state, request, prefix):
        """A preempted request resumes: the blocks holding rows its next
        query can see are stored again, whole, in new blocks (the rest
        answered -1: never read again);
        with --trims, the last `keep_rows` positions too (a trim may take
        the request back to them, as before the preempt)."""
        lay = self._layer(layer)
        B = self.B
        n = prefix.positions
        keys = self.layer_keys(lay)
        lo = 0 if keys is None else max(0, n - keys + 1)  # the first position its next query sees
        if self.keep_rows is not None:
            lo = max(0, min(lo, n - self.keep_rows))
        old = lay.stale.pop(request, {}) if self.stale_table else {}
        fresh = [j for j in range(lo // B, (n - 1) // B + 1) if j not in old]
        if len(fresh) > lay.available():
            raise kp.Refusal("out-of-blocks", f"layer pool of {lay.total} blocks has too few free to resume "
                                              f"request {request} ({len(fresh)} blocks)")
        super().begin(layer, state, request)
        st = lay.states[state]
        written = [-1] * n
        for j in range(lo // B, (n - 1) // B + 1):
            if j in old:
                # preempt-stale-table: the old block, as if it still held the
                # rows (it went back to the free list at the preempt).
                st.table[j] = old[j]
                if old[j] in lay.free:
                    lay.free.remove(old[j])
                continue
            block = lay.alloc()
            st.table[j] = block
            # The whole block, as the request held it before the preempt
            # (its window frees whole blocks): not only the positions the
            # next query sees, so a cache that kept the block holds the same rows.
            self.store_prefix_block(lay, block, j, prefix, written)
        st.length = n
        lay.top[state] = n
        return {"written": written} if self.slots else None

    def store_prefix_block(self, layer, block, j, prefix, written):
        """Stores the rows a begin sent for logical block j (its positions
        below prefix.positions) in `block`, each slot noted in `written`."""
        B = self.B
        for p in range(j * B, min(prefix.positions, (j + 1) * B)):
            layer.rows[block * B + p % B] = self.stored_row(prefix.k[p], None if prefix.v is None else prefix.v[p], p)
            written[p] = block * B + p % B

    def write_slot(self, layer, st, b, p):
        B = self.B
        block = st.table.get(p // B)
        if block is None:
            block = layer.alloc()  # reserve() made sure there is one
            st.table[p // B] = block
        layer.top[b] = max(layer.top[b], p + 1)
        return block * B + p % B

    def read_slot(self, layer, st, b, p):
        block = st.table.get(p // self.B)
        return -1 if block is None else block * self.B + p % self.B

    # -- freeing ---------------------------------------------------------------
    def _free_below(self, layer, st, first_visible):
        """Frees every block of the request all of whose rows are < first_visible."""
        B = self.B
        gone = sorted(j for j in st.table if (j + 1) * B <= first_visible)
        b = layer.states.index(st)
        for j in gone:
            block = st.table.pop(j)
            layer.free.append(block)
            if self.double_free and first_visible != float("inf"):
                layer.freed[b].append(block)
            self.note_freed(range(block * B, block * B + B))  # answered as "freed"
        if self.shared_double and gone and st.table and first_visible != float("inf"):
            # One block too many goes back: the next one, still in the table.
            layer.free.append(st.table[min(st.table)])

    def free_keys(self, layer):
        """The keys the manager frees by in `layer` (None: a global layer,
        which frees nothing before finish or reset)."""
        keys = self.layer_keys(layer)
        return None if keys is None else keys - self.param_offset

    def _lts_limit(self, layer, first, j):
        """Rows below this are needed by no query from the step's j-th on (nor
        later); capped at `first`: the step's own new rows are never freed
        while it runs (that would be two of its rows in one slot)."""
        keys = self.free_keys(layer)
        if keys is None:
            return float("-inf")
        return min(first + j - keys + 1 + self.early, first)

    def first_still_visible(self, layer, st):
        keys = self.free_keys(layer)
        if keys is None:
            return float("-inf")
        if st.pending_drafts >= 0:
            # verify at p pending: the next committed length is >= p + 1 (the
            # free-speculative bug assumes all k drafts will be accepted).
            nxt = st.pending_first + 1 + (st.pending_drafts if self.speculative else 0)
        else:
            nxt = st.length
        return nxt - keys + 1 + self.early

    def _keep_limit(self, layer, b, p=-1):
        """With --trims, rows below this may go once position p is written:
        the last keep_rows positions written stay (a trim's rewind reads them)."""
        if self.keep_rows is None:
            return float("inf")
        return max(layer.top[b], p + 1) - self.keep_rows

    def after_step(self, layer, st, b):
        self._take_ahead(layer, st)
        if self.no_window_free:
            return
        if self.free_deferral and layer.writes[b] % (self.free_deferral + (2 if self.free_late else 1)) != 0:
            return  # not a free step: the rows that left wait for one
        self._free_below(layer, st, min(self.first_still_visible(layer, st), self._keep_limit(layer, b)))

    def before_store(self, layer, st, b, first, j):
        if self.no_window_free or self.store_first:
            return
        self._free_below(layer, st, min(self._lts_limit(layer, first, j), self._keep_limit(layer, b, first + j)))

    def _stl_limit(self, layer, b, first, n):
        """With --trims, a store_then_load step frees first what neither its
        queries nor a rewind need (else the rows kept and the chunk's would not fit)."""
        keys = self.free_keys(layer)
        if self.keep_rows is None or keys is None:
            return float("-inf")
        return min(first - keys + 1, self._keep_limit(layer, b, first + n - 1))

    def release(self, layer, st, b):
        layer.top[b] = 0
        layer.writes[b] = 0
        if self.lookahead_leak:
            # Only the blocks of written positions go back: the lookahead
            # blocks past the end are forgotten, still taken.
            end = st.pending_first + st.pending_drafts + 1 if st.pending_drafts >= 0 else st.length
            for j in [j for j in st.table if j * self.B >= end]:
                del st.table[j]
        self._free_below(layer, st, float("inf"))
        if self.double_free:
            layer.free.extend(layer.freed[b])  # the window already freed these
            layer.freed[b] = []

    def reserve(self, layer, st, b, first, n, load_then_store):
        """Refuses (changing nothing) a step that would find the free list empty."""
        B = self.B
        table = st.table
        avail = layer.available()
        # The lookahead blocks past the step's rows are taken once its rows
        # are stored, before anything more is freed (after_step): vLLM's
        # allocate_slots takes them with the step's own, which a cache that
        # frees nothing while it stores holds at once just the same.
        ahead = [j for j in range((first + n - 1) // B + 1, (first + n - 1 + self.lookahead) // B + 1)
                 if j not in table]
        allocated = 0
        stl_limit = self._stl_limit(layer, b, first, n)
        for j_block in range(first // B, (first + n - 1) // B + 1):
            if j_block in table:
                continue
            if load_then_store and not self.store_first:
                # Blocks freed before the first new row of this block is stored.
                j = max(first, j_block * B) - first
                limit = min(self._lts_limit(layer, first, j), self._keep_limit(layer, b, first + j))
            else:
                limit = stl_limit
            freeable = sum(1 for i in table if (i + 1) * B <= limit)
            allocated += 1
            if allocated > avail + freeable and not self.no_window_free:
                raise kp.Refusal("out-of-blocks",
                                 f"layer pool of {layer.total} blocks of {B} rows has none free "
                                 f"for position {max(first, j_block * B)} of state {b}")
        if ahead and not self.no_window_free:
            # Blocks freed by the time the last row is stored.
            if load_then_store and not self.store_first:
                limit = min(self._lts_limit(layer, first, n - 1), self._keep_limit(layer, b, first + n - 1))
            else:
                limit = stl_limit
            freeable = sum(1 for i in table if (i + 1) * B <= limit)
            if allocated + len(ahead) > avail + freeable:
                raise kp.Refusal("out-of-blocks",
                                 f"layer pool of {layer.total} blocks of {B} rows has none free for "
                                 f"lookahead position {ahead[-1] * B} of state {b}")
        if not load_then_store and not self.no_window_free:
            self._free_below(layer, st, stl_limit)
        # Nothing is refused past this point.
        layer.writes[b] += 1
        self.ahead_now = ahead  # taken in after_step, once the rows are stored

    def _take_ahead(self, layer, st):
        for j in self.ahead_now:
            if self.lookahead_shared:
                # Peeked, not popped: the free list still offers it.
                st.table[j] = layer.free[-1] if layer.free else layer.alloc()
            else:
                st.table[j] = layer.alloc()
        self.ahead_now = []


# Bugs of the prefix cache (each switches --prefix-cache on).
PREFIX_BUGS = {
    "free-shared": "the sliding window frees a shared block outright, though another request "
                   "sharing the prefix still sees it",
    "cow-skipped": "a write into a shared block goes into it in place (copy-on-write skipped), "
                   "changing the other sharer's rows",
    "evicted-prefix-reused": "a begin from an evicted prefix reuses the evicted blocks' ids as if "
                             "they still held the prefix",
    "evict-leaves-hash": "evicting a cached block hands it out but leaves its hash -> block entry "
                         "behind, so a later prefix begin reads the new owner's rows",
    "partial-block-hash": "a block a begin stored again that the prefix ends inside gets the source "
                          "block's hash too, so once the request fills it with rows of its own a later "
                          "begin from the source reads them as the source's (implies --content-hash)",
    "recompute-drops-last": "the first step after a begin stores every prefix position the begin left to "
                            "it but the last (an off-by-one in the count of tokens still to compute) "
                            "(implies --recompute-in-step)",
    "resume-stale-cached": "the begin that resumes a preempted request takes back the blocks its preempt "
                           "cached by the ids it kept, without looking their hashes up again: a block "
                           "evicted since holds another request's rows (implies --preempt)",
}


class SharingPagedCache(PagedCache):
    """The paged cache with prefix caching (`--prefix-cache`), as vLLM's
    block pool shares prompt blocks.

    Blocks are refcounted: a block is in the tables of every live request
    that shares it and leaves the table when that request's window passes
    it, or at finish or reset. A full block of committed rows a table lets
    go of is indexed by (request, logical block), vLLM's block hash, for
    every request whose rows it holds (its writer, and the requests sharing
    it as a prefix). When no table holds a block any more it goes to the
    free pool: cached (answered "cached": its rows still resolvable for a
    prefix hit) when the index has it, else freed ("freed"). A new block is
    taken from the plain free blocks first (the last freed first), then
    from the never-used ones, and only then by evicting the least recently
    cached block, whose index entries go with it: cached blocks are free
    capacity. A finished request holds nothing.

    A begin from a shared prefix of n positions takes, for the positions
    its first query can still see, the source's blocks: a live source's
    table, else the index (a cached block taken back leaves the free pool);
    a block in neither (evicted, or the partial last block of a finished
    request) is stored again from the rows kvcheck sends, and answered in
    `written`. A write into a block another table holds, or that the index
    holds (a cached block taken back), copies its rows below the write into
    a block of its own first (copy-on-write, answered as "moved"). A reset takes the request's own rows out of the
    index (what it writes next is other rows).

    With `--content-hash` a block is indexed by the rows it holds, as
    vLLM's block hash (of the tokens, chained from the first block) does:
    a block of a begun request wholly below its prefix holds the source's
    rows, whoever stored them, so its key is the source block's key
    (through chains of begins), and a block a begin stored again is cached
    under that key when its request lets it go: a later begin from the
    source may be handed that copy (kvcheck's row lineage,
    docs/semantics.md "Row lineage"). A request's own block's key names
    the request, the block and how many resets the request has had (rows
    written after a reset are other rows).

    With `--recompute-in-step` a begin stores nothing: it takes the blocks
    that hit, and leaves the rest to the request's first writing step
    (answered "recompute"), as vLLM's scheduler computes the part of a
    prompt its prefix cache missed in the request's first step, with that
    step's tokens: the positions of the missed blocks its first query sees,
    and, when no block hit, the whole prefix (a request with no hit computes
    its whole prompt; the blocks below the window are freed once the step
    has stored its rows). That step stores them before its own rows and
    answers "recomputed" (docs/semantics.md "Recompute in a step")."""

    def __init__(self, spec, bugs, block_size):
        super().__init__(spec, bugs, block_size)
        self.recompute_in_step = False  # --recompute-in-step (make_cache sets it)
        self.drops_last = "recompute-drops-last" in bugs
        self.recomputed_now = []
        self.free_shared = "free-shared" in bugs
        self.cow_skipped = "cow-skipped" in bugs
        self.reuse_evicted = "evicted-prefix-reused" in bugs
        self.leave_hash = "evict-leaves-hash" in bugs
        self.partial_hash = "partial-block-hash" in bugs
        # resume-stale-cached: a preempt keeps the ids of the blocks it
        # caches, and the resume takes them back by id (a scheduler that
        # keeps a preempted request's block list), not by their hashes: a
        # block evicted in between now holds another request's rows.
        self.resume_stale = "resume-stale-cached" in bugs
        self.content_hash = False  # --content-hash (make_cache sets it)
        self.moved_now = []
        self.indexing = True  # False while a reset lets go of its blocks

    def new_layer(self):
        layer = super().new_layer()
        layer.refs = {}                           # block -> live tables holding it
        layer.cached = collections.OrderedDict()  # cached-but-free blocks, least recently cached first
        layer.index = {}                          # (request, logical block) -> block holding those rows
        layer.hashes = collections.defaultdict(set)  # block -> its index keys (its hashes)
        layer.ghosts = {}                         # finished request -> its table (evicted-prefix-reused)
        layer.lineage = {}  # (request, logical block) -> key of the source block whose rows it holds (--content-hash)
        layer.resets = collections.Counter()  # request -> resets so far (--content-hash keys)
        layer.recompute = {}  # state -> {position: row} a begin left to the next step (--recompute-in-step)
        return layer

    # -- blocks ----------------------------------------------------------------
    def _slots(self, block):
        return range(block * self.B, block * self.B + self.B)

    def _available(self, layer):
        """Blocks a new block may come from: free, never used, or cached (evicted)."""
        return layer.available() + len(layer.cached)

    def _key(self, layer, request, j):
        """The index key of the request's logical block j: (request, j), or
        with --content-hash the key of the rows it holds (a prefix block's:
        its source block's; else the request's own, after its resets)."""
        if not self.content_hash:
            return (request, j)
        return layer.lineage.get((request, j), ("rows", request, layer.resets[request], j))

    def _index(self, layer, st, j, block):
        """A full block of the request's committed rows goes in the index."""
        if self.indexing and (j + 1) * self.B <= st.length:
            key = self._key(layer, st.request, j)
            layer.index[key] = block
            layer.hashes[block].add(key)

    def _unindex(self, layer, block):
        for key in layer.hashes.pop(block, ()):
            if layer.index.get(key) == block:
                del layer.index[key]

    def _drop(self, layer, block, outright=False):
        """One table lets go of `block`; the last one puts it in the free
        pool, cached when the index holds its rows."""
        left = layer.refs.get(block, 0) - 1
        if left > 0 and not outright:
            layer.refs[block] = left
            return
        layer.refs.pop(block, None)
        if block in layer.free or block in layer.cached:
            return
        if layer.hashes.get(block) and left <= 0:
            layer.cached[block] = None
            self.cached_now.extend(self._slots(block))
        else:
            self._unindex(layer, block)
            layer.free.append(block)
            self.note_freed(self._slots(block))

    def _take(self, layer, block):
        """One more table holds `block` (a prefix hit): a free one leaves the pool."""
        layer.cached.pop(block, None)
        if block in layer.free:
            layer.free.remove(block)
        layer.refs[block] = layer.refs.get(block, 0) + 1

    def _alloc(self, layer):
        if layer.free or layer.next_new < layer.total:
            block = layer.alloc()
        elif layer.cached:
            block, _ = layer.cached.popitem(last=False)  # evicts the least recently cached
            if self.leave_hash:
                layer.hashes.pop(block, None)  # the block forgets its keys; the index keeps them
            else:
                self._unindex(layer, block)
        else:
            raise kp.Refusal("out-of-blocks", f"layer pool of {layer.total} blocks has none free")
        layer.refs[block] = 1
        # A block released and taken again within the step (a load_then_store
        # chunk sliding past it) is held at the step's end: not a net release.
        self.freed_now = [s for s in self.freed_now if s // self.B != block]
        self.cached_now = [s for s in self.cached_now if s // self.B != block]
        return block

    def _must_copy(self, layer, block):
        """A write into `block` copies it first: another table holds it, or
        the index does (a cached block taken back by a prefix hit)."""
        return not self.cow_skipped and (layer.refs.get(block, 0) > 1 or bool(layer.hashes.get(block)))

    def write_slot(self, layer, st, b, p):
        B = self.B
        block = st.table.get(p // B)
        if block is None:
            block = self._alloc(layer)
            st.table[p // B] = block
        elif self._must_copy(layer, block):
            # Copy-on-write: the rows move to a block of this request's own,
            # those below the write (the rows from p on are this request's to
            # write; the source's rows there are no row of it).
            copy = self._alloc(layer)
            for o in range(p % B):
                row = layer.rows.get(block * B + o)
                if row is not None:
                    layer.rows[copy * B + o] = row
                    self.moved_now.append([block * B + o, copy * B + o])
            self._drop(layer, block)
            st.table[p // B] = copy
            block = copy
        return block * B + p % B

    def _free_below(self, layer, st, first_visible):
        B = self.B
        window = first_visible != float("inf")
        for j in sorted(j for j in st.table if (j + 1) * B <= first_visible):
            block = st.table.pop(j)
            self._index(layer, st, j, block)
            self._drop(layer, block, outright=self.free_shared and window)

    def release(self, layer, st, b):
        layer.recompute.pop(b, None)  # positions a begin left to a step that never came
        self._free_below(layer, st, float("inf"))

    def reserve(self, layer, st, b, first, n, load_then_store):
        """Refuses (changing nothing) a step that would find no block: new
        blocks and copies against the free, unused and cached ones (and the
        blocks of prefix rows its begin left to it)."""
        B = self.B
        pending = layer.recompute.get(b, {})
        need = len({p // B for p in pending if p // B not in st.table})
        for j in range(first // B, (first + n - 1) // B + 1):
            block = st.table.get(j)
            if block is None or self._must_copy(layer, block):
                need += 1
        freeable = 0
        if load_then_store:
            limit = self._lts_limit(layer, first, n - 1)
            freeable = sum(1 for i, blk in st.table.items() if (i + 1) * B <= limit and layer.refs.get(blk, 0) == 1)
        if need > self._available(layer) + freeable:
            raise kp.Refusal("out-of-blocks", f"layer pool of {layer.total} blocks of {B} rows has too few "
                                              f"free for positions {first}..{first + n - 1} of state {b}"
                                              + (f" and {len(pending)} recomputed" if pending else ""))
        # Nothing is refused past this point: the prefix rows the begin left
        # are stored first, before the step's own rows.
        layer.recompute.pop(b, None)
        stored = sorted(pending)
        if self.drops_last and stored:
            stored.pop()  # recompute-drops-last: one token fewer than the begin left
        for p in stored:
            block = st.table.get(p // B)
            if block is None:
                block = self._alloc(layer)
                st.table[p // B] = block
            layer.rows[block * B + p % B] = pending[p]
            self.recomputed_now.append([p, block * B + p % B])

    def write_step(self, step):
        self.moved_now = []
        self.recomputed_now = []
        answer = super().write_step(step)
        if self.moved_now:
            answer["moved"] = self.moved_now
        if self.recomputed_now and self.slots:  # --no-slots: outputs only, no slots at all
            answer["recomputed"] = self.recomputed_now
        return answer

    # -- steps -------------------------------------------------------------------
    def preempt(self, layer, state, request):
        lay, st = self._busy_state(layer, state, request)
        if self.resume_stale:
            # The full committed blocks, which the preempt caches.
            lay.stale[request] = {j: blk for j, blk in st.table.items() if (j + 1) * self.B <= st.length}
        return super().preempt(layer, state, request)

    def finish(self, layer, state, request):
        lay, st = self._busy_state(layer, state, request)
        if self.reuse_evicted:
            lay.ghosts[request] = dict(st.table)
        return super().finish(layer, state, request)

    def reset(self, layer, state, request):
        lay, _ = self._busy_state(layer, state, request)
        self.indexing = False
        try:
            events = super().reset(layer, state, request)
        finally:
            self.indexing = True
        # --content-hash: its blocks hold its own rows from now on, under new
        # keys; the old keys still name the rows they name (a cached block
        # keeps serving the requests whose rows those are).
        lay.resets[request] += 1
        for key in [k for k in lay.lineage if k[0] == request]:
            del lay.lineage[key]
        # The request's rows from before the reset are no prefix of it any
        # more: out of the index; a cached block no key holds is plain free.
        for key in [k for k in lay.index if k[0] == request]:
            block = lay.index.pop(key)
            keys = lay.hashes.get(block)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del lay.hashes[block]
            if not lay.hashes.get(block) and block in lay.cached:
                del lay.cached[block]
                lay.free.append(block)
                self.cached_now = [s for s in self.cached_now if s // self.B != block]
                self.note_freed(self._slots(block))
        return self.events()

    def begin(self, layer, state, request, prefix=None):
        if prefix is None:
            return super().begin(layer, state, request)
        lay = self._layer(layer)
        B = self.B
        source = None
        for other in lay.states:
            if other.busy and other.request == prefix.request:
                source = other.table
        ghost = lay.ghosts.get(prefix.request, {}) if self.reuse_evicted and source is None else {}
        # resume-stale-cached: a resume's kept block ids, ahead of the index.
        kept = lay.stale.pop(request, {}) if prefix.request == request else {}
        n = prefix.positions
        keys = self.layer_keys(lay)
        lo = 0 if keys is None else max(0, n - keys + 1)  # the first position its first query sees
        # Each block: the source's (its table, else the index), else the
        # evicted-prefix-reused bug's old id, else None (stored again).
        hits = {}
        for j in range(lo // B, (n - 1) // B + 1):
            block = source.get(j) if source is not None else kept.get(j)
            if block is None:
                block = lay.index.get(self._key(lay, prefix.request, j), ghost.get(j))
            hits[j] = block
        # Refused before anything changes when the pool cannot store the misses.
        taken_free = sum(1 for blk in set(hits.values()) if blk is not None and (blk in lay.free or blk in lay.cached))
        # --recompute-in-step: the misses are stored by the first step (its reserve counts them).
        misses = 0 if self.recompute_in_step else sum(1 for blk in hits.values() if blk is None)
        if misses > self._available(lay) - taken_free:
            raise kp.Refusal("out-of-blocks", f"layer pool of {lay.total} blocks has too few free for "
                                              f"{misses} prefix blocks")
        result = super().begin(layer, state, request)
        st = lay.states[state]
        if self.content_hash:
            # Blocks wholly below the prefix hold the source's rows: its keys.
            # (partial-block-hash: the block the prefix ends inside as well.)
            for j in range(0, (n + (B - 1 if self.partial_hash else 0)) // B):
                lay.lineage[(request, j)] = self._key(lay, prefix.request, j)
        for j, block in hits.items():
            if block is not None:
                st.table[j] = block  # shared: one more table holds it
                self._take(lay, block)
        written = [-1] * n
        if self.recompute_in_step:
            # Left to the first writing step: the missed blocks' positions,
            # and with no hit at all the whole prefix.
            missed = [j for j, block in hits.items() if block is None]
            if all(block is None for block in hits.values()):
                missed = list(range(0, (n - 1) // B + 1))
            pending = lay.recompute[state] = {}
            for j in missed:
                for p in range(j * B, min(n, (j + 1) * B)):
                    pending[p] = self.stored_row(prefix.k[p], None if prefix.v is None else prefix.v[p], p)
            st.length = n
            answer = {"written": written, **(self.events() or {})}
            if pending:
                answer["recompute"] = sorted(pending)
            return answer if self.slots else (result or self.events())
        for j, block in hits.items():
            if block is not None:
                continue
            block = self._alloc(lay)
            st.table[j] = block
            # The whole block, not only the positions the first query sees: a
            # later prefix of this request (or a copy-on-write of the block)
            # may need any position of it below n.
            self.store_prefix_block(lay, block, j, prefix, written)
        st.length = n
        return {"written": written, **(self.events() or {})} if self.slots else (result or self.events())


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
        "double-free": "a block freed by the sliding window is freed again when its request "
                       "finishes or resets (two later allocations share it)",
        "layer-window-swapped": "every layer reads and frees with layer 0's window (the per-layer "
                                "window taken from the wrong layer)",
        "no-window-free": "never frees a block that slid out of the window (only at finish and reset) "
                          "and takes new blocks past its pool: memory grows past the declared bound",
        "trim-keeps-drafts": "a trim rewinds the length but leaves a pending verify's drafts pending "
                             "(implies --trims)",
        "lookahead-shared": "a lookahead block is taken from the free list without leaving it, so the next "
                            "allocation hands the same block out again (implies --lookahead 4)",
        "lookahead-leak": "finish and reset return only the blocks of written positions: the lookahead blocks "
                          "past a request's end stay taken and the pool shrinks (implies --lookahead 4)",
        "free-late": "declares a free deferral of N steps but frees every N+2 write steps, one step later "
                     "(implies --free-deferral 2)",
        "shared-pool-double": "a window free returns one block too many to the shared pool: the next block of "
                              "the request's table, which the layer still reads, is handed to another layer "
                              "(implies --shared-pool)",
        "preempt-stale-table": "the begin that resumes a preempted request takes its old block table back "
                               "without storing the rows again, though the preempt freed those blocks "
                               "(implies --preempt)",
        **PREFIX_BUGS,
    }

    prefix_cache = False  # --prefix-cache (configure sets it)
    recompute_in_step = False  # --recompute-in-step (configure sets it)
    shared_pool = False   # --shared-pool (configure sets it)
    content_hash = False  # --content-hash (configure sets it)

    def __init__(self):
        super().__init__()
        self.block_size = 4

    def add_arguments(self, parser):
        parser.add_argument("--block-size", type=int, default=4, metavar="N",
                            help="rows per block (default 4)")
        parser.add_argument("--store-first", action="store_true",
                            help="free no block while a step stores, in either order (an engine that stores a "
                                 "step's rows before it attends): it needs the pool open gives, not capacity")
        parser.add_argument("--trims", action="store_true",
                            help="run trim (hello lists it): the cache also keeps the last `capacity` "
                                 "positions written, which a rewind reads again")
        parser.add_argument("--lookahead", type=int, default=None, metavar="N",
                            help="take the blocks of N positions past each write step's last row before it "
                                 "stores (vLLM's num_lookahead_tokens), declared in hello as lookahead_slots")
        parser.add_argument("--free-deferral", type=int, default=None, metavar="N",
                            help="free out-of-window blocks only on every (N+1)-th write step of a request "
                                 "(SGLang's eviction interval), declared in hello as free_deferral_steps")
        parser.add_argument("--shared-pool", action="store_true",
                            help="every layer draws its blocks from one pool, one memory (vLLM's hybrid manager, "
                                 "SGLang's hybrid allocator), declared in hello as shared_pool: open's pool_blocks "
                                 "is that one pool")
        parser.add_argument("--prefix-cache", action="store_true",
                            help="share prefixes (hello \"prefix_sharing\"): refcounted blocks, copy-on-write, "
                                 "blocks no request holds cached (answered \"cached\", readable by a prefix hit) until evicted "
                                 "(implied by the prefix bugs)")
        parser.add_argument("--content-hash", action="store_true",
                            help="with the prefix cache, index blocks by the rows they hold (vLLM's block hash): "
                                 "a block a begin stored again is cached under the source block's hash, and a "
                                 "later begin from the source may read that copy (implies --prefix-cache)")
        parser.add_argument("--recompute-in-step", action="store_true",
                            help="with the prefix cache, a begin stores nothing: the prefix rows it misses are "
                                 "stored by the request's first writing step (vLLM computes a prompt's missed "
                                 "part with the step's tokens), declared in hello as recompute_in_step "
                                 "(implies --prefix-cache)")
        parser.add_argument("--preempt", action="store_true",
                            help="run preempt (hello lists it): drop a request's blocks (freed, or cached with "
                                 "--prefix-cache); the begin that resumes it stores its rows again, reusing "
                                 "cached blocks where it can")

    def configure(self, args):
        if args.block_size < 1:
            raise SystemExit("paged-cache: --block-size must be >= 1")
        self.block_size = args.block_size
        self.content_hash = args.content_hash or "partial-block-hash" in args.bug
        self.recompute_in_step = args.recompute_in_step or "recompute-drops-last" in args.bug
        self.prefix_cache = (args.prefix_cache or self.content_hash or self.recompute_in_step
                             or any(b in PREFIX_BUGS for b in args.bug))
        self.trims = args.trims or "trim-keeps-drafts" in args.bug  # hello lists trim
        self.store_first = args.store_first
        self.preempt = args.preempt or any(b in ("preempt-stale-table", "resume-stale-cached")
                                           for b in args.bug)  # hello lists preempt
        if "preempt-stale-table" in args.bug and self.prefix_cache:
            raise SystemExit("paged-cache: --bug preempt-stale-table is the plain paged cache's")
        if self.trims and self.prefix_cache:
            raise SystemExit("paged-cache: --trims does not go with the prefix cache")
        lookahead_bug = any(b in ("lookahead-shared", "lookahead-leak") for b in args.bug)
        self.lookahead = args.lookahead if args.lookahead is not None else (4 if lookahead_bug else 0)
        self.free_deferral = args.free_deferral if args.free_deferral is not None else (
            2 if "free-late" in args.bug else None)
        if self.lookahead < 0 or self.lookahead > 4096:
            raise SystemExit("paged-cache: --lookahead must be in 0..4096")
        if self.free_deferral is not None and not 0 <= self.free_deferral <= 4096:
            raise SystemExit("paged-cache: --free-deferral must be in 0..4096")
        self.shared_pool = args.shared_pool or "shared-pool-double" in args.bug
        if self.shared_pool and self.prefix_cache:
            # The prefix cache's cached blocks and evictions are per layer.
            raise SystemExit("paged-cache: --shared-pool goes with the plain paged cache (not --prefix-cache)")
        if lookahead_bug and self.lookahead < 1:
            raise SystemExit("paged-cache: the lookahead bugs need --lookahead of at least 1")
        # Slack is the plain paged cache's: the prefix cache and --trims
        # free their own way, which these switches would silently change.
        if (self.lookahead or self.free_deferral is not None) and (self.prefix_cache or self.trims):
            raise SystemExit("paged-cache: --lookahead and --free-deferral go with the plain paged cache "
                             "(not --prefix-cache or --trims)")
        # The prefix cache frees and stores its own way: these switches of
        # the plain paged cache would silently do nothing there.
        if self.prefix_cache:
            unsupported = [f"--bug {b}" for b in ("double-free", "no-window-free") if b in args.bug]
            unsupported += ["--store-first"] if self.store_first else []
            if unsupported:
                raise SystemExit(f"paged-cache: {', '.join(unsupported)} does not go with the prefix cache")

    def display_name(self):
        return f"{super().display_name()}/B={self.block_size}"

    def capabilities(self):
        caps = super().capabilities()
        caps["block_size"] = self.block_size  # with "addressing": "paged": open carries pool_blocks
        # Frees are answered ("freed": the slots of each block released), and
        # the bound is the pool kvcheck gives per request: open's pool_blocks
        # over states (resident_bound without a limit).
        caps["reports"]["frees"] = True
        caps["resident_bound"] = {"unit": "blocks", "per": "request"}
        if self.prefix_cache:
            caps["prefix_sharing"] = True  # a begin may name a prefix (--prefix-cache)
            # Blocks no table holds stay readable for a prefix hit until
            # evicted: answered "cached", counted in no bound.
            caps["reports"]["cached"] = True
        if self.lookahead:
            caps["lookahead_slots"] = self.lookahead  # the pool kvcheck gives makes room for them
        if self.free_deferral is not None:
            caps["free_deferral_steps"] = self.free_deferral  # free-late frees one step later still
        if self.shared_pool:
            caps["shared_pool"] = True  # open's pool_blocks is the one pool of all layers
        if self.recompute_in_step:
            caps["recompute_in_step"] = True  # a begin's missed rows are stored by the next writing step
        return caps

    def make_cache(self, spec):
        if spec.block_size and spec.block_size != self.block_size:
            raise kp.BadRequest(f"spec.block_size: {spec.block_size}, but this cache declared {self.block_size}")
        total = pool_blocks(spec, self.block_size, self.shared_pool) * self.block_size
        if total > window_cache.MAX_SLOTS:
            raise kp.OpenRefused(f"pool of {total} rows exceeds {window_cache.MAX_SLOTS}")
        if self.prefix_cache:
            cache = SharingPagedCache(spec, self.active_bugs, self.block_size)
            cache.content_hash = self.content_hash
            cache.recompute_in_step = self.recompute_in_step
            cache.preempts = self.preempt
            return cache
        cache = PagedCache(spec, self.active_bugs, self.block_size, self.shared_pool)
        cache.preempts = self.preempt
        # A deferred free waits for a free step, so nothing goes while a
        # step stores either: --free-deferral frees as --store-first does.
        cache.store_first = self.store_first or self.free_deferral is not None
        cache.lookahead = self.lookahead
        cache.free_deferral = self.free_deferral or 0
        if self.trims:
            cache.keep_rows = spec.capacity
        return cache


if __name__ == "__main__":
    kp.run(PagedAdapter)
