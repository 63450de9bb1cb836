"""A paged KV cache manager with shared prefixes and per-layer windows.

Bookkeeping only (no kernel: kvcheck attends over the slots it reports), in
the manner of vLLM's block manager: per layer a pool of `spec.pool_blocks`
blocks of `block_size` rows with one free list; per request a block table
(logical block -> block id, -1 once freed); refcounted blocks, so a request
may start from another request's prefix and share its blocks; a write into
a block another table still holds copies it first (copy-on-write, answered
as `moved`); blocks that slid out of the layer's window are released
(answered as `freed`); a global layer frees nothing while its request lives.

    PYTHONPATH=python kvcheck check --impl "exec:python3 python/examples/paged_prefix_cache.py" --profile prefix

Walked through in docs/python.md ("A paged engine with shared prefixes and
per-layer windows").
"""
import kvcheck


class Request:
    def __init__(self, length=0):
        self.table = []       # logical block -> block id, -1 where freed; a block held holds every
        #                       position of it below length (a later prefix of this request may read any)
        self.length = length  # committed positions; the next write goes here


class PagedPrefixCache(kvcheck.Engine):
    outputs = False
    formats = kvcheck.protocol.FORMATS  # no kernel: any element format will do
    addressing = "paged"
    block_size = 4
    copy_on_write = True      # False plants a bug: a sharer writes into the shared block
    capabilities = {"addressing": "paged", "block_size": block_size, "per_layer_windows": True,
                    "reports": {"written_slots": True, "read_slots": True, "frees": True},
                    "resident_bound": {"unit": "blocks", "per": "request"}}

    def __init__(self, spec):
        super().__init__(spec)
        self.B = spec.block_size
        self.free = [list(range(spec.pool_blocks - 1, -1, -1)) for _ in range(spec.layers)]
        self.refs = [[0] * spec.pool_blocks for _ in range(spec.layers)]
        self.requests = {}    # (layer, request id) -> Request, live requests only

    # -- blocks -------------------------------------------------------------
    def take(self, layer):
        if not self.free[layer]:
            raise kvcheck.Refusal("out-of-blocks", f"layer {layer}: all {self.spec.pool_blocks} blocks in use")
        block = self.free[layer].pop()
        self.refs[layer][block] = 1
        return block

    def drop(self, layer, block, freed):
        self.refs[layer][block] -= 1
        if self.refs[layer][block] == 0:  # the last table holding it let go
            self.free[layer].append(block)
            freed.extend(range(block * self.B, (block + 1) * self.B))

    def first_seen(self, layer, position):
        return kvcheck.window(self.spec, position, layer).start  # a global layer: 0

    def slide(self, layer, req, freed, pending=False):
        # Release the blocks no query still to run can see: the next one is at
        # req.length, or past it while a verify awaits its accept.
        lo = self.first_seen(layer, req.length + pending)
        for i in range(min(lo // self.B, len(req.table))):
            if req.table[i] >= 0:
                self.drop(layer, req.table[i], freed)
                req.table[i] = -1

    # -- steps ---------------------------------------------------------------
    def begin(self, layer, state, request):
        self.requests[layer, request] = Request()

    def begin_prefix(self, layer, state, request, prefix):
        n, B = prefix.positions, self.B
        source = self.requests.get((layer, prefix.request))  # None once it finished
        req = self.requests[layer, request] = Request(length=n)
        lo = self.first_seen(layer, n)  # prefix rows the first query still sees
        written = [-1] * n
        for i in range((n + B - 1) // B):
            if (i + 1) * B <= lo:
                req.table.append(-1)   # never seen again: not held
            elif source is not None and i < len(source.table) and source.table[i] >= 0:
                req.table.append(source.table[i])  # share it
                self.refs[layer][source.table[i]] += 1
            else:                      # the source no longer holds it: store the rows sent again
                req.table.append(self.take(layer))
                for p in range(i * B, min((i + 1) * B, n)):  # the whole block: a later prefix may read it
                    written[p] = kvcheck.block_slot(req.table, p, B)
        return {"written": written}

    def decode(self, step):
        layer, B = step.layer, self.B
        req = self.requests[layer, step.request]
        last = step.positions[-1]
        need = sum(1 for i in range(step.position // B, last // B + 1)
                   if i >= len(req.table) or (self.copy_on_write and self.refs[layer][req.table[i]] > 1))
        if need > len(self.free[layer]):  # refuse before changing anything
            raise kvcheck.Refusal("out-of-blocks", f"layer {layer}: {need} blocks wanted")
        moved, freed = [], []
        for i in range(step.position // B, last // B + 1):
            if i == len(req.table):
                req.table.append(self.take(layer))
            elif self.copy_on_write and self.refs[layer][req.table[i]] > 1:
                old, new = req.table[i], self.take(layer)
                for p in range(i * B, min((i + 1) * B, step.position)):
                    moved.append([old * B + p % B, new * B + p % B])
                req.table[i] = new
                self.drop(layer, old, freed)  # still held by the other table: frees nothing
        written = [kvcheck.block_slot(req.table, p, B) for p in step.positions]
        read = [[kvcheck.block_slot(req.table, j, B) for j in range(self.first_seen(layer, p), p + 1)]
                for p in step.positions]
        if step.kind != "verify":
            req.length = last + 1
        self.slide(layer, req, freed, pending=step.kind == "verify")
        return kvcheck.answer(written=written, read=read, moved=moved, freed=freed)

    prefill = verify = decode  # store_then_load prefills only: this cache stores a chunk before it attends

    def accept(self, layer, state, request, accepted):
        req = self.requests[layer, request]
        req.length += 1 + accepted  # the verified token and the accepted drafts
        freed = []
        self.slide(layer, req, freed)
        return kvcheck.slot_events(freed=freed)

    def finish(self, layer, state, request):
        freed = []
        for block in self.requests.pop((layer, request)).table:
            if block >= 0:
                self.drop(layer, block, freed)
        return kvcheck.slot_events(freed=freed)

    def reset(self, layer, state, request):
        events = self.finish(layer, state, request)
        self.requests[layer, request] = Request()
        return events


class SkipCopyOnWrite(PagedPrefixCache):
    copy_on_write = False  # a bug engines have shipped: the sharer's first write lands in the shared block


if __name__ == "__main__":
    kvcheck.serve(PagedPrefixCache)
