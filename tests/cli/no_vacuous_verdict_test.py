#!/usr/bin/env python3
"""No vacuous verdict, and no earlier verdict left standing (issue 18, items 4 and 6).

    no_vacuous_verdict_test.py KVCHECK SOURCE_DIR

1. A cache that refuses most cases at open (tests/cli/refusing_adapter.py,
   head_dim a multiple of 8) makes `check` fail (exit 1) with a line saying
   how few ran; every report names the run / refused / skipped counts and
   fails too. A cache that refuses a share below --min-run-share passes, and
   its reports still show what was refused. A bad --min-run-share is exit 2.
2. `replay` where nothing ran (every scenario refused, or skipped by the
   cache's capabilities) exits 1 and says no run ran; its report says so.
3. A run that ends without a verdict withdraws the earlier set in --out: an
   adapter that dies (exit 2) and a SIGTERM leave no report there; replay
   --report/--junit/--html files go the same way, and so does an earlier
   shard.json under `check --shard`. A passing run removes an earlier run's
   counterexample from its --out.
"""
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import harness
from harness import expect, finish

KVCHECK = sys.argv[1]
SOURCE = sys.argv[2]
HERE = os.path.dirname(os.path.abspath(__file__))
REPORTS = ("report.json", "report.txt", "report.html", "junit.xml")


def run(args):
    return harness.run([KVCHECK] + args)


def exec_impl(script, *flags):
    return "exec:" + " ".join(shlex.quote(a) for a in ["python3", os.path.join(HERE, script), *flags])


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def present(d):
    return sorted(n for n in os.listdir(d) if n in REPORTS or n.startswith("counterexample-"))


