"""kvcheck exec protocol v1, for Python: the library an engine's adapter imports
(`kvcheck.protocol`, part of the `kvcheck` package in python/).

kvcheck starts an adapter with `--impl exec:'COMMAND ARGS'` and speaks JSON
Lines to it: one request per line on stdin, exactly one answer line per
request on stdout (adapters/PROTOCOL.md is the whole protocol). This module
does the protocol and nothing else, standard library only, so that wrapping
an engine's cache is writing the cache's side:

    from kvcheck import protocol as kp

    class MyCache(kp.Cache):            # one per `open` (one case)
        def __init__(self, spec):       # kp.Spec: the validated `open` spec
            ...                          # raise kp.OpenRefused(why) to refuse it
        def begin(self, layer, state, request): ...
        def accept(self, layer, state, request, accepted): ...
        def finish(self, layer, state, request): ...
        def reset(self, layer, state, request): ...
        def trim(self, layer, state, request, positions): ...   # if hello lists "trim"
        def preempt(self, layer, state, request): ...   # if hello lists "preempt"
        def write(self, step):          # kp.WriteStep: prefill, decode, verify
            return {"ok": True, "out": ..., "written": ..., "read": ...,
                    "read_view": "after_writes", "stored": {"k": ...}}

    class MyAdapter(kp.Adapter):
        name = "my-engine"
        def capabilities(self):         # the hello answer's capabilities
            return {"steps": [...], "formats": ["f32"], ...}
        def make_cache(self, spec):
            return MyCache(spec)

    if __name__ == "__main__":
        kp.run(MyAdapter)

What it does for the adapter:

* the session (`Session`, `run`): hello with the adapter's name and
  capabilities, open/close/bye, dispatch of every step to the open case's
  cache, one compact JSON line per request, flushed; exit 0 on `bye` or
  end of input, and when kvcheck goes away without one;
* strict input: a missing, unknown or mistyped field, a wrong row count or
  width, a non-finite number or a duplicate key is answered with
  `{"ok":false,"error":"bad-request","detail":...}` before the cache sees
  the request; a well-formed request the cache refuses (`Refusal`) with its
  code, and an answer that would hold NaN or Infinity with "non-finite";
* binary frames (adapters/PROTOCOL.md "Binary frames") when kvcheck offers
  them at hello (`kvcheck check --exec-encoding binary`): rows arrive as
  little-endian f64 and outputs and stored rows leave as one, read as
  strictly as JSON; numpy packs and unpacks them when the adapter uses numpy,
  the standard library's `array` otherwise. An adapter that sets
  `encodings = ("json",)` declines them;
* rows as numpy arrays for an adapter that sets `rows = "numpy"` (float64,
  [rows, width]; numpy is imported only then), and answers holding numpy
  arrays or scalars or torch tensors (anything with `tolist()`);
* the field readers it uses (`decode_line`, `encode`, `check_keys`,
  `get_int`, `get_number`, `get_bool`, `get_str`, `get_object`, `get_rows`),
  for an adapter that reads more.

The public names are listed in `__all__`; everything else may change.
"""

import argparse
import array
import json
import math
import sys

__all__ = [
    "PROTOCOL", "VERSION", "STEP_KINDS", "FORMATS", "ROPE_STYLES", "LAYOUTS", "CONVENTIONS", "ORDERS",
    "ADDRESSING", "PROBES", "READ_VIEWS", "OUTPUT_FORMATS",
    "BadRequest", "Refusal", "OpenRefused",
    "decode_line", "encode", "check_keys", "get_int", "get_number", "get_bool", "get_str", "get_object",
    "get_rows",
    "Spec", "WriteStep", "Prefix", "Cache", "Adapter", "Session", "run", "ROW_TYPES", "ENCODINGS", "MAX_FRAME_BYTES",
]

PROTOCOL = "kvcheck-exec"
VERSION = 1

# The names the protocol knows (scenarios/schema/exec-protocol.schema.json):
# a hello declares a subset of each.
STEP_KINDS = ["prefill_load_then_store", "prefill_store_then_load", "decode", "verify",
              "accept", "finish", "reset", "trim", "preempt"]
