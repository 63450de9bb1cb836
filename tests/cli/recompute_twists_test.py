#!/usr/bin/env python3
"""A cache that recomputes prefix rows in a step (docs/semantics.md "Recompute
in a step") held to the rules: kvcheck replays one scenario (a request begun
from a finished one's prefix, then two decodes) against the bundled paged
adapter with --recompute-in-step, correct and with one twist of its answers
at a time, and each twist fails with the message that names it.

Usage: recompute_twists_test.py KVCHECK_BINARY SOURCE_DIR
"""
import json
import os
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True

# The paged adapter with one answer twisted (argv[1]); the rest of argv is its own.
ADAPTER = r'''
import sys
sys.dont_write_bytecode = True
sys.path.insert(0, sys.argv.pop(1))
twist = sys.argv.pop(1)
import paged_cache
from kvcheck import protocol as kp

cache = paged_cache.SharingPagedCache
write_step = cache.write_step

def twisted_write(self, step):
    answer = write_step(self, step)
    done = answer.get("recomputed")
    if twist == "twice" and done:
        done.append(list(done[0]))
    if twist == "collide" and done:
        done[0][1] = answer["written"][0]
    if twist == "not-left" and not done and step.position > 1:
        answer["recomputed"] = [[0, 0]]
    return answer

op_begin = kp.Session.op_begin

def twisted_begin(self, msg):
    answer = op_begin(self, msg)  # past the package's own checks: what a hand-written adapter may send
    if twist == "plain-begin" and "prefix" not in msg:
        answer["recompute"] = [0]
    return answer

cache.write_step, kp.Session.op_begin = twisted_write, twisted_begin
capabilities = paged_cache.PagedAdapter.capabilities

def twisted_caps(self):
    caps = capabilities(self)
    if twist == "undeclared":
        del caps["recompute_in_step"]
    return caps

paged_cache.PagedAdapter.capabilities = twisted_caps
kp.run(paged_cache.PagedAdapter)
'''

SCENARIO = {
    "schema_version": 1, "name": "recompute-twists",
    "description": "request 3 begins from finished request 1's first position, then decodes twice",
    "cache": {"window": 2, "window_convention": "keys", "ring_rows": 7, "states": 1, "q_heads": 1, "kv_heads": 1,
              "head_dim": 2, "shared_row": False, "format": "f64",
              "rope": {"style": "none", "rotary_dims": 0, "base": 10000.0}, "layers": 1,
              "softmax_scale": None, "sink_logit": None},
    "data": {"seed": 4, "rows": []},
    "requests": [{"id": 1, "state": 0}, {"id": 3, "state": 0, "prefix": {"request": 1, "positions": 1}}],
    "steps": [{"kind": "prefill", "request": 1, "rows": 1, "order": "load_then_store"},
              {"kind": "finish", "request": 1}, {"kind": "decode", "request": 3}, {"kind": "decode", "request": 3}],
    "expect": None,
}

# twist -> (exit code, what the output must say)
CASES = {
    "none": (0, "PASS: 1 run"),
    "twice": (1, "answer.recomputed[1]: position 0 stored twice"),
    "not-left": (1, "answer.recomputed[0]: position 0 was not left to this step by the request's begin"),
    "collide": (1, "1 same-step"),
    "plain-begin": (None, "answer.recompute: only a begin from a prefix leaves positions to recompute"),
    "undeclared": (None, "answer.recompute: prefix rows recomputed in a step from a cache that did not declare it"),
}


def main():
    kvcheck, root = sys.argv[1], sys.argv[2]
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        adapter = os.path.join(tmp, "twisted.py")
        open(adapter, "w").write(ADAPTER)
        scenario = os.path.join(tmp, "recompute-twists.json")
        json.dump(SCENARIO, open(scenario, "w"))
        for twist, (code, words) in CASES.items():
            impl = "exec:%s %s %s %s --recompute-in-step" % (sys.executable, adapter,
                                                             os.path.join(root, "adapters"), twist)
            run = subprocess.run([kvcheck, "replay", scenario, "--impl", impl],
                                 capture_output=True, text=True, timeout=300, cwd=tmp)
            said = run.stdout + run.stderr
            ok = words in said and (run.returncode == code if code is not None else run.returncode not in (0, 1))
            print("%-12s exit %d: %s" % (twist, run.returncode, "ok" if ok else "WRONG"))
            if not ok:
                failed += 1
                print(said[-2000:])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
