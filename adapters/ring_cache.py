#!/usr/bin/env python3
"""Ring-addressed sliding-window KV cache, as a kvcheck exec adapter.

    kvcheck check --impl exec:'python3 adapters/ring_cache.py' --cases 2000
    kvcheck check --impl exec:'python3 adapters/ring_cache.py --bug rope-at-slot'
    kvcheck check --impl exec:'python3 adapters/ring_cache.py --output-format bf16'

Per layer and per state id the cache owns `capacity` rows; position p of the
request on state b lives in slot b * capacity + p % capacity (addressing
"ring", docs/semantics.md "Windows"). Each slot holds the stored key row (RoPE'd at its position,
then rounded through the format) and value row. A query at position p reads
the slots of positions max(0, p - keys + 1) .. p. Prefill runs in either
order: store_then_load stores the chunk and then reads the pool (rows of the
chunk may overwrite rows its own queries still need when the ring has no
slack: the hazard kvcheck measures); load_then_store copies the old window out
first. Step semantics are shared with paged_cache.py (window_cache.py).

`--output-format bf16` (or fp16, f32, f64) rounds every output once, to
nearest even, into that format and declares it (hello "output_format"), as a
kernel that accumulates in float and writes bf16 does (docs/semantics.md
"Output formats"); `--undeclared-output-format` keeps the declaration out of
hello (kvcheck then holds the rounded outputs to the accumulation's tolerance,
and they fail).

`--bug NAME` switches on a bug engines have shipped (`--list-bugs`); the
default cache passes every case kvcheck generates.
"""

import math
import os
import struct
import sys

sys.dont_write_bytecode = True  # keep adapters/ free of __pycache__
# The kvcheck package: the repository's python/ when run from the repository,
# else the installed one.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import kvcheck  # noqa: E402
from kvcheck import protocol as kp  # noqa: E402
import window_cache  # noqa: E402


def bf16_truncate_row(row):
    """bf16 by truncation: binary32 (rounded), then its low 16 bits dropped."""
    out = []
    for x in row:
        try:
            bits = struct.unpack("<I", struct.pack("<f", x))[0] & 0xFFFF0000
            out.append(struct.unpack("<f", struct.pack("<I", bits))[0])
        except OverflowError:
            out.append(math.copysign(math.inf, x))
    return out


class RingCache(window_cache.WindowCache):
    def __init__(self, spec, bugs):
        super().__init__(spec, bugs)
        # ring-sized-window: the ring is addressed modulo the window's keys,
        # as if it had been allocated with exactly `keys` rows.
        self.modulus = spec.keys if "ring-sized-window" in bugs else spec.capacity
        self.rope_at_slot = "rope-at-slot" in bugs
        if "window-plus-one" in bugs:
            self.read_keys = spec.keys + 1
        if "bf16-truncate" in bugs and spec.format == "bf16":
            self.round = bf16_truncate_row
        self.zero_output = "zero-output" in bugs
        self.output_format = None  # --output-format (RingAdapter.make_cache sets it)
        # output-truncated: outputs truncated into the output format (toward
        # zero) instead of rounded to nearest: up to one unit in the last
        # place off, where a rounding is at most half.
        self.output_truncated = "output-truncated" in bugs
        # keep-drafts-on-finish: finish and reset leave a pending verify's
        # drafts pending, and the state's next request inherits them.
        self.keep_drafts = "keep-drafts-on-finish" in bugs
        self.kept = {}  # (layer, state) -> (pending_first, pending_drafts)
        # padding-through-ring: a padded prefill's padding rows are written
        # at the ring slots of the positions after the chunk (where a wrapped
        # ring still holds live rows), not to scratch slots. Pads to 8 rows
        # unless --pad-prefill says otherwise.
        self.pad_through_ring = "padding-through-ring" in bugs
        if self.pad_through_ring:
            self.pad_to = 8

    def _keep(self, layer, state):
        st = self._state(self._layer(layer), state)
        if st.pending_drafts >= 0:
            self.kept[(layer, state)] = (st.pending_first, st.pending_drafts)

    def _restore(self, layer, state):
        kept = self.kept.pop((layer, state), None)
        if kept is not None:
            st = self._state(self._layer(layer), state)
            st.pending_first, st.pending_drafts = kept

    def begin(self, layer, state, request):
        super().begin(layer, state, request)
        if self.keep_drafts:
            self._restore(layer, state)

    def finish(self, layer, state, request):
        if self.keep_drafts:
            self._keep(layer, state)
        super().finish(layer, state, request)

    def reset(self, layer, state, request):
        if self.keep_drafts:
            self._keep(layer, state)
        super().reset(layer, state, request)
        if self.keep_drafts:
            self._restore(layer, state)

    def write_step(self, step):
        answer = super().write_step(step)
        # zero-output: a kernel that never ran (every output element 0).
        if self.zero_output and answer.get("out"):
            answer["out"] = [None if o is None else [0.0] * len(o) for o in answer["out"]]
        # The kernel's last operation: each output, computed in double, written in the output format.
        if self.output_format and answer.get("out"):
            answer["out"] = [None if o is None else
                             kvcheck.round_output(o, self.output_format, truncate=self.output_truncated)
                             for o in answer["out"]]
        return answer

    def write_slot(self, layer, st, b, p):
        return b * self.spec.capacity + p % self.modulus

    def pad_slot(self, layer, st, b, p, j):
        if self.pad_through_ring:
            return self.write_slot(layer, st, b, p)
        return super().pad_slot(layer, st, b, p, j)

    # The ring reads a position where it would write it.
    read_slot = write_slot

    def key_rope_position(self, p):
        # rope-at-slot: keys rotated at their ring row instead of their position.
        return p % self.spec.capacity if self.rope_at_slot else p