FORMATS = ["f64", "f32", "bf16", "fp8"]
ROPE_STYLES = ["none", "neox", "interleaved"]
LAYOUTS = ["mha", "gqa", "mqa", "shared"]
CONVENTIONS = ["keys", "left", "off-by-one"]
ORDERS = ["load_then_store", "store_then_load"]
ADDRESSING = ["ring", "paged", "opaque"]
PROBES = ["accept-without-verify", "accept-too-many", "begin-busy-state"]
READ_VIEWS = ["after_writes", "causal"]
# The formats a hello may declare its outputs are written in ("output_format":
# adapters/PROTOCOL.md "Output formats"), apart from the accumulation.
OUTPUT_FORMATS = ["f64", "f32", "bf16", "fp16"]
# How WriteStep rows reach the cache (Adapter.rows): lists of floats, or
# numpy float64 arrays of shape [rows, width] (numpy needed only then).
ROW_TYPES = ["lists", "numpy"]
# How rows travel after hello (Adapter.encodings): JSON numbers, or binary
# frames when kvcheck offers them (adapters/PROTOCOL.md "Binary frames").
ENCODINGS = ["binary", "json"]
# The largest frame read or written (bytes), as kvcheck's own guard.
MAX_FRAME_BYTES = 1 << 30

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


def _plain(x):
    # numpy arrays and scalars, torch tensors: anything with tolist() is
    # written as the numbers it holds (and NaN/Infinity still raise).
    tolist = getattr(x, "tolist", None)
    if tolist is None:
        raise TypeError(f"an answer holds a {type(x).__name__}, which is not JSON")
    return tolist()


def encode(answer):
    """One answer line (no newline). NaN/Infinity raise ValueError. Arrays
    (numpy, torch: anything with tolist()) are written as nested lists."""
    return json.dumps(answer, allow_nan=False, separators=(",", ":"), default=_plain)


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

def _window(w, wp):
    """A window object at path `wp`: (param, convention, keys), keys checked
    against param in its convention."""
    check_keys(w, wp, ("param", "convention", "keys"))
    param = get_int(w, "param", wp, 0)
    convention = get_str(w, "convention", wp)
    keys = get_int(w, "keys", wp, 1)
    if convention not in CONVENTIONS:
        raise BadRequest(f"{wp}.convention: one of {CONVENTIONS}, got {json.dumps(convention)}")
    expected = param if convention == "keys" else param + 1
    if keys != expected:
        raise BadRequest(f"{wp}.keys: {keys} disagrees with param {param} "
                         f"in convention {convention} (expected {expected})")
    return param, convention, keys


class Spec:
    """The `spec` of an `open`, validated (BadRequest otherwise), plus the
    widths derived from it. Fields: states, capacity, block_size and
    pool_blocks (paged addressing; 0 otherwise), window_param,
    convention, keys, q_heads, kv_heads, head_dim, shared_row, format,
    rope_style, rotary_dims, rope_base, softmax_scale, sink (None or the
    sink logit), layers, max_step_rows; group (query heads per KV head),
    kv_width, q_width (numbers per key/value row and per query row);
    layer_keys: one entry per layer, the keys a query of that layer sees
    (None for a global layer that sees every position), from the spec's
    `layer_windows` when it has them (a cache that declared
    per_layer_windows), else `keys` for every layer; window_of(layer) reads it.

    Whether the cache supports the format, RoPE style or size it names is
    the cache's to say: raise OpenRefused from make_cache."""

    def __init__(self, obj):
        p = "spec"
        check_keys(obj, p, ("states", "capacity", "window", "q_heads", "kv_heads", "head_dim",
                            "shared_row", "format", "rope", "softmax_scale", "sink_logit",
                            "layers", "max_step_rows"), ("block_size", "pool_blocks", "layer_windows"))
        self.states = get_int(obj, "states", p, 1)
        self.capacity = get_int(obj, "capacity", p, 1)
        # Paged addressing (hello declared "addressing": "paged" with a
        # block_size): the pool per layer in blocks of block_size rows. Both
        # or neither; 0 when the cache is not paged.
        if ("block_size" in obj) != ("pool_blocks" in obj):
            missing = "pool_blocks" if "block_size" in obj else "block_size"
            raise BadRequest(f"{p}.{missing}: block_size and pool_blocks come together (paged addressing)")
        self.block_size = get_int(obj, "block_size", p, 1) if "block_size" in obj else 0
        self.pool_blocks = get_int(obj, "pool_blocks", p, 1) if "pool_blocks" in obj else 0
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

        self.window_param, self.convention, self.keys = _window(get_object(obj, "window", p), p + ".window")

        self.layer_keys = [self.keys] * self.layers
        if "layer_windows" in obj:
            lp = p + ".layer_windows"
            entries = obj["layer_windows"]
            if not isinstance(entries, list) or len(entries) != self.layers:
                raise BadRequest(f"{lp}: a list of one window per layer ({self.layers})")
            for i, e in enumerate(entries):
                ep = f"{lp}[{i}]"
                if not isinstance(e, dict):
                    raise BadRequest(f"{ep}: expected an object")
                check_keys(e, ep, ("param", "convention", "keys"))
                if e["param"] is None:
                    if e["convention"] is not None or e["keys"] is not None:
                        raise BadRequest(f"{ep}: a global layer has param, convention and keys null")
                    self.layer_keys[i] = None
                    continue
                self.layer_keys[i] = _window(e, ep)[2]

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

        self.group = self.q_heads // self.kv_heads  # query heads per KV head
        self.kv_width = self.kv_heads * self.head_dim
        self.q_width = self.q_heads * self.head_dim

    def window_of(self, layer):
        """Keys a query of `layer` sees (None: a global layer, every position)."""
        return self.layer_keys[layer]


