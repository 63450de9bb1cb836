"""The base class an engine's adapter subclasses: one method per step.

    import kvcheck

    class MyCache(kvcheck.Engine):          # one instance per case (`open`)
        formats = ["f32"]                   # what the hello declares ...
        outputs = False                     # ... a block manager without a kernel
        def __init__(self, spec):           # kvcheck.Spec; raise kvcheck.OpenRefused(why)
            super().__init__(spec)
        def decode(self, step):             # kvcheck.WriteStep
            return kvcheck.answer(written=[...], read=[[...]])

    if __name__ == "__main__":
        kvcheck.serve(MyCache)

The steps a subclass defines are the steps its hello declares: `prefill`
(in the orders of `prefill_orders`), `decode`, `verify` with `accept`,
`finish`, `reset`, `trim`, `preempt`; `begin` is always there (by default it does nothing).
Class attributes say the rest of the hello: `name`, `formats`, `rope`,
`layouts`, `addressing`, `outputs`, `slots`, `rows`, `lookahead_slots`,
`free_deferral_steps`, `shared_pool`, `recompute_in_step` and `capabilities` (any
other hello key: `sink`, `softmax_scale`, `max_states`, `head_dim`,
`probes`, ...; it wins over what the attributes say).

The helpers build what an answer reports: `answer` (the dict a writing step
returns), `ring_slot` and `block_slot` (slot ids from a ring or a block
table), `window` (the positions a query sees), `stored_rows`, `round_output`
(outputs rounded into a declared `output_format`).
"""

import math
import sys

from . import protocol

__all__ = ["Engine", "answer", "slot_events", "ring_slot", "block_slot", "window", "stored_rows", "round_output",
           "EngineAdapter"]

_ORDERS = {"store_then_load": "prefill_store_then_load", "load_then_store": "prefill_load_then_store"}


