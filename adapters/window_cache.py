"""The sliding-window caches the bundled adapters are built on (ring_cache.py,
paged_cache.py): the math, the step semantics both share, and the adapter
switches the tests use. Standard library only; the protocol itself is
the kvcheck package's kvcheck.protocol (python/kvcheck/protocol.py).

* the math: RoPE, rounding of stored rows through f32/bf16, attention with an
  optional sink logit (`rotate_heads`, `ROUNDERS`, `attend`);
* `WindowCache`, the step semantics both caches share (begin, both prefill
  orders, decode, verify/accept, finish, reset, trim) with hooks for the addressing
  (ring_cache.py, paged_cache.py). Every refusal is decided before anything is
  changed, so a refused step leaves the cache exactly as it was;
* `WindowAdapter`, their adapter program: named bugs (`--bug`, `--list-bugs`)
  and the switches that make a bundled cache answer as other engines do
  (`--no-slots`, `--no-outputs`, `--require-head-dim-multiple`,
  `--undeclared-limits`).

These caches are deliberately separate from kvcheck's C++ code
(scenarios/step_semantics.hpp, impl/ring_pool.cpp): they are implementations
under test, and a mistake shared with kvcheck would hide itself.
"""

import math
import os
import sys
from array import array

# The kvcheck package: the repository's python/ when run from the repository,
# else the installed one.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from kvcheck import protocol as kp  # noqa: E402

# The formats these caches store (a subset of kvcheck.protocol.FORMATS).
FORMATS = ["f64", "f32", "bf16"]

# Slots are JSON integers that kvcheck reads as int64; keep every id well inside.
MAX_SLOTS = 1 << 52

# Padding rows of a padded prefill go to scratch slots from here on (a region
# of their own, as vLLM's null block): state b's j-th padding row at
# PAD_BASE + b * pad_to + j, never a slot of a token's row.
PAD_BASE = MAX_SLOTS


# ---------------------------------------------------------------------------
# Math

class Rope:
    """Rotation pairs of one head slice and their frequencies."""
    __slots__ = ("pairs", "thetas")

    def __init__(self, pairs, thetas):
        self.pairs = pairs
        self.thetas = thetas


def make_rope(style, rotary_dims, base):
    """None when nothing rotates (style "none" or rotary width 0)."""
    if style == "none" or rotary_dims == 0:
        return None
    half = rotary_dims // 2
    thetas = [base ** (-2 * i / rotary_dims) for i in range(half)]
    if style == "neox":
        pairs = [(i, i + half) for i in range(half)]
    else:  # interleaved
        pairs = [(2 * i, 2 * i + 1) for i in range(half)]
    return Rope(pairs, thetas)


def rotate_heads(row, heads, head_dim, position, rope):
    """RoPE of every head slice of `row` at `position` (a new list)."""
    if rope is None:
        return list(row)
    out = list(row)
    cs = [(math.cos(position * t), math.sin(position * t)) for t in rope.thetas]
    pairs = rope.pairs
    for h in range(heads):
        o = h * head_dim
        for (a, b), (c, s) in zip(pairs, cs):
            x = out[o + a]
            y = out[o + b]
            out[o + a] = x * c - y * s
            out[o + b] = x * s + y * c
    return out


def round_f64(row):
    return row


def round_f32(row):
    # array('f') converts each double with a C cast: round to nearest even,
    # overflow to +-inf.
    return array("f", row).tolist()


_BF16_OVERFLOW = 2.0 ** 128


def bf16(x):
    """Round a double straight to bf16 (8 significant bits, binary32's
    exponent range with subnormals), ties to even, without passing through
    binary32 first (which could round twice)."""
    if x == 0.0 or not math.isfinite(x):
        return x
    _, e = math.frexp(x)  # |x| in [2^(e-1), 2^e)
    # Quantum: 2^(e-8) for normal values, 2^-133 below 2^-126 (subnormals).
    q = max(e, -125) - 8
    y = math.ldexp(round(math.ldexp(x, -q)), q)  # scaling by 2^k is exact; round() ties to even
    if abs(y) >= _BF16_OVERFLOW:
        return math.copysign(math.inf, x)
    return math.copysign(y, x)  # keeps the sign of a value that rounded to zero


