"""Shared machinery of the Python adapters of kvcheck exec protocol v1.

kvcheck (the parent) starts an adapter with `--impl exec:'python3 adapters/...'`
and speaks JSON Lines to it: one request per line on stdin, exactly one answer
line per request on stdout (adapters/PROTOCOL.md). This module holds what the
adapters share, standard library only:

* the protocol loop (`serve`): read a line, decode it strictly, dispatch,
  write one compact JSON line, flush; exit 0 on `bye` or end of input;
* strict input handling: a missing, unknown or mistyped field, a wrong row
  count or width, a non-finite number or a duplicate key is answered with
  `{"ok":false,"error":"bad-request","detail":...}`;
* the math: RoPE, rounding of stored rows through f32/bf16, attention with an
  optional sink logit (`rotate_heads`, `round_row`, `attend`);
* `WindowCache`, the step semantics both caches share (begin, both prefill
  orders, decode, verify/accept, finish, reset) with hooks for the addressing
  (ring_cache.py, paged_cache.py). Every refusal is decided before anything is
  changed, so a refused step leaves the cache exactly as it was.

These caches are deliberately separate from kvcheck's C++ code
(scenarios/step_semantics.hpp, impl/ring_pool.cpp): they are implementations
under test, and a mistake shared with kvcheck would hide itself.
"""

import argparse
import json
import math
import sys
from array import array

PROTOCOL = "kvcheck-exec"
VERSION = 1

STEP_KINDS = ["prefill_load_then_store", "prefill_store_then_load", "decode", "verify",
              "accept", "finish", "reset"]
FORMATS = ["f64", "f32", "bf16"]
ROPE_STYLES = ["none", "neox", "interleaved"]
LAYOUTS = ["mha", "gqa", "mqa", "shared"]
CONVENTIONS = ["keys", "left", "off-by-one"]
ORDERS = ["load_then_store", "store_then_load"]

# Slots are JSON integers that kvcheck reads as int64; keep every id well inside.
MAX_SLOTS = 1 << 52


# ---------------------------------------------------------------------------
# Errors

class BadRequest(Exception):
    """A malformed request: answered with error "bad-request"."""


class Refusal(Exception):
    """A typed refusal of a well-formed request ("state-busy", ...)."""

    def __init__(self, code, detail):
        super().__init__(detail)
        self.code = code
        self.detail = detail


class OpenRefused(Exception):
    """`open` of a configuration this cache does not support."""


# ---------------------------------------------------------------------------
# Strict decoding and field access

def _reject_constant(name):
    raise ValueError(name + " is not JSON")


def _no_duplicates(pairs):
    obj = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError("duplicate key " + json.dumps(key))
        obj[key] = value
    return obj


_DECODER = json.JSONDecoder(parse_constant=_reject_constant, object_pairs_hook=_no_duplicates)