class Engine:
    """One case of an engine's cache, made at `open` with the case's Spec and
    dropped at `close`. Subclass it and define one method per step the cache
    runs; each may raise `Refusal(code, detail)` and must then change nothing.

    * `begin(layer, state, request)`, `accept(layer, state, request,
      accepted)`, `finish(layer, state, request)`, `reset(layer, state,
      request)`, `trim(layer, state, request, positions)`, `preempt(layer,
      state, request)` (docs/semantics.md "Preemption": drop the request's
      rows; defined with `resume`): return nothing,
      or the step's slot events built with `slot_events(...)` (a free; a
      `begin` evicting blocks to make room frees too: judged as any step's,
      a row a query still to run may read must not be freed);
    * `prefill(step)`, `decode(step)`, `verify(step)` (a WriteStep): return
      the answer, built with `answer(...)`."""

    name = None                     # hello's "name"; default: the class name
    formats = ["f32"]
    rope = ["none", "neox", "interleaved"]
    layouts = ["mha", "gqa", "mqa", "shared"]
    prefill_orders = ["store_then_load"]  # the orders `prefill` runs
    addressing = None               # "ring", "paged" or "opaque" (the protocol's default)
    outputs = True                  # False: no `out`; kvcheck computes outputs over the slots read
    slots = None                    # answers carry `written` and `read` (default: when outputs is False)
    rows = "lists"                  # "numpy": step.k, .v, .q as float64 arrays [rows, width]
    output_format = None            # "bf16", "fp16", "f32", "f64": the format outputs are written in
    cached = False                  # True: answers may carry `cached` (hello "reports": {"cached": true})
    capabilities = {}               # any other hello key; wins over the attributes
    # Declared slack (docs/semantics.md "Lookahead slots and deferred frees"):
    lookahead_slots = 0             # positions past each step's rows it takes room for (vLLM num_lookahead_tokens)
    free_deferral_steps = None      # write steps of its request a free may come late (SGLang eviction_interval)
    # One pool of slots for all layers (docs/semantics.md "One pool across layers"): vLLM's hybrid
    # manager and SGLang's hybrid allocator draw every layer group's blocks from one pool; open's
    # spec.pool_blocks is then that one pool, the sum of every layer's share.
    shared_pool = False
    # Prefix rows recomputed in a step (docs/semantics.md "Recompute in a step"): begin_prefix and
    # resume may return "recompute" (positions left to the request's next writing step), and that
    # step's answer(..., recomputed=[(position, slot), ...]) says where it stored them.
    recompute_in_step = False

    def __init__(self, spec):
        self.spec = spec

    def begin(self, layer, state, request):
        pass

    # An engine that shares prefixes defines begin_prefix(layer, state,
    # request, prefix) (a kvcheck.protocol.Prefix): its hello then says
    # "prefix_sharing"; it returns None or {"written": [slot or -1, ...]},
    # with any slot events of the begin beside it (an eviction's "freed").
    begin_prefix = None

    # An engine that preempts (defines preempt) defines resume(layer, state,
    # request, prefix) too: the begin before a preempted request's next
    # step, carrying its own committed rows (prefix.request is the request
    # itself; docs/semantics.md "Preemption"). It returns what begin_prefix
    # does: None or {"written": [slot or -1, ...]} (-1: a row it still holds).
    resume = None

    @classmethod
    def hello_capabilities(cls):
        """The hello answer's "capabilities", from the attributes and the
        step methods the class defines."""
        steps = []
        if getattr(cls, "prefill", None) is not None:
            for order in cls.prefill_orders:
                if order not in _ORDERS:
                    raise TypeError(f"{cls.__name__}.prefill_orders: one of {list(_ORDERS)}, got {order!r}")
                steps.append(_ORDERS[order])
        for kind in ("decode", "verify", "accept", "finish", "reset", "trim", "preempt"):
            if getattr(cls, kind, None) is not None:
                steps.append(kind)
        if ("verify" in steps) != ("accept" in steps):
            raise TypeError(f"{cls.__name__}: verify and accept go together (define both or neither)")
        if not any(s in steps for s in ("decode", "verify") + tuple(_ORDERS.values())):
            raise TypeError(f"{cls.__name__}: define at least one of prefill, decode, verify")
        caps = {"steps": steps, "formats": list(cls.formats), "rope": list(cls.rope), "layouts": list(cls.layouts)}
        slots = (not cls.outputs) if cls.slots is None else cls.slots
        if slots:
            caps["reports"] = {"written_slots": True, "read_slots": True}
        if cls.cached:
            caps.setdefault("reports", {})["cached"] = True
        if not cls.outputs:
            caps["outputs"] = False
        if cls.addressing is not None:
            caps["addressing"] = cls.addressing
        if cls.begin_prefix is not None:
            caps["prefix_sharing"] = True
        if ("preempt" in steps) != (cls.resume is not None):
            raise TypeError(f"{cls.__name__}: preempt and resume go together (define both or neither)")
        for key in ("lookahead_slots", "free_deferral_steps"):
            value = getattr(cls, key)
            if value is None or (key == "lookahead_slots" and value == 0):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65536:
                raise TypeError(f"{cls.__name__}.{key}: an integer in 0..65536, got {value!r}")
            caps[key] = value
        if cls.shared_pool is not False:
            if cls.shared_pool is not True:
                raise TypeError(f"{cls.__name__}.shared_pool: True or False, got {cls.shared_pool!r}")
            if cls.addressing == "ring":
                raise TypeError(f"{cls.__name__}.shared_pool: a pool shared by the layers needs paged or "
                                "opaque addressing (a ring's slots are one layer's)")
            caps["shared_pool"] = True
        if cls.recompute_in_step is not False:
            if cls.recompute_in_step is not True:
                raise TypeError(f"{cls.__name__}.recompute_in_step: True or False, got {cls.recompute_in_step!r}")
            if cls.begin_prefix is None and cls.resume is None:
                raise TypeError(f"{cls.__name__}.recompute_in_step: needs begin_prefix or resume (a begin "
                                "carrying rows to leave to a step)")
            caps["recompute_in_step"] = True
        if cls.output_format is not None:
            if cls.output_format not in protocol.OUTPUT_FORMATS:
                raise TypeError(f"{cls.__name__}.output_format: one of {protocol.OUTPUT_FORMATS}, "
                                f"got {cls.output_format!r}")
            if not cls.outputs:
                raise TypeError(f"{cls.__name__}: output_format needs outputs (an engine without outputs "
                                "writes none)")
            caps["output_format"] = cls.output_format
        caps.update(cls.capabilities)
        if "free_deferral_steps" in caps and not (caps.get("reports") or {}).get("frees"):
            raise TypeError(f"{cls.__name__}.free_deferral_steps: a free deferral needs frees reported "
                            f"(capabilities = {{\"reports\": {{..., \"frees\": True}}}})")
        return caps