class WriteStep:
    """One step that writes rows (prefill, decode or verify), validated.

    kind: "prefill", "decode" or "verify"; layer, state, request: as in every
    step; position: the first new position; rows: how many rows (a prefill's
    `rows`, 1 for decode, drafts + 1 for verify); order: a prefill's
    "load_then_store" or "store_then_load", else None; drafts: a verify's k,
    else None; k, v: `rows` key and value rows of kv_width numbers each (v is
    None when the spec's rows are shared: the key row is the value row); q:
    `rows` query rows of q_width numbers each. Rows are lists of floats, or
    numpy float64 arrays of shape [rows, width] when the adapter's `rows` is
    "numpy"."""

    __slots__ = ("kind", "layer", "state", "request", "position", "rows", "order", "drafts", "k", "v", "q")

    def __init__(self, kind, layer, state, request, position, rows, order, drafts, k, v, q):
        self.kind = kind
        self.layer = layer
        self.state = state
        self.request = request
        self.position = position
        self.rows = rows
        self.order = order
        self.drafts = drafts
        self.k = k
        self.v = v
        self.q = q

    @property
    def positions(self):
        """The positions the step writes, one per row: position .. position + rows - 1."""
        return range(self.position, self.position + self.rows)


class Prefix:
    """A begin from a shared prefix (adapters/PROTOCOL.md "Shared prefixes"):
    the new request starts from the first `positions` positions of request
    `request` (live or finished). k, v: that request's rows there, as the
    steps that wrote them sent them (v is None for shared rows), for a cache
    that no longer holds them to store again."""

    __slots__ = ("request", "positions", "k", "v")

    def __init__(self, request, positions, k, v):
        self.request = request
        self.positions = positions
        self.k = k
        self.v = v


# ---------------------------------------------------------------------------
# What an adapter implements