def decode_line(raw):
    """bytes -> dict, or BadRequest."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadRequest("line is not UTF-8: " + str(e)) from None
    text = text.strip()
    if not text:
        raise BadRequest("empty line")
    try:
        msg = _DECODER.decode(text)
    except (ValueError, RecursionError) as e:
        raise BadRequest("not JSON: " + str(e)) from None
    if not isinstance(msg, dict):
        raise BadRequest("a request is a JSON object")
    return msg


def encode(answer):
    """One answer line (no newline). NaN/Infinity raise ValueError."""
    return json.dumps(answer, allow_nan=False, separators=(",", ":"))


def _type_name(x):
    if x is None:
        return "null"
    if isinstance(x, bool):
        return "boolean"
    if isinstance(x, (int, float)):
        return "number"
    if isinstance(x, str):
        return "string"
    if isinstance(x, list):
        return "array"
    return "object"


def check_keys(obj, path, required, optional=()):
    """Every required key present, no key outside required + optional."""
    for key in required:
        if key not in obj:
            raise BadRequest(f"{path}.{key}: missing")
    if len(obj) > len(required):
        for key in obj:
            if key not in required and key not in optional:
                raise BadRequest(f"{path}.{key}: unknown key")


def get_int(obj, key, path, lo=None, hi=None):
    x = obj[key]
    # bool is an int subclass in Python; 4.0 is a float: both are rejected.
    if type(x) is not int:
        raise BadRequest(f"{path}.{key}: expected an integer, got {_type_name(x)} {json.dumps(x)[:40]}")
    if lo is not None and x < lo:
        raise BadRequest(f"{path}.{key}: must be >= {lo}, got {x}")
    if hi is not None and x > hi:
        raise BadRequest(f"{path}.{key}: must be <= {hi}, got {x}")
    return x


def get_number(obj, key, path):
    x = obj[key]
    if type(x) is not float and type(x) is not int:
        raise BadRequest(f"{path}.{key}: expected a number, got {_type_name(x)}")
    try:
        x = float(x)  # an integer beyond binary64 raises OverflowError
    except OverflowError:
        x = math.inf
    if not math.isfinite(x):  # 1e999 decodes to inf
        raise BadRequest(f"{path}.{key}: not finite")
    return x


def _get_typed(obj, key, path, kind, what):
    x = obj[key]
    if type(x) is not kind:  # exact type: True is not an int, 1 is not a bool
        raise BadRequest(f"{path}.{key}: expected {what}, got {_type_name(x)}")
    return x


def get_bool(obj, key, path):
    return _get_typed(obj, key, path, bool, "a boolean")


def get_str(obj, key, path):
    return _get_typed(obj, key, path, str, "a string")


def get_object(obj, key, path):
    return _get_typed(obj, key, path, dict, "an object")


_NUMBER_TYPES = (float, int)


def get_rows(obj, key, path, n, width):
    """n rows of `width` finite numbers, as lists of floats."""
    x = obj[key]
    if type(x) is not list:
        raise BadRequest(f"{path}.{key}: expected an array of rows, got {_type_name(x)}")
    if len(x) != n:
        raise BadRequest(f"{path}.{key}: expected {n} rows, got {len(x)}")
    rows = []
    for i, row in enumerate(x):
        if type(row) is not list:
            raise BadRequest(f"{path}.{key}[{i}]: expected an array, got {_type_name(row)}")
        if len(row) != width:
            raise BadRequest(f"{path}.{key}[{i}]: expected {width} numbers, got {len(row)}")
        for j, v in enumerate(row):
            if type(v) not in _NUMBER_TYPES:
                raise BadRequest(f"{path}.{key}[{i}][{j}]: expected a number, got {_type_name(v)}")
        try:
            row = [float(v) for v in row]  # an integer beyond binary64 raises OverflowError
        except OverflowError:
            row = [math.inf]
        if not all(map(math.isfinite, row)):
            raise BadRequest(f"{path}.{key}[{i}]: not finite")
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------
# The cache configuration of one case

class Spec:
    """The `spec` of an `open`, validated, plus derived constants."""

    def __init__(self, obj):
        p = "spec"
        check_keys(obj, p, ("states", "capacity", "window", "q_heads", "kv_heads", "head_dim",
                            "shared_row", "format", "rope", "softmax_scale", "sink_logit",
                            "layers", "max_step_rows"))
        self.states = get_int(obj, "states", p, 1)
        self.capacity = get_int(obj, "capacity", p, 1)
        self.q_heads = get_int(obj, "q_heads", p, 1)
        self.kv_heads = get_int(obj, "kv_heads", p, 1)
        self.head_dim = get_int(obj, "head_dim", p, 1)
        self.shared_row = get_bool(obj, "shared_row", p)
        self.format = get_str(obj, "format", p)
        self.softmax_scale = get_number(obj, "softmax_scale", p)
        if obj["sink_logit"] is None:
            self.sink = None
        else:
            self.sink = get_number(obj, "sink_logit", p)
        self.layers = get_int(obj, "layers", p, 1)
        self.max_step_rows = get_int(obj, "max_step_rows", p, 1)

        w = get_object(obj, "window", p)
        wp = p + ".window"
        check_keys(w, wp, ("param", "convention", "keys"))
        self.window_param = get_int(w, "param", wp, 0)
        self.convention = get_str(w, "convention", wp)
        self.keys = get_int(w, "keys", wp, 1)
        if self.convention not in CONVENTIONS:
            raise BadRequest(f"{wp}.convention: one of {CONVENTIONS}, got {json.dumps(self.convention)}")
        expected = self.window_param if self.convention == "keys" else self.window_param + 1
        if self.keys != expected:
            raise BadRequest(f"{wp}.keys: {self.keys} disagrees with param {self.window_param} "
                             f"in convention {self.convention} (expected {expected})")

        r = get_object(obj, "rope", p)
        rp = p + ".rope"
        check_keys(r, rp, ("style", "rotary_dims", "base"))
        self.rope_style = get_str(r, "style", rp)
        self.rotary_dims = get_int(r, "rotary_dims", rp, 0)
        self.rope_base = get_number(r, "base", rp)

        if self.q_heads % self.kv_heads != 0:
            raise BadRequest(f"{p}.q_heads: {self.q_heads} is not a multiple of kv_heads {self.kv_heads}")
        if self.shared_row and self.kv_heads != 1:
            raise BadRequest(f"{p}.shared_row: needs kv_heads 1, got {self.kv_heads}")
        if self.rotary_dims % 2 != 0 or self.rotary_dims > self.head_dim:
            raise BadRequest(f"{rp}.rotary_dims: must be even and <= head_dim {self.head_dim}, "
                             f"got {self.rotary_dims}")
        if self.rope_base <= 0:
            raise BadRequest(f"{rp}.base: must be > 0")

        # What a well-formed spec may still ask that these caches do not do.
        if self.format not in FORMATS:
            raise OpenRefused(f"format {self.format} is not supported (supported: {', '.join(FORMATS)})")
        if self.rope_style not in ROPE_STYLES:
            raise OpenRefused(f"rope style {self.rope_style} is not supported")
        if self.states * self.capacity > MAX_SLOTS:
            raise OpenRefused(f"states * capacity = {self.states * self.capacity} exceeds {MAX_SLOTS}")

        self.group = self.q_heads // self.kv_heads  # query heads per KV head
        self.kv_width = self.kv_heads * self.head_dim
        self.q_width = self.q_heads * self.head_dim
        self.rope = make_rope(self.rope_style, self.rotary_dims, self.rope_base)
        self.round = ROUNDERS[self.format]


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
    """One layer's pool: slot -> (stored key row, stored value row)."""

    def __init__(self, states):
        self.states = [StateInfo() for _ in range(states)]
        self.rows = {}


