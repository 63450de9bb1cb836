#!/usr/bin/env python3
"""The engine's shape space declared and honoured, a strict handshake, slot
ids inside the protocol, and bookkeeping-only engines (issue 18 items 3, 4
and 7, issue 19 item 5).

    shape_space_test.py KVCHECK SOURCE_DIR

1. A hello that misspells a key, a step, a format, a layout or an
   addressing, names another protocol, or gives an out-of-range integer
   (max_states 2^64 - 1, max_heads -1) is exit 2 naming the JSON path
   (tests/cli/twisted_adapter.py).
2. A read slot beyond int64 and an `out` from an engine that declared
   "outputs": false are exit 2 naming answer.read[i][j] / answer.out; a read
   slot below -1 and a written slot below 0 fail the run at the step
   (issue 30 item 2: an impossible slot is the cache's failure).
3. An engine that refuses head_dims not a multiple of 8: undeclared, many
   cases are refused; declared in hello (head_dim.multiple_of), none is.
4. A bookkeeping-only engine (adapters' --no-outputs: slots and no outputs)
   passes when correct; with a window bug it fails, the lost row shown both
   as missing or overwritten and as an output kvcheck computed over the rows
   read (a ring too small for its chunks: the paged adapter answers its
   frees, so its early free fails at the free, before any read).
"""
import json
import os
import shutil
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import harness
from harness import expect, finish

KVCHECK = sys.argv[1]
SOURCE = sys.argv[2]
FAST = os.path.join(SOURCE, "scenarios", "fast", "prefill-w3-s5-store-then-load-4-6.json")


def run(args):
    return harness.run([KVCHECK] + args)


impl = harness.exec_impl
twisted = harness.twisted


def adapter(name, *flags):
    return harness.bundled_adapter(SOURCE, name, *flags)


def counts(stdout):
    """(ran, refused) from check's first line: 'check: N cases (R ran, F refused, ...)'."""
    head = stdout.split("(", 1)[1].split(")", 1)[0]
    parts = dict(reversed(p.strip().split(" ", 1)) for p in head.split(","))
    return int(parts["ran"]), int(parts["refused"])