class _Case(protocol.Cache):
    # One open case: the protocol's Cache over an Engine instance.
    def __init__(self, engine):
        self.engine = engine

    def begin(self, layer, state, request, prefix=None):
        if prefix is not None and prefix.request == request and self.engine.resume is not None:
            return self.engine.resume(layer, state, request, prefix)  # a preempted request resumes
        if prefix is not None:
            return self.engine.begin_prefix(layer, state, request, prefix)
        return self.engine.begin(layer, state, request)

    def accept(self, layer, state, request, accepted):
        return self.engine.accept(layer, state, request, accepted)

    def finish(self, layer, state, request):
        return self.engine.finish(layer, state, request)

    def reset(self, layer, state, request):
        return self.engine.reset(layer, state, request)

    def trim(self, layer, state, request, positions):
        return self.engine.trim(layer, state, request, positions)

    def preempt(self, layer, state, request):
        return self.engine.preempt(layer, state, request)

    def write(self, step):
        result = getattr(self.engine, step.kind)(step)
        return {"ok": True} if result is None else result


class EngineAdapter(protocol.Adapter):
    """The adapter program serving an Engine subclass (what `serve` runs)."""

    def __init__(self, engine_class):
        if not (isinstance(engine_class, type) and issubclass(engine_class, Engine)):
            raise TypeError(f"{engine_class!r} is not a kvcheck.Engine subclass")
        self.engine_class = engine_class
        self.name = engine_class.name or engine_class.__name__
        self.rows = engine_class.rows
        self.__doc__ = engine_class.__doc__
        self.caps = engine_class.hello_capabilities()  # errors show at start, not at hello

    def capabilities(self):
        return self.caps

    def make_cache(self, spec):
        return _Case(self.engine_class(spec))


def serve(engine_class, argv=None):
    """Serves kvcheck's exec protocol on stdin/stdout for an Engine subclass
    (or a protocol.Adapter subclass) and exits with its code. While it
    serves, print() and anything else written to sys.stdout goes to stderr:
    stdout carries only answers."""
    answers = sys.stdout.buffer
    sys.stdout = sys.stderr
    if isinstance(engine_class, type) and issubclass(engine_class, protocol.Adapter):
        adapter = engine_class()
    else:
        adapter = EngineAdapter(engine_class)
    adapter.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        code = protocol.Session(adapter).serve(sys.stdin.buffer, answers)
    except BrokenPipeError:
        code = 0  # kvcheck went away without bye
    raise SystemExit(code)


def answer(out=None, written=None, read=None, stored=None, causal=False, padded=None, moved=None,
           freed=None, cached=None, recomputed=None):
    """A writing step's answer: `out` (one output row per new row), `written`
    (one slot per new row), `read` (one list of slots per query; -1 entries
    are ignored), `stored` (from `stored_rows`), `causal` (True for a
    load_then_store prefill whose queries read the pool as it was before the
    step: read_view "causal"). Lists, numpy arrays or tensors. The slot
    events (`slot_events`) go in too when given, and `recomputed`: the
    (position, slot) of each prefix row the step stored that its request's
    begin left to it (an engine with `recompute_in_step = True`)."""
    result = {"ok": True}
    result.update(slot_events(padded, moved, freed, cached))
    if recomputed is not None and len(recomputed) > 0:
        result["recomputed"] = [[int(p), int(s)] for p, s in recomputed]
    if out is not None:
        result["out"] = out
    if written is not None:
        result["written"] = written
    if read is not None:
        result["read"] = read
    result["read_view"] = "causal" if causal else "after_writes"
    if stored is not None:
        result["stored"] = stored
    return result


