#!/usr/bin/env python3
"""Every failure `kvcheck check` reports reproduces, or is labelled.

Before a counterexample is reported it is replayed alone in a fresh cache (a
new adapter process). leaky_adapter.py keeps a row from one case to the next,
so its failures pass alone: the check must still fail (exit 1) but say in the
terminal and in every report that the failure depends on earlier cases, keep
the cases that ran before it, and print a replay command that reproduces it.
A reproducible failure (the ring adapter's window-plus-one bug, a named
fault of the CPU pool) is reported as before: shrunk, no such label.

usage: reproduce_test.py KVCHECK SOURCE_DIR
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import harness
from harness import expect, finish

KVCHECK = os.path.abspath(sys.argv[1])
SOURCE = os.path.abspath(sys.argv[2])
LEAKY = "exec:python3 " + os.path.join(SOURCE, "tests", "cli", "leaky_adapter.py")
RING_BUG = "exec:python3 " + os.path.join(SOURCE, "adapters", "ring_cache.py") + " --bug window-plus-one"


def run(args, cwd):
    return harness.run([KVCHECK] + args, cwd=cwd)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def check_leaky(root):
    work = os.path.join(root, "leaky")
    os.makedirs(work)
    flags = ["check", "--impl", LEAKY, "--cases", "12", "--seed", "3", "--threads", "1"]
    code, out, err = run(flags + ["--out", "out"], work)
    expect(code == 1, f"leaky: the check fails with exit 1 (got {code}; {err.strip()[-300:]})")
    expect("depends on earlier cases" in out, "leaky: the terminal says the failure depends on earlier cases")
    for line in out.split("\n"):
        if "first failure" in line:
            expect(line.split(":", 1)[1].strip() != "", f"leaky: no empty first-failure line ({line!r})")
    report = json.load(open(os.path.join(work, "out", "report.json")))
    check = report["check"]
    expect(check["verdict"] == "fail" and check["failures"] > 0, "leaky: report.json says FAIL")
    dep = check.get("depends_on_earlier_cases")
    expect(isinstance(dep, dict), "leaky: report.json has depends_on_earlier_cases")
    if not isinstance(dep, dict):
        return
    expect(dep["reproduced_with_them"] is True, "leaky: running the cases before it reproduced the failure")
    expect(len(dep["case_seeds_before"]) >= 1 and len(dep["case_seeds_before"]) == len(dep["files_before"]),
           f"leaky: the case seeds before it are kept, one file each ({dep['case_seeds_before']})")
    expect(1 <= len(dep["case_seeds_before"]) <= dep["earlier_cases_run"],
           "leaky: no more cases kept than ran before it")
    for seed, name in zip(dep["case_seeds_before"], dep["files_before"]):
        path = os.path.join(work, name)
        expect(os.path.isfile(path), f"leaky: {name} written")
        if os.path.isfile(path):
            expect(str(seed) in json.load(open(path))["description"], f"leaky: {name} is case seed {seed}")
    expect(report["runs"] and report["runs"][0]["verdict"] == "fail" and report["runs"][0]["first_failure"],
           "leaky: the reported run is the failing one, with its first failure")
    for name in ("report.txt", "junit.xml", "report.html"):
        expect(b"depends on earlier cases" in read(os.path.join(work, "out", name)),
               f"leaky: {name} says the failure depends on earlier cases")
    expect("FAIL" in open(os.path.join(work, "out", "report.txt")).read().split("\n")[-2],
           "leaky: report.txt ends in FAIL")
    # The case alone passes (the label is true) ...
    ce = os.path.join(work, check["counterexample_file"])
    code, _, err = run(["replay", ce, "--impl", LEAKY], work)
    expect(code == 0, f"leaky: the failing case alone passes in a fresh process (exit {code}; {err.strip()[-200:]})")
    # ... and the printed replay command, with the cases before it, reproduces it.
    command = check["replay_command"]
    expect(command.startswith("kvcheck replay ") and dep["files_before"][0] in command,
           f"leaky: the replay command names the cases before it ({command})")
    p = subprocess.run(["sh", "-c", KVCHECK + command[len("kvcheck"):]], cwd=work, capture_output=True, text=True)
    expect(p.returncode == 1, f"leaky: the replay command reproduces the failure (exit {p.returncode}; "
                              f"{p.stderr.strip()[-200:]})")
    # Same seed, same bytes (with one thread, the cases before it are fixed).
    code, _, _ = run(flags + ["--out", "again"], work)
    names = sorted(os.listdir(os.path.join(work, "out")))
    expect(code == 1 and names == sorted(os.listdir(os.path.join(work, "again"))),
           "leaky: a second run writes the same files")
    for name in names:
        if name.endswith(".json") or name.endswith(".txt"):
            expect(read(os.path.join(work, "again", name)).replace(b"again/", b"out/") ==
                   read(os.path.join(work, "out", name)), f"leaky: a second run writes the same {name}")


def check_reproducible(root, label, impl_flags):
    work = os.path.join(root, label)
    os.makedirs(work)
    code, out, err = run(["check"] + impl_flags + ["--cases", "60", "--seed", "2", "--out", "out"], work)
    expect(code == 1, f"{label}: the check fails with exit 1 (got {code}; {err.strip()[-300:]})")
    expect("depends on earlier cases" not in out, f"{label}: no earlier-cases label in the terminal")
    expect("shrunk from" in out, f"{label}: the counterexample is shrunk")
    report = json.load(open(os.path.join(work, "out", "report.json")))
    expect("depends_on_earlier_cases" not in report["check"], f"{label}: report.json has no earlier-cases field")
    expect(report["runs"][0]["first_failure"] != "", f"{label}: the shrunk run has a first failure")
    for name in ("report.txt", "junit.xml", "report.html"):
        expect(b"earlier cases" not in read(os.path.join(work, "out", name)), f"{label}: {name} has no label")
    ce = os.path.join(work, report["check"]["counterexample_file"])
    code, _, _ = run(["replay", ce] + impl_flags, work)
    expect(code == 1, f"{label}: the counterexample fails alone in a fresh cache (exit {code})")


def main():
    root = tempfile.mkdtemp(prefix="kvcheck-reproduce-test-")
    try:
        check_leaky(root)
        check_reproducible(root, "exec window-plus-one", ["--impl", RING_BUG])
        check_reproducible(root, "cpu accept-no-rollback", ["--fault", "accept-no-rollback"])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