class WindowCache:
    """A sliding-window KV cache of `spec.layers` independent layers.

    Subclasses give the addressing: write_slot/read_slot, and optionally
    reserve (refuse before a step changes anything), before_store (called
    before each new row of a load_then_store step is stored), after_step
    (after every write step and accept), release (finish and reset), and
    key_rope_position. `read_keys` is how many positions a query reads."""

    def __init__(self, spec, bugs):
        self.spec = spec
        self.bugs = bugs
        self.read_keys = spec.keys
        self.outputs = True  # False for --no-outputs: no attention computed, none answered
        self.layers = [self.new_layer() for _ in range(spec.layers)]

    # -- hooks -------------------------------------------------------------
    def new_layer(self):
        return Layer(self.spec.states)

    def write_slot(self, layer, st, b, p):
        raise NotImplementedError

    def read_slot(self, layer, st, b, p):
        raise NotImplementedError

    def reserve(self, layer, st, b, first, n, load_then_store):
        pass

    def before_store(self, layer, st, b, first, j):
        pass

    def after_step(self, layer, st, b):
        pass

    def release(self, layer, st, b):
        pass

    def key_rope_position(self, p):
        return p

    # -- lookups -------------------------------------------------------------
    def visible_first(self, p):
        return max(0, p - self.read_keys + 1)

    def _layer(self, layer):
        if layer >= len(self.layers):
            raise Refusal("layer-out-of-range", f"layer {layer} of {len(self.layers)}")
        return self.layers[layer]

    def _state(self, lay, state):
        if state >= len(lay.states):
            raise Refusal("state-out-of-range", f"state {state} of {len(lay.states)}")
        return lay.states[state]

    def _busy_state(self, layer, state, request):
        lay = self._layer(layer)
        st = self._state(lay, state)
        if not st.busy:
            raise Refusal("state-free", f"state {state} of layer {layer} has no request")
        if st.request != request:
            raise Refusal("request-mismatch",
                          f"state {state} of layer {layer} holds request {st.request}, not {request}")
        return lay, st

    # -- steps ---------------------------------------------------------------
    def begin(self, layer, state, request):
        lay = self._layer(layer)
        st = self._state(lay, state)
        if st.busy:
            raise Refusal("state-busy", f"state {state} of layer {layer} holds request {st.request}")
        st.busy = True
        st.request = request
        st.length = 0
        st.pending_first = st.pending_drafts = -1
        st.table = {}

    # The adapter's own copy of the SPEC §3 step semantics, deliberately not
    # derived from kvcheck's (scenarios/step_semantics.hpp): a mistake in one
    # must show up as a disagreement with the other.
    def accept(self, layer, state, request, accepted):
        lay, st = self._busy_state(layer, state, request)
        if st.pending_drafts < 0:
            raise Refusal("bad-accept", "no verify is pending")
        if accepted < 0 or accepted > st.pending_drafts:
            raise Refusal("bad-accept", f"accept({accepted}) outside 0..{st.pending_drafts}")
        # The verified token plus the accepted drafts are committed; the
        # rejected drafts' rows stay where they were written.
        st.length = st.pending_first + 1 + accepted
        st.pending_first = st.pending_drafts = -1
        self.after_step(lay, st, state)

    def finish(self, layer, state, request):
        lay, st = self._busy_state(layer, state, request)
        self.release(lay, st, state)
        st.busy = False
        st.request = None
        st.length = 0
        st.pending_first = st.pending_drafts = -1
        st.table = None

    def reset(self, layer, state, request):
        lay, st = self._busy_state(layer, state, request)
        self.release(lay, st, state)
        st.length = 0
        st.pending_first = st.pending_drafts = -1
        st.table = {}

    def write_step(self, kind, layer, state, request, position, n, order, drafts, k, v, q):
        """prefill / decode / verify: n rows at `position`. Returns the answer."""
        lay, st = self._busy_state(layer, state, request)
        spec = self.spec
        if st.pending_drafts >= 0:
            raise Refusal("verify-pending",
                          f"a verify at {st.pending_first} awaits its accept")
        if position != st.length:
            raise Refusal("position-mismatch",
                          f"position {position}, but the request's length is {st.length}")
        if n > spec.max_step_rows:
            raise Refusal("too-many-rows", f"{n} rows, max_step_rows {spec.max_step_rows}")
        first = position
        lts = order == "load_then_store"
        self.reserve(lay, st, state, first, n, lts)
        # Nothing is refused past this point.

        hd = spec.head_dim
        rnd = spec.round
        rope = spec.rope
        stored = []
        for i in range(n):
            key = rnd(rotate_heads(k[i], spec.kv_heads, hd, self.key_rope_position(first + i), rope))
            stored.append((key, key if v is None else rnd(v[i])))
        queries = [rotate_heads(q[i], spec.q_heads, hd, first + i, rope) for i in range(n)]
        pool = lay.rows
        out = []
        reads = []
        if lts:
            # Copy the old rows any query of the step sees out of the pool,
            # then store the chunk; each query reads the copies and the
            # chunk's rows up to itself.
            lo = self.visible_first(first)
            old = []
            for x in range(lo, first):
                s = self.read_slot(lay, st, state, x)
                old.append((s, pool.get(s) if s >= 0 else None))
            written = []
            for j in range(n):
                self.before_store(lay, st, state, first, j)
                s = self.write_slot(lay, st, state, first + j)
                pool[s] = stored[j]
                written.append(s)
            for i in range(n):
                p = first + i
                slots = []
                entries = []
                for x in range(self.visible_first(p), p + 1):
                    if x < first:
                        s, e = old[x - lo]
                    else:
                        s, e = written[x - first], stored[x - first]
                    if e is None:
                        s = -1
                    else:
                        entries.append(e)
                    slots.append(s)
                reads.append(slots)
                out.append(attend(queries[i], entries, spec) if self.outputs else None)
            view = "causal"
        else:
            # Store every row of the step, then every query reads the pool.
            written = []
            for j in range(n):
                s = self.write_slot(lay, st, state, first + j)
                pool[s] = stored[j]
                written.append(s)
            for i in range(n):
                p = first + i
                slots = []
                entries = []
                for x in range(self.visible_first(p), p + 1):
                    s = self.read_slot(lay, st, state, x)
                    e = pool.get(s) if s >= 0 else None
                    if e is None:
                        s = -1
                    else:
                        entries.append(e)
                    slots.append(s)
                reads.append(slots)
                out.append(attend(queries[i], entries, spec) if self.outputs else None)
            view = "after_writes"

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
        return answer