def slot_events(padded=None, moved=None, freed=None, cached=None):
    """The slot events of a step (adapters/PROTOCOL.md "Padding, moves and
    frees"), as a step method returns them for a step without rows (or
    `answer` puts them in a writing step's answer): `padded`, slots written
    with no token; `moved`, [from, to] pairs, a row copied from slot to
    slot; `freed`, slots released; `cached`, slots released to the free pool
    whose rows a later prefix begin may still read until a write reuses them
    (PROTOCOL.md "Cached rows": an engine with `cached = True`). Empty ones
    are left out."""
    events = {}
    for key, value in (("padded", padded), ("moved", moved), ("freed", freed), ("cached", cached)):
        if value is not None and len(value) > 0:
            events[key] = value
    return events


def ring_slot(spec, state, position):
    """The slot of `position` in a ring of spec.capacity rows per state:
    state * capacity + position mod capacity (addressing "ring")."""
    return state * spec.capacity + position % spec.capacity


def block_slot(block_table, position, block_size):
    """The slot of `position` through a block table (block index ->
    block id; a list, array or tensor row): block_id * block_size +
    position mod block_size, or -1 when the table has no block there (a
    negative id or past its end: the read is then reported as missing)."""
    index = position // block_size
    if index >= len(block_table):
        return -1
    block = int(block_table[index])
    return -1 if block < 0 else block * block_size + position % block_size


def window(spec, position, layer=None):
    """The positions a query at `position` sees: max(0, position - keys + 1)
    .. position (spec.keys, the window in keys, itself included). With
    `layer`, that layer's own window (spec.window_of(layer); a global layer
    sees 0 .. position)."""
    keys = spec.keys if layer is None else spec.window_of(layer)
    if keys is None:
        return range(0, position + 1)
    return range(max(0, position - keys + 1), position + 1)


def stored_rows(k, v=None):
    """The `stored` of an answer: each new row as the cache stored it (keys
    after RoPE), decoded to numbers; no `v` for shared rows."""
    return {"k": k} if v is None else {"k": k, "v": v}


# The output formats' significand bits (leading bit included), smallest
# normal exponent and largest finite value (support/formats.hpp
# KVCHECK_OUTPUT_FORMATS).
_OUTPUT_FORMAT_TABLE = {
    "f64": (53, -1022, sys.float_info.max),
    "f32": (24, -126, float.fromhex("0x1.fffffep127")),
    "bf16": (8, -126, float.fromhex("0x1.fep127")),
    "fp16": (11, -14, 65504.0),
}


def round_output(values, output_format, truncate=False):
    """`values` (numbers) rounded once, to nearest with ties to even, from
    the double each is straight into `output_format` ("bf16", "fp16",
    "f32", "f64"): what a kernel that declares that `output_format` returns
    for its accumulated results (gradual underflow; a rounding past the
    largest finite value gives +-inf). `truncate=True` rounds toward zero
    instead (a planted bug; not what a declared format means)."""
    if output_format not in _OUTPUT_FORMAT_TABLE:
        raise ValueError(f"output_format: one of {protocol.OUTPUT_FORMATS}, got {output_format!r}")
    digits, emin, largest = _OUTPUT_FORMAT_TABLE[output_format]
    out = []
    for x in values:
        x = float(x)
        if x == 0.0 or not math.isfinite(x):
            out.append(x)
            continue
        _, e = math.frexp(x)  # |x| in [2^(e-1), 2^e)
        q = max(e - 1, emin) - (digits - 1)  # the spacing there: 2^q
        t = math.ldexp(x, -q)  # exact: a scaling by a power of two
        y = math.ldexp(math.trunc(t) if truncate else round(t), q)  # round(): ties to even
        if abs(y) > largest:
            y = math.inf
        out.append(math.copysign(y, x))  # keeps the sign of a value that rounded to zero
    return out