class RingAdapter(window_cache.WindowAdapter):
    """Ring-addressed sliding-window KV cache (kvcheck exec protocol v1)."""

    name = "ring-cache"
    addressing = "ring"
    bugs = {
        "ring-sized-window": "stores at b*capacity + p % keys: the ring has only `keys` rows, "
                             "no slack for verify or chunks",
        "rope-at-slot": "keys are RoPE'd at their ring row p % capacity instead of p",
        "window-plus-one": "each query reads keys + 1 positions when they exist",
        "zero-output": "every output element is 0, as from a kernel that never ran",
        "bf16-truncate": "bf16 rows are truncated (binary32's low 16 bits dropped) instead of "
                         "rounded to nearest even",
        "keep-drafts-on-finish": "finish and reset leave a pending verify's drafts pending (the "
                                 "state's next request inherits them)",
        "trim-keeps-drafts": "a trim rewinds the length but leaves a pending verify's drafts pending",
        "padding-through-ring": "a padded prefill (to a multiple of 8 rows, or --pad-prefill N) writes its "
                                "padding at the ring slots after the chunk, over rows still live",
        "layer-window-swapped": "every layer reads with layer 0's window (the per-layer window "
                                "taken from the wrong layer)",
        "output-truncated": "outputs are truncated into the output format (toward zero) instead of rounded "
                            "to nearest even: up to one unit in the last place off (implies --output-format "
                            "bf16 unless another is given)",
    }
    trims = True
    output_format = None  # --output-format (configure sets it)
    declare_output_format = True  # --undeclared-output-format: rounded, not declared

    def add_arguments(self, parser):
        parser.add_argument("--output-format", choices=kp.OUTPUT_FORMATS, default=None, metavar="FORMAT",
                            help="round every output once, to nearest even, into FORMAT (one of "
                                 f"{', '.join(kp.OUTPUT_FORMATS)}) and declare it in hello (\"output_format\"), "
                                 "as a kernel that accumulates in float and writes bf16 does")
        parser.add_argument("--undeclared-output-format", action="store_true",
                            help="keep --output-format out of hello (the outputs are still rounded: kvcheck "
                                 "then judges them by the accumulation alone)")

    def configure(self, args):
        self.output_format = args.output_format
        if self.output_format is None and "output-truncated" in args.bug:
            self.output_format = "bf16"
        self.declare_output_format = not args.undeclared_output_format
        if args.undeclared_output_format and self.output_format is None:
            raise SystemExit("ring-cache: --undeclared-output-format needs --output-format")
        if self.output_format is not None and not self.report_outputs:
            raise SystemExit("ring-cache: --output-format needs outputs (drop --no-outputs)")

    def display_name(self):
        name = super().display_name()
        return name if self.output_format is None else f"{name}/out={self.output_format}"

    def capabilities(self):
        caps = super().capabilities()
        if self.output_format is not None and self.declare_output_format:
            caps["output_format"] = self.output_format
        return caps

    def make_cache(self, spec):
        cache = RingCache(spec, self.active_bugs)
        cache.output_format = self.output_format
        return cache


if __name__ == "__main__":
    kp.run(RingAdapter)
