#!/usr/bin/env python3
"""Validates kvcheck's real exec traffic against the published protocol schema.

Usage: exec_traffic_test.py KVCHECK_BINARY SOURCE_DIR

Runs `kvcheck check --cases 60` and `kvcheck replay` of every bundled fast
scenario against the bundled ring and paged adapters through a tee that logs
every line in both directions, then validates each logged line with
jsonschema (Draft 2020-12) against the definition its op names (requests) or
the answer definitions: every line of a structure seen fewer than 20 times
(its keys, nesting and value types), the first 20 of each other structure and
every 25th line besides (pure-Python validation of all of them took nine
tenths of the test's time). Exits 0 when every validated line validates, 1
otherwise, 77 (skipped) when python3-jsonschema is missing.
"""
import json
import os
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True

TEE = r'''
import subprocess, sys
log = open(sys.argv[1], "a")
child = subprocess.Popen(sys.argv[2:], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
for line in sys.stdin:
    log.write("> " + line)
    child.stdin.write(line)
    child.stdin.flush()
    answer = child.stdout.readline()
    log.write("< " + answer)
    log.flush()
    sys.stdout.write(answer)
    sys.stdout.flush()
child.stdin.close()
child.wait()
'''


def structure(value):
    """The shape of a JSON value: keys and nesting kept, leaves by type."""
    if isinstance(value, dict):
        return "{" + ",".join(k + ":" + structure(v) for k, v in sorted(value.items())) + "}"
    if isinstance(value, list):
        return "[" + "|".join(sorted({structure(v) for v in value})) + "]"
    return type(value).__name__


def main():
    try:
        import jsonschema
    except ImportError:
        print("python3-jsonschema is not installed: skipped")
        return 77
    kvcheck, root = sys.argv[1], sys.argv[2]
    schema = json.load(open(os.path.join(root, "scenarios", "schema", "exec-protocol.schema.json")))
    jsonschema.Draft202012Validator.check_schema(schema)

    def validator(name):
        return jsonschema.Draft202012Validator({"$schema": schema["$schema"], "$defs": schema["$defs"],
                                                "$ref": "#/$defs/" + name})

    answers = validator("answer")
    by_op = {}
    with tempfile.TemporaryDirectory() as tmp:
        tee = os.path.join(tmp, "tee.py")
        open(tee, "w").write(TEE)
        log = os.path.join(tmp, "traffic.log")
        # The paged adapter that recomputes in a step answers begins with
        # `recompute` and steps with `recomputed` (checked only: its begins are a check's).
        for script in ("ring_cache.py", "paged_cache.py", "paged_cache.py --recompute-in-step"):
            impl = "exec:python3 %s %s python3 %s" % (tee, log, os.path.join(root, "adapters", script))
            runs = (["check", "--cases", "60", "--out", os.path.join(tmp, "out")],
                    ["replay", os.path.join(root, "scenarios", "fast")])
            for args in runs[:1] if " " in script else runs:
                subprocess.run([kvcheck] + args + ["--impl", impl], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, check=False)
        lines = open(log).read().splitlines()
    if len(lines) < 1000:
        print("too little traffic logged: %d lines" % len(lines))
        return 1
    bad = 0
    validated = 0
    ops = set()
    seen = {}
    for n, line in enumerate(lines):
        direction, text = line[:2], line[2:]
        msg = json.loads(text)
        if direction == "> ":
            ops.add(msg.get("op"))
        shape = direction + structure(msg)
        seen[shape] = seen.get(shape, 0) + 1
        if seen[shape] > 20 and n % 25 != 0:
            continue
        validated += 1
        if direction == "> ":
            op = msg.get("op")
            if op not in by_op:
                by_op[op] = validator(op)
            errors = list(by_op[op].iter_errors(msg))
        else:
            errors = list(answers.iter_errors(msg))
        if errors:
            bad += 1
            if bad <= 5:
                print("line %d breaks the schema: %s\n  %s" % (n + 1, errors[0].message, text[:300]))
    # Each answer key of the recomputing adapter was sent (every structure is validated at least 20 times).
    for key in ('"recompute":', '"recomputed":'):
        if not any(line.startswith("< ") and key in line for line in lines):
            print("no answer carried %s" % key)
            return 1
    expected = {"hello", "open", "begin", "prefill", "decode", "verify", "accept", "finish", "reset", "close"}
    if not expected <= ops:
        print("ops never sent: %s" % sorted(expected - ops))
        return 1
    print("%d of %d lines validated (%d structures), %d broke the schema; ops sent: %s"
          % (validated, len(lines), len(seen), bad, sorted(ops)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