class Cache:
    """The cache of one case (one `open` .. `close`), one method per step kind.

    A method refuses a well-formed step with `raise Refusal(code, detail)`
    (codes such as "state-busy", "bad-accept", "out-of-blocks": the answer
    is {"ok":false,"error":code,"detail":detail}) and must then leave the
    cache exactly as it was. A method that returns normally is answered
    {"ok":true}; `write` returns its whole answer (adapters/PROTOCOL.md
    "Steps"): "out" (one output row per new row, when the hello declares
    outputs), "written" and "read" (slot ids, when it reports slots),
    "read_view" ("after_writes" or "causal") and "stored" ({"k": rows[, "v":
    rows]}, the rows as stored, when it reports them). Any step, `begin`
    included, may also answer the slots it padded, the rows it moved and the
    slots it freed ("padded", "moved", "freed"): `write` puts them in its
    answer, the other steps return a dict of them (or None). kvcheck judges
    a begin's as any step's (a prefix cache's evictions at a begin: a row a
    query still to run may read must not be freed). A slot the cache cannot
    have (negative, past the pool `open` gave) fails the case at that step."""

    def begin(self, layer, state, request, prefix=None):
        """`prefix`: a Prefix when the request starts from another's (only
        sent to a cache whose hello says "prefix_sharing"; a cache that
        declares it takes the argument). It may then return {"written":
        [slot or -1, ...]}: per prefix position the slot it stored the row
        sent into, -1 where it shares the row the other request has. Any
        begin may also return slot events (slot_events(freed=..., moved=...,
        padded=...), or a dict of these keys): blocks a prefix cache evicts,
        what the state's previous request left; kvcheck judges them as in
        any step (a free of a row still visible fails at the begin). A cache
        that declares "recompute_in_step" may also return "recompute":
        prefix positions it neither stores nor shares now (written -1),
        which the request's next writing step stores and answers as
        "recomputed": [[position, slot], ...] (docs/semantics.md "Recompute
        in a step")."""
        raise NotImplementedError

    def accept(self, layer, state, request, accepted):
        raise NotImplementedError

    def finish(self, layer, state, request):
        raise NotImplementedError

    def reset(self, layer, state, request):
        raise NotImplementedError

    def trim(self, layer, state, request, positions):
        """Removes the last `positions` committed positions (a pending
        verify's rows are dropped first); the next write goes at the
        committed length minus `positions`. Only sent when the hello's
        steps list "trim"."""
        raise NotImplementedError

    def preempt(self, layer, state, request):
        """Drops every row of the request (answer them `freed`, or `cached`
        where the cache keeps them for prefix hits); its logical length stays
        and a pending verify's rows are dropped. The request's next step is
        preceded by a `begin` whose prefix is the request itself, carrying
        its committed rows: store each again, or answer -1 where the cache
        still holds it (docs/semantics.md "Preemption"). Only sent when the
        hello's steps list "preempt"."""
        raise NotImplementedError

    def write(self, step):
        """prefill / decode / verify (a WriteStep): returns the answer dict."""
        raise NotImplementedError


class Adapter:
    """One adapter program: its name, command line, capabilities and caches.

    Subclasses set `name`, implement `capabilities()` (the hello answer's
    "capabilities": declare honestly what the cache runs) and
    `make_cache(spec)` (a Cache for a Spec, or raise OpenRefused);
    `add_arguments(parser)`/`configure(args)` add command-line options
    (argparse)."""

    name = "adapter"
    # "lists" or "numpy": how a WriteStep's k, v and q reach the cache.
    rows = "lists"
    # The encodings this adapter takes when kvcheck offers them, preferred
    # first; ("json",) declines binary frames.
    encodings = ("binary", "json")

    def add_arguments(self, parser):
        pass

    def configure(self, args):
        pass

    def capabilities(self):
        raise NotImplementedError("an adapter declares its capabilities (adapters/PROTOCOL.md, hello)")

    def make_cache(self, spec):
        raise NotImplementedError

    def open(self, spec):
        """The cache for one `open`: make_cache(spec) unless a subclass adds to it."""
        return self.make_cache(spec)

    def display_name(self):
        """The hello answer's "name"."""
        return self.name

    def make_parser(self):
        parser = argparse.ArgumentParser(
            prog=self.name, description=self.__doc__,
            epilog="Speaks kvcheck exec protocol v1 on stdin/stdout (adapters/PROTOCOL.md).")
        self.add_arguments(parser)
        return parser

    def parse_args(self, argv):
        args = self.make_parser().parse_args(argv)
        self.configure(args)
        return args

    def main(self, argv=None):
        """Reads the command line, then serves the protocol on stdin/stdout."""
        self.parse_args(sys.argv[1:] if argv is None else argv)
        return Session(self).serve(sys.stdin.buffer, sys.stdout.buffer)


# ---------------------------------------------------------------------------
# The protocol session

_STEP_COMMON = ("op", "layer", "request", "state")


