"""A paged KV cache over PyTorch tensors, written the way engines write one,
served to kvcheck with the kvcheck package.

    kvcheck check --impl "exec:python3 python/examples/torch_paged_cache.py" --cases 200

Per layer: a block pool per tensor, k_pool and v_pool [blocks, BLOCK_SIZE,
kv_heads, head_dim] in the case's format (float32 or float64), a block table
tensor [states, table_width] (int64, -1: no block) and one free list (LIFO).
A write step allocates blocks for its new positions, rotates the keys (RoPE
at each row's position), scatters keys and values into the pool
(index_copy_ on the slots block_table[p // B] * B + p % B), then each query
gathers the step's window span through the block table once (index_select)
and attends, each query masked to its own window, sink included, in batches
of queries; blocks no later query can see are freed after the
step. Rows arrive as numpy arrays (rows = "numpy") and leave as tensors.
"""

import math
import os
import sys

import torch

try:
    import kvcheck
except ImportError:  # not installed: the package beside this example, in a checkout's python/
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import kvcheck

BLOCK_SIZE = 4
DTYPES = {"f64": torch.float64, "f32": torch.float32}


def rope(x, positions, spec):
    """x [n, heads, head_dim] float64 rotated at `positions` [n] (neox or interleaved pairs)."""
    r = spec.rotary_dims
    if spec.rope_style == "none" or r == 0:
        return x
    half = r // 2
    theta = spec.rope_base ** (-2.0 * torch.arange(half, dtype=torch.float64) / r)  # [half]
    angle = positions.to(torch.float64)[:, None, None] * theta  # [n, 1, half]
    cos, sin = torch.cos(angle), torch.sin(angle)
    if spec.rope_style == "neox":
        a, b = x[..., :half], x[..., half:r]
    else:
        a, b = x[..., 0:r:2], x[..., 1:r:2]
    a2, b2 = a * cos - b * sin, a * sin + b * cos
    out = x.clone()
    if spec.rope_style == "neox":
        out[..., :half], out[..., half:r] = a2, b2
    else:
        out[..., 0:r:2], out[..., 1:r:2] = a2, b2
    return out


