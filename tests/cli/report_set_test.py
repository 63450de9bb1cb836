#!/usr/bin/env python3
"""A run's output files appear as one set or not at all.

    report_set_test.py KVCHECK

1. Full disk: a passing run leaves its reports in OUT; a failing run into the
   same OUT whose writes fail (RLIMIT_FSIZE below report.html's size, the
   way ENOSPC fails them) must exit 1 (the property verdict, not a write
   error's 2), say so on stderr, and leave neither its own files nor the
   earlier PASS reports, nor any temporary file.
2. The same for `replay --report/--junit/--html`.
3. Concurrency: 12 pairs of runs with different seeds into one OUT at the
   same time; after each pair the four reports name one seed.
"""
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import harness
from harness import fail, finish

KVCHECK = sys.argv[1]


def limited(size):
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    return apply


def run(args, preexec=None):
    return harness.run([KVCHECK] + args, preexec_fn=preexec)


def leftovers(d):
    return sorted(n for n in os.listdir(d) if n != ".kvcheck-lock")


def seeds_in(d):
    with open(os.path.join(d, "report.json"), encoding="utf-8") as f:
        found = {"report.json": str(json.load(f)["context"]["seed"])}
    for name, pattern in (("junit.xml", r'name="seed" value="(\d+)"'), ("report.txt", r"seed (\d+)"),
                          ("report.html", r"seed (\d+)")):
        with open(os.path.join(d, name), encoding="utf-8") as f:
            m = re.search(pattern, f.read())
        found[name] = m.group(1) if m else None
    return found


work = tempfile.mkdtemp(prefix="kvcheck-report-set-")
try:
    # 1. check: an earlier PASS set, then a failing run whose writes fail.
    out = os.path.join(work, "out")
    code, _, err = run(["check", "--cases", "20", "--seed", "1", "--out", out])
    if code != 0 or "report.json" not in leftovers(out):
        fail("the passing check did not write its reports (exit %d): %s" % (code, err))
    code, stdout, err = run(["check", "--cases", "20", "--seed", "1", "--fault", "slot-no-state-offset",
                             "--out", out], preexec=limited(4096))
    if code != 1:
        fail("a failing check whose reports cannot be written exited %d, expected 1 (the verdict)" % code)
    if "kvcheck error" not in err or "the verdict (FAIL) stands" not in err:
        fail("no write error and verdict on stderr: %r" % err)
    if "failing" not in stdout:
        fail("the check's summary was not printed: %r" % stdout)
    if leftovers(out):
        fail("files left after the failed write (stale PASS reports or half a set): %s" % leftovers(out))

    # 2. replay: the same with named files.
    scen = os.path.join(work, "scen.json")
    subprocess.run([KVCHECK, "check", "--cases", "20", "--seed", "1", "--fault", "slot-no-state-offset",
                    "--out", os.path.join(work, "ce")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ce = [n for n in os.listdir(os.path.join(work, "ce")) if n.startswith("counterexample")]
    if len(ce) != 1:
        fail("no counterexample to replay: %s" % ce)
    else:
        shutil.copy(os.path.join(work, "ce", ce[0]), scen)
        rdir = os.path.join(work, "replay")
        os.mkdir(rdir)
        files = ["--report", os.path.join(rdir, "r.json"), "--junit", os.path.join(rdir, "j.xml"),
                 "--html", os.path.join(rdir, "h.html")]
        code, _, err = run(["replay", scen] + files)  # no fault: passes, writes three files
        if code != 0 or len(leftovers(rdir)) != 3:
            fail("replay did not write its three files (exit %d): %s" % (code, leftovers(rdir)))
        code, _, err = run(["replay", scen, "--fault", "slot-no-state-offset"] + files, preexec=limited(2048))
        if code != 1 or "the verdict (FAIL) stands" not in err:
            fail("failing replay with unwritable files: exit %d, stderr %r" % (code, err))
        if leftovers(rdir):
            fail("replay left files after the failed write: %s" % leftovers(rdir))

    # 3. concurrent runs into one directory.
    cout = os.path.join(work, "concurrent")
    for pair in range(12):
        a, b = str(100 + 2 * pair), str(101 + 2 * pair)
        procs = [subprocess.Popen([KVCHECK, "check", "--cases", "15", "--seed", s, "--out", cout],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for s in (a, b)]
        for p in procs:
            _, err = p.communicate()
            if p.returncode not in (0, 1):  # 15 cases may leave a coverage class unmet: exit 1
                fail("concurrent check exited %d: %s" % (p.returncode, err))
        seeds = seeds_in(cout)
        if len(set(seeds.values())) != 1 or seeds["report.json"] not in (a, b):
            fail("pair %d: a mixed set %s" % (pair, seeds))
        temps = [n for n in os.listdir(cout) if ".tmp-" in n]
        if temps:
            fail("pair %d: temporary files left: %s" % (pair, temps))
finally:
    shutil.rmtree(work, ignore_errors=True)

sys.exit(finish())
print("ok: failed writes leave nothing (check, replay), 12 concurrent pairs never mixed")