work = tempfile.mkdtemp(prefix="kvcheck-shapes-")
try:
    # 1. Strict hello.
    hello = {
        "step-prefill": ('hello answer.capabilities.steps[0]', '"prefill"'),
        "format-float32": ('hello answer.capabilities.formats[1]', '"float32"'),
        "layout-typo": ('hello answer.capabilities.layouts[1]', '"gqa "'),
        "addressing-typo": ('hello answer.capabilities.addressing', '"rign"'),
        "unknown-key": ('hello answer.capabilities.max_head_dims', 'unknown key'),
        "top-level-key": ('hello answer.capabilites', 'unknown key'),
        "protocol-name": ('hello answer.protocol', '"not-kvcheck"'),
        "max-states-huge": ('hello answer.capabilities.max_states', '18446744073709551615'),
        "max-heads-negative": ('hello answer.capabilities.max_heads', 'out of range'),
        "verify-no-accept": ('hello answer.capabilities.steps', 'verify and accept'),
        "outputs-no-slots": ('hello answer.capabilities.outputs', 'must report written and read slots'),
    }
    for twist, (path, detail) in hello.items():
        code, _, err = run(["check", "--cases", "2", "--out", os.path.join(work, twist), "--impl", twisted(twist)])
        first = err.splitlines()[0] if err else ""
        expect(code == 2 and first.startswith("kvcheck error 600 at " + path + ":") and detail in first,
               f"hello twist {twist}: exit 2 at {path} naming {detail} (got {code}: {first[:160]})")

    # 2. Malformed answers (a slot beyond int64, out from an engine without
    # outputs) are exit 2 naming the field; a well-formed slot the cache does
    # not have (below -1, -1 where it means nothing, past the ring) fails
    # the run at its step, naming the layer and the field (issue 30 item 2).
    answers = {
        "read-2-63": "steps[0] (prefill, layer 0) answer.read[0][1]: out of range: 9223372036854775808",
        "out-with-no-outputs": "steps[0] (prefill, layer 0) answer.out: the engine declared",
    }
    for twist, expected in answers.items():
        code, _, err = run(["replay", FAST, "--impl", twisted(twist)])
        first = err.splitlines()[0] if err else ""
        expect(code == 2 and first.startswith("kvcheck error 600 at " + expected),
               f"answer twist {twist}: exit 2 naming {expected} (got {code}: {first[:160]})")
    impossible = {
        "read-minus-two": "step 0 (prefill) layer 0: answer.read[0][1]: slot -2 is not a slot of the cache",
        "written-minus-one": "step 0 (prefill) layer 0: answer.written[0]: slot -1 is not a slot of the cache",
    }
    for twist, expected in impossible.items():
        code, out, err = run(["replay", FAST, "--impl", twisted(twist)])
        expect(code == 1 and "first failure: " + expected in out,
               f"answer twist {twist}: exit 1, first failure {expected} (got {code}: {out[-300:]} {err[:200]})")

    # 3. Shape limits: undeclared they are refusals, declared they are honoured.
    limits = ["--require-head-dim-multiple", "8"]
    code, out, err = run(["check", "--cases", "300", "--min-run-share", "0", "--out", os.path.join(work, "undeclared"),
                          "--impl", adapter("ring_cache.py", *limits, "--undeclared-limits")])
    ran, refused = counts(out)
    expect(code == 0 and refused > 100 and ran + refused == 300,
           f"undeclared head_dim multiple of 8: most of 300 cases refused (exit {code}, {ran} ran, {refused} refused)")
    code, out, err = run(["check", "--cases", "300", "--out", os.path.join(work, "declared"),
                          "--impl", adapter("ring_cache.py", *limits)])
    ran, refused = counts(out)
    expect(code == 0 and refused == 0 and ran == 300,
           f"declared head_dim multiple of 8: 300 of 300 cases ran, 0 refused (exit {code}, {ran} ran, {refused} refused)")

    # 4. Bookkeeping-only engines: kvcheck computes the outputs over the rows read.
    for name in ("ring_cache.py", "paged_cache.py"):
        code, out, err = run(["check", "--cases", "300", "--out", os.path.join(work, "bk-" + name),
                              "--impl", adapter(name, "--no-outputs")])
        expect(code == 0 and ", 0 failing" in out, f"{name} --no-outputs passes 300 cases (exit {code}): {err[:200]}")
    code, out, err = run(["check", "--cases", "300", "--max-failures", "4", "--out", os.path.join(work, "bk-paged-bug"),
                          "--impl", adapter("paged_cache.py", "--no-outputs", "--bug", "free-early")])
    expect(code == 1, f"paged_cache.py --no-outputs --bug free-early fails (exit {code})")
    bug = os.path.join(work, "bk-bug")
    code, out, err = run(["check", "--cases", "300", "--max-failures", "4", "--out", bug,
                          "--impl", adapter("ring_cache.py", "--no-outputs", "--bug", "ring-sized-window")])
    expect(code == 1, f"ring_cache.py --no-outputs --bug ring-sized-window fails (exit {code})")
    report = json.load(open(os.path.join(bug, "report.json"), encoding="utf-8"))
    lost = [q for run_ in report["runs"] for st in run_["steps"] for q in st["queries"] if q["missing"] or q["overwritten"]]
    expect(bool(lost), "the counterexample shows a lost row (missing or overwritten)")
    expect(any(q["output"]["abs_diff"] > q["output"]["tolerance"] for q in lost),
           "and the output kvcheck computed over the rows read differs from the reference beyond its tolerance")
    code, out, err = run(["check", "--cases", "300", "--max-failures", "4", "--out", os.path.join(work, "bk-ring-bug"),
                          "--impl", adapter("ring_cache.py", "--no-outputs", "--bug", "window-plus-one")])
    expect(code == 1, f"ring_cache.py --no-outputs --bug window-plus-one fails (exit {code})")
finally:
    shutil.rmtree(work, ignore_errors=True)
sys.exit(finish())