class PagedLayer:
    def __init__(self, spec, dtype):
        self.blocks = spec.states * (math.ceil(spec.capacity / BLOCK_SIZE) + 1)
        shape = (self.blocks * BLOCK_SIZE, spec.kv_heads, spec.head_dim)  # [blocks * B, kv_heads, head_dim]
        self.k_pool = torch.zeros(shape, dtype=dtype)
        self.v_pool = self.k_pool if spec.shared_row else torch.zeros(shape, dtype=dtype)
        self.block_table = torch.full((spec.states, 1), -1, dtype=torch.int64)  # [states, table_width]
        self.free = list(range(self.blocks - 1, -1, -1))  # pop() hands out block 0 first

    def slots(self, state, positions):
        """The slots of `positions` [n]: -1 where the table has no block (a freed one)."""
        blocks = self.block_table[state, positions // BLOCK_SIZE]
        return torch.where(blocks >= 0, blocks * BLOCK_SIZE + positions % BLOCK_SIZE, -1)

    def release(self, state, below):
        """Frees the state's blocks that hold only positions < below."""
        table = self.block_table[state, :max(0, min(below // BLOCK_SIZE, self.block_table.shape[1]))]
        self.free.extend(table[table >= 0].tolist())  # in table order, as a loop over j would
        table.fill_(-1)


class TorchPagedCache(kvcheck.Engine):
    """Paged KV cache over torch tensors (index_copy_ into a block pool, index_select through a block table)."""

    name = "torch-paged-cache"
    formats = ["f64", "f32"]
    addressing = "paged"
    slots = True
    rows = "numpy"
    capabilities = {"sink": True, "softmax_scale": True}

    def __init__(self, spec):
        super().__init__(spec)
        if spec.format not in DTYPES:
            raise kvcheck.OpenRefused(f"format {spec.format}")
        self.dtype = DTYPES[spec.format]
        self.layers = [PagedLayer(spec, self.dtype) for _ in range(spec.layers)]

    def decode(self, step):
        spec, layer = self.spec, self.layers[step.layer]
        n, kvh, d = step.rows, spec.kv_heads, spec.head_dim
        positions = torch.arange(step.position, step.position + n)
        # Allocate the blocks the new rows need; refuse before changing anything.
        last_block = (step.position + n - 1) // BLOCK_SIZE
        if last_block >= layer.block_table.shape[1]:
            grow = torch.full((spec.states, last_block + 1 - layer.block_table.shape[1]), -1, dtype=torch.int64)
            layer.block_table = torch.cat([layer.block_table, grow], dim=1)
        table = layer.block_table[step.state]
        needed = [j for j in range(step.position // BLOCK_SIZE, last_block + 1) if table[j] < 0]
        if len(needed) > len(layer.free):
            raise kvcheck.Refusal("out-of-blocks", f"{len(needed)} blocks needed, {len(layer.free)} free")
        for j in needed:
            table[j] = layer.free.pop()

        k = rope(torch.from_numpy(step.k).view(n, kvh, d), positions, spec).to(self.dtype)
        v = k if spec.shared_row else torch.from_numpy(step.v).view(n, kvh, d).to(self.dtype)
        written = layer.slots(step.state, positions)
        layer.k_pool.index_copy_(0, written, k)
        if not spec.shared_row:
            layer.v_pool.index_copy_(0, written, v)

        q = rope(torch.from_numpy(step.q).view(n, spec.q_heads, d), positions, spec).to(self.dtype)
        q = q.view(n, kvh, spec.group, d)  # query heads grouped by the KV head they share
        # Every query of the step reads through the block table at once: the
        # step's window span lo..last, each query masked to its own window.
        lo = max(0, step.position - spec.keys + 1)
        span = torch.arange(lo, step.position + n)
        span_slots = layer.slots(step.state, span)  # -1: the block is gone (kvcheck sees the row missing)
        keys = layer.k_pool.index_select(0, span_slots.clamp(min=0))  # [m, kv_heads, d]
        values = layer.v_pool.index_select(0, span_slots.clamp(min=0))
        out = torch.empty((n, kvh, spec.group, d), dtype=self.dtype)
        # Batches of queries, each over the part of the span its queries see (g
        # queries see keys + g - 1 positions): at most max(keys, 64) queries
        # and 4M scores a batch.
        group = max(1, min(max(spec.keys, 64), (1 << 22) // (spec.q_heads * 2 * spec.keys)))
        for a in range(0, n, group):
            b = min(n, a + group)
            s0, s1 = max(0, step.position + a - spec.keys + 1) - lo, step.position + b - lo
            first = (positions[a:b] - spec.keys + 1)[:, None]  # [g, 1] each query's first visible position
            seen = (span[None, s0:s1] >= first) & (span[None, s0:s1] <= positions[a:b, None]) \
                & (span_slots[None, s0:s1] >= 0)
            scores = torch.einsum("gkcd,mkd->gkcm", q[a:b], keys[s0:s1]) * spec.softmax_scale
            scores = scores.masked_fill(~seen[:, None, None, :], float("-inf"))
            if spec.sink is not None:
                sink = torch.full(scores.shape[:-1] + (1,), spec.sink, dtype=self.dtype)
                weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
            else:
                weights = torch.softmax(scores, dim=-1)
            out[a:b] = torch.einsum("gkcm,mkd->gkcd", weights, values[s0:s1])
        read = [span_slots[max(0, p - spec.keys + 1) - lo:p + 1 - lo] for p in range(step.position, step.position + n)]
        out = out.reshape(n, -1)

        layer.release(step.state, step.position + n - spec.keys + 1)  # what the next query still sees
        stored = kvcheck.stored_rows(k.reshape(n, -1), None if spec.shared_row else v.reshape(n, -1))
        return kvcheck.answer(out=out, written=written, read=read, stored=stored)

    prefill = decode  # store_then_load: every row of the chunk is stored, then every query reads

    def finish(self, layer, state, request):
        self.layers[layer].release(state, sys.maxsize)

    reset = finish  # the request starts again at position 0: its old rows are stale


if __name__ == "__main__":
    kvcheck.serve(TorchPagedCache)