# ---------------------------------------------------------------------------
# The protocol session

_STEP_COMMON = ("op", "layer", "request", "state")


class Adapter:
    """One adapter program: its name, bugs, capabilities and cache class.

    Subclasses set `name`, `addressing`, `bugs` ({name: description}) and
    implement `make_cache(spec)`; `add_arguments`/`configure` add options."""

    name = "adapter"
    addressing = "opaque"
    bugs = {}

    def __init__(self):
        self.active_bugs = frozenset()
        self.report_slots = True  # --no-slots: answer outputs only, like a black-box engine
        self.report_outputs = True  # --no-outputs: slots only, like a block manager without a kernel
        self.head_dim_multiple = 1  # --require-head-dim-multiple N: open refuses other head_dims
        self.declare_limits = True  # --undeclared-limits: refuse them without saying so in hello

    def add_arguments(self, parser):
        pass

    def configure(self, args):
        pass

    def make_cache(self, spec):
        raise NotImplementedError

    def display_name(self):
        if not self.active_bugs:
            return self.name
        return self.name + "+" + "+".join(sorted(self.active_bugs))

    def capabilities(self):
        caps = {
            "steps": list(STEP_KINDS),
            "formats": list(FORMATS),
            "rope": list(ROPE_STYLES),
            "layouts": list(LAYOUTS),
            "sink": True,
            "softmax_scale": True,
            "max_states": 0,
            "max_layers": 0,
            "max_step_rows": 0,
            "max_head_dim": 0,
            "reports": {"written_slots": self.report_slots, "read_slots": self.report_slots},
            "outputs": self.report_outputs,
            "addressing": self.addressing,
            # Calls kvcheck may send that this cache must refuse, unchanged.
            "probes": ["accept-without-verify", "accept-too-many", "begin-busy-state"],
        }
        if self.head_dim_multiple > 1 and self.declare_limits:
            del caps["max_head_dim"]
            caps["head_dim"] = {"multiple_of": self.head_dim_multiple}
        return caps

    # -- command line ---------------------------------------------------------
    def parse_args(self, argv):
        parser = argparse.ArgumentParser(
            prog=self.name, description=self.__doc__,
            epilog="Speaks kvcheck exec protocol v1 on stdin/stdout (adapters/PROTOCOL.md).")
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
        parser.add_argument("--undeclared-limits", action="store_true",
                            help="keep --require-head-dim-multiple out of hello (an adapter that does not "
                                 "declare its shape limits: kvcheck's draws then meet refusals)")
        self.add_arguments(parser)
        args = parser.parse_args(argv)
        self.active_bugs = frozenset(args.bug)
        self.report_slots = not args.no_slots
        self.report_outputs = not args.no_outputs
        if not self.report_outputs and not self.report_slots:
            raise SystemExit(f"{self.name}: --no-outputs needs the slots (drop --no-slots)")
        if args.require_head_dim_multiple < 1:
            raise SystemExit(f"{self.name}: --require-head-dim-multiple must be >= 1")
        self.head_dim_multiple = args.require_head_dim_multiple
        self.declare_limits = not args.undeclared_limits
        self.configure(args)
        return args

    def main(self, argv=None):
        args = self.parse_args(sys.argv[1:] if argv is None else argv)
        if args.list_bugs:
            for name, description in self.bugs.items():
                print(f"{name:<26} {description}")
            return 0
        return Session(self).serve(sys.stdin.buffer, sys.stdout.buffer)


