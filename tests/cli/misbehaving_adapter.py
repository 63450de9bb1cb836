#!/usr/bin/env python3
"""A kvcheck exec adapter that breaks the protocol on purpose (tests only).

Usage: misbehaving_adapter.py MODE [MARKER]
It answers hello, open, begin and bookkeeping steps correctly, then misbehaves
at the first step that writes rows:
  crash          exits with status 3 after printing to stderr
  not-json       answers a line that is not JSON
  missing-field  leaves "out" out of the answer
  wrong-shape    answers one number too few in out[0]
  nan            answers NaN in out[0][0]
  hang           never answers (and starts a grandchild that would linger)
  bad-version    answers hello with protocol version 2
MARKER is ignored; tests put it on the command line to find leftover processes.
"""
import json
import subprocess
import sys
import time

sys.dont_write_bytecode = True
MODE = sys.argv[1] if len(sys.argv) > 1 else "crash"


def say(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    req = json.loads(line)
    op = req.get("op")
    if op == "hello":
        say({"ok": True, "protocol": "kvcheck-exec", "version": 2 if MODE == "bad-version" else 1,
             "name": "misbehaving-" + MODE,
             "capabilities": {"steps": ["decode", "prefill_load_then_store", "prefill_store_then_load",
                                        "verify", "accept", "finish", "reset"],
                              "formats": ["f64", "f32", "bf16", "fp8"], "rope": ["none", "neox", "interleaved"],
                              "layouts": ["mha", "gqa", "mqa", "shared"], "sink": True, "softmax_scale": True,
                              "reports": {"written_slots": True, "read_slots": True}}})
    elif op in ("prefill", "decode", "verify"):
        rows = len(req["q"])
        width = len(req["q"][0])
        answer = {"ok": True, "out": [[0.0] * width for _ in range(rows)],
                  "written": list(range(rows)), "read": [[0] for _ in range(rows)]}
        if MODE == "crash":
            sys.stderr.write("boom: simulated crash in the adapter\n")
            sys.stderr.flush()
            sys.exit(3)
        if MODE == "not-json":
            sys.stdout.write("this is not json\n")
            sys.stdout.flush()
            continue
        if MODE == "missing-field":
            del answer["out"]
        if MODE == "wrong-shape":
            answer["out"][0].pop()
        if MODE == "nan":
            answer["out"][0][0] = float("nan")
        if MODE == "hang":
            subprocess.Popen(["sleep", "600"])
            sys.stderr.write("adapter: thinking forever\n")
            sys.stderr.flush()
            while True:
                time.sleep(1)
        say(answer)
    elif op == "bye":
        say({"ok": True})
        break
    else:
        say({"ok": True})