class Session:
    """One protocol session: decodes each request strictly and dispatches it
    to the adapter (hello, open) or the open case's cache (the steps)."""

    def __init__(self, adapter):
        self.adapter = adapter
        self.cache = None
        self.spec = None
        self.done = False
        rows = getattr(adapter, "rows", "lists")
        if rows not in ROW_TYPES:
            raise ValueError(f"{type(adapter).__name__}.rows: one of {ROW_TYPES}, got {rows!r}")
        self.to_rows = _numpy_rows if rows == "numpy" else None
        self.numpy_rows = rows == "numpy"
        self.binary = False  # binary frames negotiated at hello
        self.frame = None    # the current request's frame: (arrays, payload)
        self.write_shape = None  # (rows, q_width, kv_width, shared) of the write being answered
        self.ops = {
            "hello": self.op_hello, "open": self.op_open, "close": self.op_close,
            "bye": self.op_bye, "begin": self.op_begin, "prefill": self.op_write,
            "decode": self.op_write, "verify": self.op_write, "accept": self.op_accept,
            "finish": self.op_finish, "reset": self.op_reset, "trim": self.op_trim,
            "preempt": self.op_preempt,
        }

    def handle(self, raw):
        """One request line (bytes) -> one answer line (str, no newline)."""
        return self._encode(self._answer(raw, None))

    def respond(self, raw, read):
        """One request (its line; `read(n)` gives the next n bytes of input,
        for its frame) -> the answer's bytes: its line, b"\\n", and its frame
        in a binary session; None at end of input inside a frame."""
        answer = self._answer(raw, read)
        if answer is None:
            return None
        frame = b""
        if self.binary and self.write_shape is not None and answer.get("ok") is True:
            answer, frame = _frame_answer(answer, self.write_shape)
        self.write_shape = None
        return self._encode(answer).encode("utf-8") + b"\n" + frame

    def _encode(self, answer):
        try:
            return encode(answer)
        except ValueError:
            # An output overflowed (e.g. a row rounded to inf): never send NaN.
            return encode({"ok": False, "error": "non-finite",
                           "detail": "the answer would contain NaN or Infinity"})

    def _answer(self, raw, read):
        # The answer dict of one request; None at end of input inside a frame.
        self.frame = None
        self.write_shape = None
        try:
            msg = decode_line(raw)
            if "frame" in msg:
                if read is None:
                    raise BadRequest("frame: a frame's bytes come with the session's input (Session.serve)")
                # The frame's bytes follow the line whatever else is wrong
                # with it: read them first, or the stream loses its place.
                arrays, size = _frame_header(msg, self.binary)
                payload = read(size)
                if len(payload) < size:
                    self.done = True
                    return None
                self.frame = (arrays, payload)
            op = msg.get("op")
            if type(op) is not str:
                raise BadRequest("op: missing or not a string")
            handler = self.ops.get(op)
            if handler is None:
                answer = {"ok": False, "error": "unknown-op", "detail": f"unknown op {json.dumps(op)[:60]}"}
            else:
                answer = handler(msg)
        except _LostPlace as e:
            # A frame header that does not say how many bytes follow: the
            # input cannot be followed past it.
            self.done = True
            answer = {"ok": False, "error": "bad-request", "detail": str(e)}
        except BadRequest as e:
            answer = {"ok": False, "error": "bad-request", "detail": str(e)}
        except Refusal as e:
            answer = {"ok": False, "error": e.code, "detail": e.detail}
        return answer

    def serve(self, stdin, stdout):
        """Answers every line of `stdin` (binary) on `stdout` (binary) until
        bye or end of input; returns the exit code (0)."""
        while not self.done:
            raw = stdin.readline()
            if not raw:
                break  # end of input means bye
            answer = self.respond(raw, stdin.read)
            if answer is None:
                break  # end of input inside a frame
            stdout.write(answer)
            stdout.flush()
        return 0

    # -- session ops ------------------------------------------------------------
    def op_hello(self, msg):
        check_keys(msg, "hello", ("op", "protocol", "version"), ("encodings",))
        protocol = get_str(msg, "protocol", "hello")
        version = get_int(msg, "version", "hello")
        if protocol != PROTOCOL or version != VERSION:
            raise Refusal("unsupported-version",
                          f"this adapter speaks {PROTOCOL} version {VERSION}, not {protocol} {version}")
        answer = {"ok": True, "protocol": PROTOCOL, "version": VERSION,
                  "name": self.adapter.display_name(), "capabilities": self.adapter.capabilities()}
        self.binary = False
        if "encodings" in msg:
            offered = msg["encodings"]
            if type(offered) is not list or not offered or any(type(e) is not str for e in offered):
                raise BadRequest("hello.encodings: expected a non-empty array of strings")
            for name in offered:
                if name not in ENCODINGS:
                    raise BadRequest(f"hello.encodings: unknown encoding {json.dumps(name)[:40]} (one of {ENCODINGS})")
            # The adapter's first preference that kvcheck offered.
            chosen = next((e for e in getattr(self.adapter, "encodings", ENCODINGS) if e in offered), "json")
            answer["encoding"] = chosen
            self.binary = chosen == "binary"
        return answer

    def op_open(self, msg):
        check_keys(msg, "open", ("op", "spec"))
        # A new open replaces any case still open (as if close had come first).
        self.cache = None
        self.spec = None
        try:
            spec = Spec(get_object(msg, "spec", "open"))
            self.cache = self.adapter.open(spec)
            self.spec = spec
        except OpenRefused as e:
            return {"ok": False, "refused": str(e)}
        return {"ok": True}

    def op_close(self, msg):
        check_keys(msg, "close", ("op",))
        self.cache = None
        self.spec = None
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
        if "prefix" not in msg:
            layer, request, state = self._common(msg, "begin")
            return _events_answer(self.cache.begin(layer, state, request), "begin")
        shared = self.spec is not None and self.spec.shared_row
        layer, request, state = self._common(msg, "begin", ("prefix", "k") if shared else ("prefix", "k", "v"))
        p = get_object(msg, "prefix", "begin")
        check_keys(p, "begin.prefix", ("request", "positions"))
        source = get_int(p, "request", "begin.prefix")
        n = get_int(p, "positions", "begin.prefix", 1)
        spec = self.spec
        k = get_rows(msg, "k", "begin", n, spec.kv_width)
        v = None if shared else get_rows(msg, "v", "begin", n, spec.kv_width)
        if self.to_rows is not None:
            k = self.to_rows(k, spec.kv_width)
            v = None if v is None else self.to_rows(v, spec.kv_width)
        result = self.cache.begin(layer, state, request, Prefix(source, n, k, v))
        written = recompute = None
        if isinstance(result, dict) and ("written" in result or "recompute" in result):
            result = dict(result)
            if "written" in result:
                written = [int(x) for x in result.pop("written")]
                if len(written) != n:
                    raise TypeError(f"Cache.begin: written has {len(written)} slots for a prefix of {n}")
            if "recompute" in result:
                # Positions left to the request's next writing step
                # (docs/semantics.md "Recompute in a step").
                recompute = [int(x) for x in result.pop("recompute")]
        answer = _events_answer(result or None, "begin")
        if written is not None:
            answer["written"] = written
        if recompute:
            answer["recompute"] = recompute
        return answer

    def op_accept(self, msg):
        layer, request, state = self._common(msg, "accept", ("accepted",))
        accepted = get_int(msg, "accepted", "accept")
        return _events_answer(self.cache.accept(layer, state, request, accepted), "accept")

    def op_finish(self, msg):
        layer, request, state = self._common(msg, "finish")
        return _events_answer(self.cache.finish(layer, state, request), "finish")

    def op_reset(self, msg):
        layer, request, state = self._common(msg, "reset")
        return _events_answer(self.cache.reset(layer, state, request), "reset")

    def op_trim(self, msg):
        layer, request, state = self._common(msg, "trim", ("positions",))
        positions = get_int(msg, "positions", "trim")
        return _events_answer(self.cache.trim(layer, state, request, positions), "trim")

    def op_preempt(self, msg):
        layer, request, state = self._common(msg, "preempt")
        return _events_answer(self.cache.preempt(layer, state, request), "preempt")

    def op_write(self, msg):
        op = msg["op"]
        if self.cache is None:
            raise Refusal("not-open", "no case is open")
        if op == "prefill":
            extra = ("position", "rows", "order", "k", "v", "q")
        elif op == "verify":
            extra = ("position", "drafts", "k", "v", "q")
        else:
            extra = ("position", "k", "v", "q")
        spec = self.spec
        shared = spec.shared_row
        if self.frame is not None:
            extra = tuple(x for x in extra if x not in ("k", "v", "q")) + ("frame",)
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
        if self.frame is not None:
            k, v, q = _frame_rows(self.frame, op, n, spec, self.numpy_rows)
            self.write_shape = (n, spec.q_width, spec.kv_width, shared)
            return self.cache.write(WriteStep(op, layer, state, request, position, n, order, drafts, k, v, q))
        k = get_rows(msg, "k", op, n, spec.kv_width)
        v = None if shared else get_rows(msg, "v", op, n, spec.kv_width)
        q = get_rows(msg, "q", op, n, spec.q_width)
        self.write_shape = (n, spec.q_width, spec.kv_width, shared)
        if self.to_rows is not None:
            k = self.to_rows(k, spec.kv_width)
            v = None if v is None else self.to_rows(v, spec.kv_width)
            q = self.to_rows(q, spec.q_width)
        return self.cache.write(WriteStep(op, layer, state, request, position, n, order, drafts, k, v, q))