def round_bf16(row):
    return [bf16(x) for x in row]


ROUNDERS = {"f64": round_f64, "f32": round_f32, "bf16": round_bf16}

_fsum = math.fsum
_exp = math.exp


def attend(q, entries, spec):
    """Attention of one (rotated) query row over `entries`, a list of
    (key row, value row) as stored. Returns q_heads * head_dim numbers.

    Per query head h (KV head h // group): score_j = scale * q_h . k_j,
    softmax with the sink logit as an extra column that has no value."""
    hd = spec.head_dim
    group = spec.group
    scale = spec.softmax_scale
    sink = spec.sink
    out = []
    if not entries:
        return [0.0] * spec.q_width
    for h in range(spec.q_heads):
        qo = h * hd
        ko = (h // group) * hd
        qh = q[qo:qo + hd]
        scores = [scale * _fsum([a * b for a, b in zip(qh, k[ko:ko + hd])]) for k, _ in entries]
        m = max(scores)
        if sink is not None and sink > m:
            m = sink
        e = [_exp(s - m) for s in scores]
        total = _fsum(e)
        if sink is not None:
            total += _exp(sink - m)
        w = [x / total for x in e]
        for d in range(ko, ko + hd):
            out.append(_fsum([wj * v[d] for wj, (_, v) in zip(w, entries)]))
    return out


# ---------------------------------------------------------------------------
# Step semantics shared by the caches

class StateInfo:
    """One state id of one layer."""
    __slots__ = ("busy", "request", "length", "pending_first", "pending_drafts", "table")

    def __init__(self):
        self.busy = False
        self.request = None
        self.length = 0           # committed positions: the next write goes here
        self.pending_first = -1   # first position of a verify awaiting accept
        self.pending_drafts = -1  # its k, -1 when none
        self.table = None         # paged cache: block table {block index: block id}


class Layer:
    """One layer's pool: slot -> (stored key row, stored value row), and the
    keys a query of the layer sees (None: a global layer, every position)."""

    def __init__(self, states):
        self.states = [StateInfo() for _ in range(states)]
        self.rows = {}
        self.keys = None


class WindowCache(kp.Cache):
    """A sliding-window KV cache of `spec.layers` independent layers.

    Subclasses give the addressing: write_slot/read_slot, and optionally
    reserve (refuse before a step changes anything), before_store (called
    before each new row of a load_then_store step is stored), after_step
    (after every write step and accept), release (finish and reset), and
    key_rope_position. `read_keys` is how many positions a query reads (in
    a layer of its own window: that window's keys, plus what a bug adds to
    read_keys; a global layer reads every position).

    Bug switches shared by both caches: layer-window-swapped (every layer
    reads with layer 0's window, as an engine that indexes its per-layer
    window table with the wrong layer) and trim-keeps-drafts."""

    def __init__(self, spec, bugs):
        # What a well-formed spec may still ask that these caches do not do.
        if spec.format not in ROUNDERS:
            raise kp.OpenRefused(f"format {spec.format} is not supported (supported: {', '.join(FORMATS)})")
        if spec.rope_style not in kp.ROPE_STYLES:
            raise kp.OpenRefused(f"rope style {spec.rope_style} is not supported")
        if spec.states * spec.capacity > MAX_SLOTS:
            raise kp.OpenRefused(f"states * capacity = {spec.states * spec.capacity} exceeds {MAX_SLOTS}")
        self.spec = spec
        self.bugs = bugs
        self.rope = make_rope(spec.rope_style, spec.rotary_dims, spec.rope_base)
        self.round = ROUNDERS[spec.format]  # stored rows go through this
        self.read_keys = spec.keys
        # trim-keeps-drafts (both caches): a trim rewinds the length but leaves
        # a pending verify pending (its drafts "accepted" later over the trimmed rows).
        self.trim_keeps_drafts = "trim-keeps-drafts" in bugs
        # --pad-prefill N: every prefill is padded to a multiple of N rows,
        # the padding written (zeros) at pad_slot and answered as "padded".
        self.pad_to = 0
        self.freed_now = []  # slots released by the step under way (answered as "freed"; paged_cache.py)
        self.cached_now = []  # slots released with their rows kept for a prefix hit ("cached"; paged_cache.py)
        self.outputs = True  # False for --no-outputs: no attention computed, none answered
        self.slots = True    # False for --no-slots: no written or read slots answered
        self.layers = [self.new_layer() for _ in range(spec.layers)]
        for i, lay in enumerate(self.layers):
            lay.keys = spec.window_of(0 if "layer-window-swapped" in bugs else i)

    # -- hooks -------------------------------------------------------------
    def new_layer(self):
        return Layer(self.spec.states)

    def write_slot(self, layer, st, b, p):
        raise NotImplementedError

    def read_slot(self, layer, st, b, p):
        raise NotImplementedError

    def reserve(self, layer, st, b, first, n, load_then_store):
        pass

    def pad_slot(self, layer, st, b, p, j):
        """Where the j-th padding row (after position p - j - 1, the step's
        last) goes: a scratch slot, never a token's."""
        return PAD_BASE + b * self.pad_to + j

    def _pad(self, lay, st, state, first, n):
        """Pads a prefill of n rows to a multiple of pad_to: zero rows
        written at pad_slot. Returns the slots."""
        if self.pad_to <= 1:
            return []
        zero = [0.0] * self.spec.kv_width
        slots = []
        for j in range(-n % self.pad_to):
            s = self.pad_slot(lay, st, state, first + n + j, j)
            lay.rows[s] = (zero, zero)
            slots.append(s)
        return slots

    def note_freed(self, slots):
        """Slots the step under way released (answered as "freed")."""
        self.freed_now.extend(slots)

    def events(self):
        """The slot events of a step without rows (None when there are none)."""
        events = {}
        if self.freed_now:
            events["freed"] = list(self.freed_now)
        if self.cached_now:
            events["cached"] = list(self.cached_now)
        return events or None

    def _store(self, lay, st, state, first, stored, pool, hook):
        """Writes the step's rows; `hook`: call before_store before each."""
        written = []
        for j, row in enumerate(stored):
            if hook:
                self.before_store(lay, st, state, first, j)
            s = self.write_slot(lay, st, state, first + j)
            pool[s] = row
            written.append(s)
        return written

    def _attend_all(self, lay, queries, first, lookup, spec):
        """Each query's read slots (-1: nothing there) and output; lookup(x)
        gives position x's (slot, stored row or None)."""
        reads, out = [], []
        for i, query in enumerate(queries):
            p = first + i
            slots, entries = [], []
            for x in range(self.visible_first(lay, p), p + 1):
                s, e = lookup(x)
                if e is None:
                    s = -1
                else:
                    entries.append(e)
                slots.append(s)
            reads.append(slots)
            out.append(attend(query, entries, spec) if self.outputs else None)
        return reads, out

    def before_store(self, layer, st, b, first, j):
        pass

    def after_step(self, layer, st, b):
        pass

    def release(self, layer, st, b):
        pass

    def key_rope_position(self, p):
        return p

    def stored_row(self, k_row, v_row, p):
        """Position p's (key, value) as the cache stores them: the key
        rotated at its RoPE position, both rounded to the format (v_row None:
        one shared row)."""
        key = self.round(rotate_heads(k_row, self.spec.kv_heads, self.spec.head_dim, self.key_rope_position(p),
                                      self.rope))
        return key, key if v_row is None else self.round(v_row)

    # -- lookups -------------------------------------------------------------
    def layer_keys(self, lay):
        """Keys a query of layer `lay` reads (None: every position)."""
        if lay.keys is None:
            return None
        return lay.keys + (self.read_keys - self.spec.keys)

    def visible_first(self, lay, p):
        keys = self.layer_keys(lay)
        return 0 if keys is None else max(0, p - keys + 1)

    def _layer(self, layer):
        if layer >= len(self.layers):
            raise kp.Refusal("layer-out-of-range", f"layer {layer} of {len(self.layers)}")
        return self.layers[layer]

    def _state(self, lay, state):
        if state >= len(lay.states):
            raise kp.Refusal("state-out-of-range", f"state {state} of {len(lay.states)}")
        return lay.states[state]

    def _busy_state(self, layer, state, request):
        self.freed_now = []  # every step but begin starts here
        self.cached_now = []
        lay = self._layer(layer)
        st = self._state(lay, state)
        if not st.busy:
            raise kp.Refusal("state-free", f"state {state} of layer {layer} has no request")
        if st.request != request:
            raise kp.Refusal("request-mismatch",
                          f"state {state} of layer {layer} holds request {st.request}, not {request}")
        return lay, st

    # -- steps ---------------------------------------------------------------
    def begin(self, layer, state, request):
        self.freed_now = []  # a begin may free too (a prefix cache's eviction)
        self.cached_now = []
        lay = self._layer(layer)
        st = self._state(lay, state)
        if st.busy:
            raise kp.Refusal("state-busy", f"state {state} of layer {layer} holds request {st.request}")
        st.busy = True
        st.request = request
        st.length = 0
        st.pending_first = st.pending_drafts = -1
        st.table = {}

    # The adapter's own copy of the docs/semantics.md "Steps" step semantics, deliberately not
    # derived from kvcheck's (scenarios/step_semantics.hpp): a mistake in one
    # must show up as a disagreement with the other.
    def accept(self, layer, state, request, accepted):
        lay, st = self._busy_state(layer, state, request)
        if st.pending_drafts < 0:
            raise kp.Refusal("bad-accept", "no verify is pending")
        if accepted < 0 or accepted > st.pending_drafts:
            raise kp.Refusal("bad-accept", f"accept({accepted}) outside 0..{st.pending_drafts}")
        # The verified token plus the accepted drafts are committed; the
        # rejected drafts' rows stay where they were written.
        st.length = st.pending_first + 1 + accepted
        st.pending_first = st.pending_drafts = -1
        self.after_step(lay, st, state)
        return self.events()

    def finish(self, layer, state, request):
        lay, st = self._busy_state(layer, state, request)
        self.release(lay, st, state)
        st.busy = False
        st.request = None
        st.length = 0
        st.pending_first = st.pending_drafts = -1
        st.table = None
        return self.events()

    def reset(self, layer, state, request):
        lay, st = self._busy_state(layer, state, request)
        self.release(lay, st, state)
        st.length = 0
        st.pending_first = st.pending_drafts = -1
        st.table = {}
        return self.events()

    def trim(self, layer, state, request, positions):
        lay, st = self._busy_state(layer, state, request)
        # A pending verify never moved the committed length (it moves at the
        # accept), so n counts committed positions.
        if positions < 1 or positions > st.length:
            raise kp.Refusal("bad-trim", f"trim({positions}) outside 1..{st.length}")
        # The rows past the new length stay in their slots, stale; the next
        # write goes at the new length. A pending verify's drafts are dropped.
        st.length -= positions
        if not self.trim_keeps_drafts:
            st.pending_first = st.pending_drafts = -1
        return self.events()

    def write(self, step):
        answer = self.write_step(step)
        if not self.slots:
            del answer["written"], answer["read"]
        if not self.outputs:
            del answer["out"]
        return answer

    def write_step(self, step):
        """prefill / decode / verify (a kvcheck.protocol.WriteStep): step.rows
        rows at step.position. Returns the answer with every field."""
        kind, layer, state, request = step.kind, step.layer, step.state, step.request
        position, n, order, drafts = step.position, step.rows, step.order, step.drafts
        k, v, q = step.k, step.v, step.q
        lay, st = self._busy_state(layer, state, request)
        spec = self.spec
        if st.pending_drafts >= 0:
            raise kp.Refusal("verify-pending",
                          f"a verify at {st.pending_first} awaits its accept")
        if position != st.length:
            raise kp.Refusal("position-mismatch",
                          f"position {position}, but the request's length is {st.length}")
        if n > spec.max_step_rows:
            raise kp.Refusal("too-many-rows", f"{n} rows, max_step_rows {spec.max_step_rows}")
        first = position
        lts = order == "load_then_store"
        self.reserve(lay, st, state, first, n, lts)
        # Nothing is refused past this point.

        stored = [self.stored_row(k[i], None if v is None else v[i], first + i) for i in range(n)]
        queries = [rotate_heads(q[i], spec.q_heads, spec.head_dim, first + i, self.rope) for i in range(n)]
        pool = lay.rows
        if lts:
            # Copy the old rows any query of the step sees out of the pool,
            # then store the chunk; each query reads the copies and the
            # chunk's rows up to itself.
            lo = self.visible_first(lay, first)
            old = []
            for x in range(lo, first):
                s = self.read_slot(lay, st, state, x)
                old.append((s, pool.get(s) if s >= 0 else None))
            written = self._store(lay, st, state, first, stored, pool, True)
            padded = self._pad(lay, st, state, first, n) if kind == "prefill" else []

            def lookup(x):
                return old[x - lo] if x < first else (written[x - first], stored[x - first])

            view = "causal"
        else:
            # Store every row of the step, then every query reads the pool.
            written = self._store(lay, st, state, first, stored, pool, False)
            padded = self._pad(lay, st, state, first, n) if kind == "prefill" else []

            def lookup(x):
                s = self.read_slot(lay, st, state, x)
                return s, (pool.get(s) if s >= 0 else None)

            view = "after_writes"
        reads, out = self._attend_all(lay, queries, first, lookup, spec)

        if kind == "verify":
            st.pending_first = first
            st.pending_drafts = drafts
        else:
            st.length = first + n
        self.after_step(lay, st, state)
        answer = {"ok": True, "out": out, "written": written, "read": reads, "read_view": view,
                  "stored": {"k": [s[0] for s in stored]}}
        if v is not None:
            answer["stored"]["v"] = [s[1] for s in stored]
        if padded:
            answer["padded"] = padded
        if self.freed_now:
            answer["freed"] = list(self.freed_now)
        if self.cached_now:
            answer["cached"] = list(self.cached_now)
        return answer


class WindowAdapter(kp.Adapter):
    """The adapter program of a bundled cache: its name, addressing, named
    bugs and capabilities. Subclasses set `name`, `addressing`, `bugs`
    ({name: description}) and implement `make_cache(spec)`."""

    name = "adapter"
    addressing = "opaque"
    bugs = {}
    trims = False  # whether the cache runs trim (hello's steps list it)
    preempt = False  # whether the cache runs preempt (hello's steps list it)

    def __init__(self):
        self.active_bugs = frozenset()
        self.report_slots = True  # --no-slots: answer outputs only, like a black-box engine
        self.report_outputs = True  # --no-outputs: slots only, like a block manager without a kernel
        self.head_dim_multiple = 1  # --require-head-dim-multiple N: open refuses other head_dims
        self.declare_limits = True  # --undeclared-limits: refuse them without saying so in hello
        self.pad_prefill = 0  # --pad-prefill N: prefills padded to a multiple of N rows
        self.list_bugs = False

    def display_name(self):
        if not self.active_bugs:
            return self.name
        return self.name + "+" + "+".join(sorted(self.active_bugs))

    def capabilities(self):
        caps = {
            "steps": [s for s in kp.STEP_KINDS if (s != "trim" or self.trims) and (s != "preempt" or self.preempt)],
            "formats": list(FORMATS),
            "rope": list(kp.ROPE_STYLES),
            "layouts": list(kp.LAYOUTS),
            "sink": True,
            "softmax_scale": True,
            "max_states": 0,
            "max_layers": 0,
            "max_step_rows": 0,
            "max_head_dim": 0,
            "reports": {"written_slots": self.report_slots, "read_slots": self.report_slots},
            "outputs": self.report_outputs,
            "addressing": self.addressing,
            # Each layer may have its own window, global layers included.
            "per_layer_windows": True,
            # Calls kvcheck may send that this cache must refuse, unchanged.
            "probes": list(kp.PROBES),
        }
        if self.head_dim_multiple > 1 and self.declare_limits:
            del caps["max_head_dim"]
            caps["head_dim"] = {"multiple_of": self.head_dim_multiple}
        return caps

    def open(self, spec):
        multiple = self.head_dim_multiple
        if spec.head_dim % multiple != 0:
            raise kp.OpenRefused(f"head_dim {spec.head_dim} is not a multiple of {multiple}")
        cache = super().open(spec)
        cache.outputs = self.report_outputs
        cache.slots = self.report_slots
        if self.pad_prefill > 1:
            cache.pad_to = self.pad_prefill
        return cache

    # -- command line ---------------------------------------------------------
    def make_parser(self):
        parser = super().make_parser()
        parser.add_argument("--bug", action="append", default=[], choices=sorted(self.bugs),
                            metavar="NAME", help="switch on a named bug (repeatable; see --list-bugs)")
        parser.add_argument("--list-bugs", action="store_true", help="list the named bugs and exit")
        parser.add_argument("--no-slots", action="store_true",
                            help="report no written or read slots (answers carry outputs only, as a "
                                 "black-box engine's do: kvcheck then decodes reads from position-coded rows)")
        parser.add_argument("--no-outputs", action="store_true",
                            help="answer written and read slots and no outputs (hello \"outputs\": false, a "
                                 "block manager without a kernel: kvcheck computes the outputs over the rows read)")
        parser.add_argument("--require-head-dim-multiple", type=int, default=1, metavar="N",
                            help="refuse (at open) a head_dim that is not a multiple of N, as kernels with "
                                 "vector-width limits do, and declare it in hello (head_dim.multiple_of)")
        parser.add_argument("--pad-prefill", type=int, default=0, metavar="N",
                            help="pad every prefill to a multiple of N rows, as engines with fixed batch "
                                 "shapes do: the padding rows (zeros) go to scratch slots and are answered as "
                                 "\"padded\"")
        parser.add_argument("--undeclared-limits", action="store_true",
                            help="keep --require-head-dim-multiple out of hello (an adapter that does not "
                                 "declare its shape limits: kvcheck's draws then meet refusals)")
        return parser

    def parse_args(self, argv):
        args = self.make_parser().parse_args(argv)
        self.active_bugs = frozenset(args.bug)
        self.list_bugs = args.list_bugs
        self.report_slots = not args.no_slots
        self.report_outputs = not args.no_outputs
        if not self.report_outputs and not self.report_slots:
            raise SystemExit(f"{self.name}: --no-outputs needs the slots (drop --no-slots)")
        if args.require_head_dim_multiple < 1:
            raise SystemExit(f"{self.name}: --require-head-dim-multiple must be >= 1")
        self.head_dim_multiple = args.require_head_dim_multiple
        self.declare_limits = not args.undeclared_limits
        if args.pad_prefill < 0:
            raise SystemExit(f"{self.name}: --pad-prefill must be >= 0")
        self.pad_prefill = args.pad_prefill
        self.configure(args)
        return args

    def main(self, argv=None):
        self.parse_args(sys.argv[1:] if argv is None else argv)
        if self.list_bugs:
            for name, description in self.bugs.items():
                print(f"{name:<26} {description}")
            return 0
        return kp.Session(self).serve(sys.stdin.buffer, sys.stdout.buffer)