work = tempfile.mkdtemp(prefix="kvcheck-vacuous-")
try:
    # 1. Most cases refused: the check fails, and says why, in every format.
    out = os.path.join(work, "refused")
    code, stdout, stderr = run(["check", "--impl", exec_impl("refusing_adapter.py", "--head-dim-multiple", "8"),
                                "--cases", "120", "--out", out])
    expect(code == 1, f"check over a cache refusing head_dim % 8 != 0 exits 1 (got {code}: {stderr.strip()})")
    expect("below --min-run-share 0.8" in stdout, "the terminal names the --min-run-share gate")
    report = json.loads(read(os.path.join(out, "report.json")))
    c = report["check"]
    expect(report["verdict"] == "fail" and c["verdict"] == "fail" and not c["run_share_met"],
           "report.json: the check fails on its run share")
    expect(c["refused"] > 0.2 * c["cases"] and c["ran"] + c["refused"] + c["skipped"] == c["cases"],
           f"report.json counts ran {c['ran']} + refused {c['refused']} + skipped {c['skipped']} = {c['cases']}")
    text = read(os.path.join(out, "report.txt"))
    counts = f"{c['cases']} cases: {c['ran']} ran, {c['refused']} refused, {c['skipped']} skipped"
    expect(counts in text and "\nFAIL: " + counts in text, f"report.txt's verdict line names '{counts}'")
    expect(f"{c['ran']} ran, {c['refused']} refused" in stdout, "the terminal summary shows the counts")
    junit = read(os.path.join(out, "junit.xml"))
    expect('name="cases_refused" value="%d"' % c["refused"] in junit and 'failures="1"' in junit,
           "junit.xml carries the refused count and fails the property check")
    expect(counts in read(os.path.join(out, "report.html")), "report.html shows the counts")

    # A share refused below the gate passes, and still shows what was refused.
    out = os.path.join(work, "some-refused")
    code, stdout, stderr = run(["check", "--impl", exec_impl("refusing_adapter.py", "--refuse-share", "0.3"),
                                "--cases", "120", "--out", out, "--min-run-share", "0.5"])
    report = json.loads(read(os.path.join(out, "report.json")))
    c = report["check"]
    expect(code == 0 and report["verdict"] == "pass", f"30% refused with --min-run-share 0.5 passes (got {code})")
    expect(0 < c["refused"] < 0.5 * c["cases"] and c["min_run_share"] == 0.5,
           f"its report counts {c['refused']} refused of {c['cases']} and records the gate")
    expect(f"PASS: {c['cases']} cases: {c['ran']} ran, {c['refused']} refused" in read(os.path.join(out, "report.txt")),
           "report.txt's PASS line names the refused cases")
    code, stdout, stderr = run(["check", "--impl", exec_impl("refusing_adapter.py", "--refuse-share", "0.3"),
                                "--cases", "120", "--out", out])
    expect(code == 1, f"the same cache with the default gate 0.8 fails (got {code})")
    for bad in ("1.5", "-0.1", "half", ""):
        code, stdout, stderr = run(["check", "--cases", "5", "--min-run-share", bad, "--out", out])
        expect(code == 2 and "--min-run-share" in stderr, f"--min-run-share '{bad}' is exit 2 naming the flag")

    # 2. replay where nothing ran exits 1.
    fast = os.path.join(SOURCE, "scenarios", "fast")
    html = os.path.join(work, "replay.html")
    code, stdout, stderr = run(["replay", fast, "--impl", exec_impl("refusing_adapter.py", "--refuse-share", "1"),
                                "--report", os.path.join(work, "replay.json"), "--html", html])
    expect(code == 1 and "no run ran" in stdout and "refused" in stdout,
           f"replay with every scenario refused exits 1, saying no run ran (got {code})")
    r = json.loads(read(os.path.join(work, "replay.json")))
    expect(r["verdict"] == "fail" and r["summary"]["ran_runs"] == 0 and r["summary"]["refused_runs"] > 0,
           "its report.json fails with ran_runs 0")
    code, stdout, stderr = run(["replay", os.path.join(fast, "verify-s128.json"), "--impl", "layer"])
    expect(code == 1 and "no run ran" in stdout and "1 skipped" in stdout,
           f"replay whose only scenario the cache's capabilities exclude exits 1 (got {code})")
    code, stdout, stderr = run(["replay", fast])
    expect(code == 0 and "0 refused, 0 skipped" in stdout, "replay of the bundled scenarios on cpu still passes")

    # 3. A run without a verdict withdraws the earlier set.
    out = os.path.join(work, "withdrawn")
    code, _, _ = run(["check", "--cases", "20", "--out", out])
    expect(code == 0 and present(out) == sorted(REPORTS), "a PASS set is written")
    code, _, stderr = run(["check", "--impl", exec_impl("misbehaving_adapter.py", "not-json"), "--cases", "20",
                           "--out", out])
    expect(code == 2, f"a run whose adapter breaks the protocol exits 2 (got {code})")
    expect(present(out) == [], f"... and leaves no earlier report in --out (found {present(out)})")

    code, _, _ = run(["check", "--cases", "20", "--out", out])
    proc = subprocess.Popen([KVCHECK, "check", "--cases", "100000000", "--out", out],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.5)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    expect(present(out) == [], f"a run ended by SIGTERM leaves no earlier report (found {present(out)})")

    code, _, _ = run(["check", "--fault", "window-too-wide", "--cases", "30", "--out", out])
    cx = [n for n in os.listdir(out) if n.startswith("counterexample-")]
    expect(code == 1 and len(cx) == 1, f"a failing run writes its counterexample ({cx})")
    code, _, _ = run(["check", "--cases", "20", "--out", out])
    expect(code == 0 and present(out) == sorted(REPORTS),
           f"a passing run into the same --out removes it (found {present(out)})")

    files = [os.path.join(work, n) for n in ("r.json", "r.xml", "r.html")]
    args = ["--report", files[0], "--junit", files[1], "--html", files[2]]
    code, _, _ = run(["replay", os.path.join(fast, "verify-s128.json")] + args)
    expect(code == 0 and all(os.path.exists(f) for f in files), "replay writes its report files")
    code, _, _ = run(["replay", os.path.join(fast, "verify-s128.json"), "--impl",
                      exec_impl("misbehaving_adapter.py", "not-json")] + args)
    expect(code == 2 and not any(os.path.exists(f) for f in files),
           f"a replay whose adapter breaks the protocol (exit {code}) leaves none of the earlier files")

    # A shard that dies leaves no earlier shard document for merge to take.
    shard_out = os.path.join(work, "shard")
    shard_doc = os.path.join(shard_out, "shard.json")
    code, _, _ = run(["check", "--cases", "20", "--shard", "0/2", "--out", shard_out])
    expect(code == 0 and os.path.exists(shard_doc), f"a shard writes shard.json (exit {code})")
    code, _, _ = run(["check", "--cases", "20", "--shard", "0/2", "--out", shard_out, "--impl",
                      exec_impl("misbehaving_adapter.py", "not-json")])
    expect(code == 2 and not os.path.exists(shard_doc),
           f"a shard whose adapter breaks the protocol (exit {code}) leaves no earlier shard.json")
finally:
    shutil.rmtree(work, ignore_errors=True)

sys.exit(finish())