# What a step that writes no rows may answer besides "ok" (adapters/PROTOCOL.md
# "Padding, moves and frees"): slots padded and freed, rows moved; slots
# cached (released to the free pool, still readable by a later prefix begin:
# "Cached rows"; hello "reports": {"cached": true}).
SLOT_EVENTS = ("padded", "moved", "freed", "cached")


def _events_answer(events, op):
    """The answer of a step without rows: {"ok": true}, plus the slot events
    the cache returned (None, or a dict of SLOT_EVENTS keys)."""
    answer = {"ok": True}
    if events is None:
        return answer
    if not isinstance(events, dict) or any(k not in SLOT_EVENTS for k in events):
        raise TypeError(f"Cache.{op} returns None or a dict of {SLOT_EVENTS}, got {events!r}")
    answer.update((k, v) for k, v in events.items() if len(v) > 0)
    return answer


def _numpy_rows(rows, width):
    # Rows already read strictly (types, counts, finiteness) as floats: the
    # array holds exactly those binary64 values.
    import numpy  # only adapters that ask for arrays need numpy
    return numpy.array(rows, dtype=numpy.float64).reshape(len(rows), width)


# ---------------------------------------------------------------------------
# Binary frames (adapters/PROTOCOL.md "Binary frames")
#
# A line may announce a frame: "frame": {"dtype": "f64", "bytes": B,
# "arrays": [[name, rows, width], ...]}; exactly B bytes follow its newline:
# the arrays in the order listed, row-major, little-endian.