class Session:
    """Dispatches requests to the open case's cache."""

    def __init__(self, adapter):
        self.adapter = adapter
        self.cache = None
        self.done = False
        self.ops = {
            "hello": self.op_hello, "open": self.op_open, "close": self.op_close,
            "bye": self.op_bye, "begin": self.op_begin, "prefill": self.op_write,
            "decode": self.op_write, "verify": self.op_write, "accept": self.op_accept,
            "finish": self.op_finish, "reset": self.op_reset,
        }

    def handle(self, raw):
        """One request line (bytes) -> one answer line (str)."""
        try:
            msg = decode_line(raw)
            op = msg.get("op")
            if type(op) is not str:
                raise BadRequest("op: missing or not a string")
            handler = self.ops.get(op)
            if handler is None:
                answer = {"ok": False, "error": "unknown-op", "detail": f"unknown op {json.dumps(op)[:60]}"}
            else:
                answer = handler(msg)
        except BadRequest as e:
            answer = {"ok": False, "error": "bad-request", "detail": str(e)}
        except Refusal as e:
            answer = {"ok": False, "error": e.code, "detail": e.detail}
        try:
            return encode(answer)
        except ValueError:
            # An output overflowed (e.g. a row rounded to inf): never send NaN.
            return encode({"ok": False, "error": "non-finite",
                           "detail": "the answer would contain NaN or Infinity"})

    def serve(self, stdin, stdout):
        while not self.done:
            raw = stdin.readline()
            if not raw:
                break  # end of input means bye
            stdout.write(self.handle(raw).encode("utf-8") + b"\n")
            stdout.flush()
        return 0

    # -- session ops ------------------------------------------------------------
    def op_hello(self, msg):
        check_keys(msg, "hello", ("op", "protocol", "version"))
        protocol = get_str(msg, "protocol", "hello")
        version = get_int(msg, "version", "hello")
        if protocol != PROTOCOL or version != VERSION:
            raise Refusal("unsupported-version",
                          f"this adapter speaks {PROTOCOL} version {VERSION}, not {protocol} {version}")
        return {"ok": True, "protocol": PROTOCOL, "version": VERSION,
                "name": self.adapter.display_name(), "capabilities": self.adapter.capabilities()}

    def op_open(self, msg):
        check_keys(msg, "open", ("op", "spec"))
        # A new open replaces any case still open (as if close had come first).
        self.cache = None
        try:
            spec = Spec(get_object(msg, "spec", "open"))
            multiple = self.adapter.head_dim_multiple
            if spec.head_dim % multiple != 0:
                raise OpenRefused(f"head_dim {spec.head_dim} is not a multiple of {multiple}")
            self.cache = self.adapter.make_cache(spec)
            self.cache.outputs = self.adapter.report_outputs
        except OpenRefused as e:
            return {"ok": False, "refused": str(e)}
        return {"ok": True}

    def op_close(self, msg):
        check_keys(msg, "close", ("op",))
        self.cache = None
        return {"ok": True}

    def op_bye(self, msg):
        check_keys(msg, "bye", ("op",))
        self.done = True
        return {"ok": True}

    # -- steps ------------------------------------------------------------------
    def _common(self, msg, op, extra=()):
        check_keys(msg, op, _STEP_COMMON + extra)
        layer = get_int(msg, "layer", op, 0)
        request = get_int(msg, "request", op)
        state = get_int(msg, "state", op, 0)
        if self.cache is None:
            raise Refusal("not-open", "no case is open")
        return layer, request, state

    def op_begin(self, msg):
        layer, request, state = self._common(msg, "begin")
        self.cache.begin(layer, state, request)
        return {"ok": True}

    def op_accept(self, msg):
        layer, request, state = self._common(msg, "accept", ("accepted",))
        accepted = get_int(msg, "accepted", "accept")
        self.cache.accept(layer, state, request, accepted)
        return {"ok": True}

    def op_finish(self, msg):
        layer, request, state = self._common(msg, "finish")
        self.cache.finish(layer, state, request)
        return {"ok": True}

    def op_reset(self, msg):
        layer, request, state = self._common(msg, "reset")
        self.cache.reset(layer, state, request)
        return {"ok": True}

    def op_write(self, msg):
        op = msg["op"]
        cache = self.cache
        if cache is None:
            raise Refusal("not-open", "no case is open")
        if op == "prefill":
            extra = ("position", "rows", "order", "k", "v", "q")
        elif op == "verify":
            extra = ("position", "drafts", "k", "v", "q")
        else:
            extra = ("position", "k", "v", "q")
        shared = cache.spec.shared_row
        # `v` is absent exactly when the rows are shared (key row = value row).
        required = _STEP_COMMON + tuple(x for x in extra if x != "v" or not shared)
        check_keys(msg, op, required)
        layer = get_int(msg, "layer", op, 0)
        request = get_int(msg, "request", op)
        state = get_int(msg, "state", op, 0)
        position = get_int(msg, "position", op, 0)
        order = None
        drafts = None
        if op == "prefill":
            n = get_int(msg, "rows", op, 1)
            order = get_str(msg, "order", op)
            if order not in ORDERS:
                raise BadRequest(f"{op}.order: one of {ORDERS}, got {json.dumps(order)[:40]}")
        elif op == "verify":
            drafts = get_int(msg, "drafts", op, 0)
            n = drafts + 1
        else:
            n = 1
        spec = cache.spec
        k = get_rows(msg, "k", op, n, spec.kv_width)
        v = None if shared else get_rows(msg, "v", op, n, spec.kv_width)
        q = get_rows(msg, "q", op, n, spec.q_width)
        answer = cache.write_step(op, layer, state, request, position, n, order, drafts, k, v, q)
        if not self.adapter.report_slots:
            del answer["written"], answer["read"]
        if not self.adapter.report_outputs:
            del answer["out"]
        return answer


def run(adapter_class):
    """Entry point of an adapter script."""
    try:
        code = adapter_class().main()
    except BrokenPipeError:
        # kvcheck went away without bye: nothing to answer to.
        code = 0
    sys.exit(code)
