#!/usr/bin/env python3
"""`mpirun -n 3 --oversubscribe kvcheck check ...` against one process.

Rank r runs the cases r mod 3 and rank 0 writes the report: the same bytes
(reports and counterexample) and exit code as one process on the same seed.
A rank that fails (its exec adapter exits) makes the run exit 2 with one line
naming the rank, and a rank killed by a signal makes mpirun fail naming the
rank; in both cases no report is written. Exits 77 (ctest: skipped) when
kvcheck was built without MPI.

usage: mpi_test.py KVCHECK MPIEXEC|-
"""
import os
import shutil
import subprocess
import sys
import tempfile

import harness
from harness import expect, finish

KVCHECK = os.path.abspath(sys.argv[1])
MPIEXEC = sys.argv[2]
HERE = os.path.dirname(os.path.abspath(__file__))

if MPIEXEC == "-":
    print("kvcheck was configured without MPI (openmpi-bin, libopenmpi-dev, libboost-mpi-dev): skipped")
    sys.exit(77)

# CI may run as root, and the machine has 2 cores for 3 ranks.
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")


def run(args, cwd, ranks=None):
    command = ([MPIEXEC, "-n", str(ranks), "--oversubscribe", KVCHECK] if ranks else [KVCHECK]) + args
    return harness.run(command, cwd=cwd, env=ENV)


def files(d):
    return {n: open(os.path.join(d, n), "rb").read() for n in sorted(os.listdir(d))} if os.path.isdir(d) else {}


def main():
    root = tempfile.mkdtemp(prefix="kvcheck-mpi-test-")
    try:
        for label, flags, expected in (
                ("fault", ["--fault", "accept-no-rollback", "--cases", "300", "--seed", "5"], 1),
                ("pass", ["--cases", "200", "--seed", "11"], 0)):
            single = os.path.join(root, label, "single")
            ranks = os.path.join(root, label, "mpi")
            os.makedirs(single)
            os.makedirs(ranks)
            code1, _, _ = run(["check"] + flags + ["--threads", "1", "--out", "out"], single)
            code2, out2, err2 = run(["check"] + flags + ["--threads", "1", "--out", "out"], ranks, ranks=3)
            expect(code1 == expected and code2 == expected,
                   f"{label}: one process and 3 ranks exit {expected} ({code1}, {code2}; {err2.strip()[:300]})")
            expect("on 3 MPI ranks" in out2, f"{label}: rank 0 reports 3 ranks")
            a, b = files(os.path.join(single, "out")), files(os.path.join(ranks, "out"))
            expect(len(a) >= 4 and list(a) == list(b), f"{label}: the same files {list(a)}")
            for name in a:
                expect(a[name] == b.get(name), f"{label}: {name} byte-identical")

        # A sweep splits with --shard, not over ranks: refused, not run R times.
        code, _, err = run(["sweep", "--window", "8", "--drafts", "0", "--chunk", "1", "--order", "both"], root, ranks=2)
        expect(code == 2 and "kvcheck error 100 at mpirun: sweep does not run over MPI ranks" in err,
               f"sweep under mpirun: refused with exit 2 ({code})")

        # A rank whose adapter fails: exit 2, one kvcheck line naming rank 1, no report.
        work = os.path.join(root, "failing-rank")
        os.makedirs(work)
        adapter = "exec:python3 " + os.path.join(HERE, "rank_adapter.py") + " fail"
        code, _, err = run(["check", "--impl", adapter, "--cases", "30", "--threads", "1", "--out", "out"], work, ranks=3)
        ours = [l for l in err.split("\n") if l.startswith("kvcheck error")]
        expect(code == 2, f"failing rank: exit 2 (got {code})")
        expect(len(ours) == 1 and ours[0].startswith("kvcheck error 700 at rank 1 of 3:"),
               f"failing rank: one line naming rank 1 ({ours})")
        expect(files(os.path.join(work, "out")) == {}, "failing rank: no report written")

        # A rank killed by a signal: mpirun ends the job, names the rank and fails; nothing is written.
        work = os.path.join(root, "killed-rank")
        os.makedirs(work)
        adapter = "exec:python3 " + os.path.join(HERE, "rank_adapter.py") + " kill"
        code, _, err = run(["check", "--impl", adapter, "--cases", "30", "--threads", "1", "--out", "out"], work, ranks=3)
        expect(code != 0 and code != 1, f"killed rank: the run fails, not a verdict (exit {code})")
        expect("rank 1" in err, "killed rank: mpirun names rank 1")
        expect(files(os.path.join(work, "out")) == {}, "killed rank: no report written")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