class _LostPlace(BadRequest):
    """A frame whose length cannot be read: the input cannot be followed."""


_LITTLE = sys.byteorder == "little"


def _numpy():
    # numpy when the adapter already uses it (rows = "numpy", arrays in its
    # answers): frames are then read and written as arrays. Never imported
    # here: an adapter of lists keeps its start-up time (an import of numpy
    # costs more than the frames of a small case) and uses `array`.
    return sys.modules.get("numpy")


def _frame_header(msg, negotiated):
    """(arrays, bytes) of a request's frame, read strictly; _LostPlace when
    the byte count itself is unusable, BadRequest (after the bytes are read)
    for anything else."""
    frame = msg["frame"]
    if type(frame) is not dict or type(frame.get("bytes")) is not int:
        raise _LostPlace("frame.bytes: missing or not an integer")
    size = frame["bytes"]
    if size < 0 or size > MAX_FRAME_BYTES:
        raise _LostPlace(f"frame.bytes: {size} is outside 0 .. {MAX_FRAME_BYTES}")
    arrays = frame.get("arrays")
    problem = None
    if not negotiated:
        problem = "frame: binary frames were not negotiated at hello"
    elif sorted(frame) != ["arrays", "bytes", "dtype"]:
        problem = "frame: expected the keys dtype, bytes and arrays"
    elif frame["dtype"] != "f64":
        problem = f"frame.dtype: kvcheck sends f64, got {json.dumps(frame['dtype'])[:40]}"
    elif (type(arrays) is not list or
          any(type(a) is not list or len(a) != 3 or type(a[0]) is not str or type(a[1]) is not int or
              type(a[2]) is not int or a[1] < 0 or a[2] < 0 for a in arrays)):
        problem = "frame.arrays: expected an array of [name, rows, width]"
    elif sum(a[1] * a[2] * 8 for a in arrays) != size:
        problem = f"frame.bytes: {size} disagrees with the arrays' shapes"
    return (problem or arrays), size


def _frame_rows(frame, op, n, spec, numpy_rows):
    """k, v, q of a write from its frame: [["k", n, kv_width], ["v", n,
    kv_width] unless rows are shared, ["q", n, q_width]] in that order."""
    arrays, payload = frame
    if type(arrays) is str:
        raise BadRequest(f"{op}.{arrays}")
    expected = [["k", n, spec.kv_width]] + ([] if spec.shared_row else [["v", n, spec.kv_width]]) + \
        [["q", n, spec.q_width]]
    if arrays != expected:
        raise BadRequest(f"{op}.frame.arrays: expected {json.dumps(expected)}, got {json.dumps(arrays)[:120]}")
    np = _numpy()
    rows = []
    offset = 0
    for name, count, width in arrays:
        size = count * width
        if np is not None:
            x = np.frombuffer(payload, dtype="<f8", count=size, offset=offset).reshape(count, width)
            if not np.isfinite(x).all():
                raise BadRequest(f"{op}.{name}: not finite")
            rows.append(x.copy() if numpy_rows else x.tolist())
        else:
            x = array.array("d", payload[offset:offset + size * 8])
            if not _LITTLE:
                x.byteswap()
            if not all(map(math.isfinite, x)):
                raise BadRequest(f"{op}.{name}: not finite")
            flat = x.tolist()
            rows.append([flat[i * width:(i + 1) * width] for i in range(count)])
            if numpy_rows:
                rows[-1] = _numpy_rows(rows[-1], width)
        offset += size * 8
    k = rows[0]
    v = None if spec.shared_row else rows[1]
    q = rows[-1]
    return k, v, q


def _pack(value, count, width):
    """The little-endian f64 bytes of `value` ([count, width] finite numbers:
    lists, numpy arrays, tensors), or None when it is not exactly that (the
    answer then carries it as JSON, and kvcheck judges it as it would)."""
    np = _numpy()
    try:
        if np is not None:
            if hasattr(value, "detach"):  # a torch tensor: its CPU values
                value = value.detach().cpu().numpy()
            x = np.asarray(value, dtype=np.float64)
            if x.shape != (count, width) or not np.isfinite(x).all():
                return None
            return x.astype("<f8", copy=False).tobytes()
        if hasattr(value, "tolist"):
            value = value.tolist()
        if type(value) is not list or len(value) != count:
            return None
        flat = array.array("d")
        for row in value:
            if type(row) is not list or len(row) != width:
                return None
            flat.extend(row)
        if not all(map(math.isfinite, flat)):
            return None
        if not _LITTLE:
            flat.byteswap()
        return flat.tobytes()
    except (TypeError, ValueError, OverflowError):
        return None


def _frame_answer(answer, shape):
    """An ok write answer with out and stored rows moved into a frame, and
    the frame's bytes; what does not have its exact shape stays JSON."""
    count, q_width, kv_width, shared = shape
    listed = []
    chunks = []
    answer = dict(answer)
    if "out" in answer:
        packed = _pack(answer["out"], count, q_width)
        if packed is not None:
            del answer["out"]
            listed.append(["out", count, q_width])
            chunks.append(packed)
    stored = answer.get("stored")
    if type(stored) is dict and set(stored) == ({"k"} if shared else {"k", "v"}):
        packed = [(key, _pack(stored[key], count, kv_width)) for key in ("k", "v") if key in stored]
        if all(p is not None for _, p in packed):
            del answer["stored"]
            for key, p in packed:
                listed.append(["stored." + key, count, kv_width])
                chunks.append(p)
    if not listed:
        return answer, b""
    payload = b"".join(chunks)
    answer["frame"] = {"dtype": "f64", "bytes": len(payload), "arrays": listed}
    return answer, payload


def run(adapter_class):
    """Entry point of an adapter script: `kp.run(MyAdapter)` serves the
    protocol on stdin/stdout and exits with its code."""
    try:
        code = adapter_class().main()
    except BrokenPipeError:
        # kvcheck went away without bye: nothing to answer to.
        code = 0
    sys.exit(code)
