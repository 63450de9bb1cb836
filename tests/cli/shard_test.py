#!/usr/bin/env python3
"""`kvcheck check|sweep --shard I/N` and `kvcheck merge`, end to end.

A run split into 3 shards (run with other thread counts, merged in a shuffled
order) writes byte for byte the reports, counterexample and exit code of one
process on the same seed; a sweep split the same way writes the same JSON,
CSV, table and counterexample files. Missing, duplicated and mismatched
shards are refused with exit 2 and one line naming the shard, and leave the
output directory as it was.

usage: shard_test.py KVCHECK
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


def run(args, cwd):
    return harness.run([KVCHECK] + args, cwd=cwd)


def same_tree(a, b, what):
    """Every file of a and b, byte for byte (and the same names)."""
    names_a = sorted(os.listdir(a))
    expect(names_a == sorted(os.listdir(b)), f"{what}: same files {names_a}")
    for name in names_a:
        pa, pb = os.path.join(a, name), os.path.join(b, name)
        if os.path.isfile(pa) and os.path.isfile(pb):
            with open(pa, "rb") as fa, open(pb, "rb") as fb:
                expect(fa.read() == fb.read(), f"{what}: {name} byte-identical")


def one_error_line(code, err, needle, what):
    lines = err.strip().split("\n")
    expect(code == 2, f"{what}: exit 2 (got {code})")
    expect(len(lines) == 1 and lines[0].startswith("kvcheck error 700 at ") and needle in lines[0],
           f"{what}: one line naming {needle!r} ({err.strip()!r})")


def check_case(root, label, flags, expected_code, merge_flags=()):
    """One process against 3 shards merged, for `kvcheck check FLAGS`
    (MERGE_FLAGS: --impl, which a merge that re-runs a failing case needs)."""
    single = os.path.join(root, label, "single")
    split = os.path.join(root, label, "split")
    os.makedirs(single)
    os.makedirs(split)
    code1, _, err1 = run(["check"] + flags + ["--threads", "2", "--out", "out"], single)
    expect(code1 == expected_code, f"{label}: one process exits {expected_code} (got {code1}; {err1.strip()})")
    for i in range(3):
        code, out, err = run(["check"] + flags + ["--shard", f"{i}/3", "--threads", "1", "--out", f"shard{i}"], split)
        expect(code == 0 and os.path.isfile(os.path.join(split, f"shard{i}", "shard.json")),
               f"{label}: shard {i}/3 written, exit 0 ({err.strip()})")
    code2, _, err2 = run(["merge", "shard2", "shard0", "shard1", "--out", "out"] + list(merge_flags), split)
    expect(code2 == code1, f"{label}: merge exits like one process ({code2} vs {code1}; {err2.strip()})")
    same_tree(os.path.join(single, "out"), os.path.join(split, "out"), f"{label}: merged vs one process")
    return split


def forged(split, label, edit, shards=(0, 1, 2)):
    """Copies of shard0..2 under LABEL0..2, with edit(doc) applied to those in `shards`."""
    names = []
    for i in range(3):
        name = f"{label}{i}"
        shutil.copytree(os.path.join(split, f"shard{i}"), os.path.join(split, name))
        if i in shards:
            path = os.path.join(split, name, "shard.json")
            doc = json.load(open(path))
            edit(doc)
            json.dump(doc, open(path, "w"), indent=2)
        names.append(name)
    return names


def refused_700(split, names, flags, needle, what):
    code, _, err = run(["merge"] + names + ["--out", "out"] + flags, split)
    one_error_line(code, err, needle, what)
    return err


def untrusted_documents(root, split):
    """`merge` runs no command from a file, cross-checks every option against
    the recorded command, refuses impossible tallies and failures that do
    not reproduce (issue 19.2, 18.5). `split` holds 3 shards of a failing
    `--fault accept-no-rollback` run on the CPU pool."""
    shards = ["shard0", "shard1", "shard2"]
    # A built-in cache is a name, not a command: merge takes it from the
    # shards and re-runs the failing case on it, no --impl needed (issue 30
    # item 7); the report is one process's, as with --impl cpu.
    # (The same shards in another directory: reports name --out as given.)
    no_impl = os.path.join(root, "no-impl")
    for name in shards:
        shutil.copytree(os.path.join(split, name), os.path.join(no_impl, name))
    code, _, err = run(["merge"] + shards + ["--out", "out"], no_impl)
    expect(code == 1 and os.path.isfile(os.path.join(no_impl, "out", "report.json")),
           f"no --impl: merge of failing cpu shards re-runs on cpu and reports (exit {code}; {err.strip()})")
    same_tree(os.path.join(split, "out"), os.path.join(no_impl, "out"), "merge without --impl vs --impl cpu")
    refused_700(split, shards, ["--impl", "layer"], "shard0/shard.json: options.impl", "--impl other than the shards'")
    # A shard document that names a command: never run, whatever merge is given.
    marker = os.path.join(split, "PWNED")
    touch = "exec:touch " + marker

    def impl_only(doc):
        doc["options"]["impl"] = touch

    names = forged(split, "impl", impl_only)
    for flags in ([], ["--impl", "cpu"]):
        refused_700(split, names, flags, "impl0/shard.json: options.impl", f"options.impl edited, merge {flags}")

    def impl_and_command(doc):
        doc["options"]["impl"] = touch
        doc["options"]["command"] = doc["options"]["command"].replace("kvcheck check", "kvcheck check --impl " + touch)

    names = forged(split, "cmd", impl_and_command)
    code, _, err = run(["merge"] + names + ["--out", "out"], split)
    expect(code == 2 and "error 100 at --impl" in err,
           f"options.impl and command edited alike, no --impl: refused, asking for --impl ({err.strip()})")
    refused_700(split, names, ["--impl", "cpu"], "cmd0/shard.json: options.impl",
                "options.impl and command edited alike, --impl cpu")
    expect(not os.path.exists(marker), "no command from a shard document ran")

    # Every recorded option agrees with the recorded command line.
    def seed(doc):
        doc["options"]["seed"] = 6

    refused_700(split, forged(split, "seed", seed), ["--impl", "cpu"], "seed0/shard.json: options.seed",
                "options.seed edited in every shard")

    def precision(doc):
        doc["options"]["precision_requested"] = 7
        doc["options"]["command"] += " --precision 7"

    refused_700(split, forged(split, "prec", precision), ["--impl", "cpu"],
                "prec0/shard.json: options.precision_requested", "a precision of 7 bits")

    # Impossible tallies.
    def coverage(doc):
        doc["result"]["coverage_counts"][0] = doc["result"]["cases"] + 1

    refused_700(split, forged(split, "cov", coverage, shards=(1,)), ["--impl", "cpu"],
                "cov1/shard.json: result.coverage_counts[0]", "a coverage count above the case count")

    def negative(doc):
        doc["result"]["skipped"] = -1

    refused_700(split, forged(split, "neg", negative, shards=(2,)), ["--impl", "cpu"],
                "neg2/shard.json: result.skipped", "a negative count")

    def huge(doc):
        doc["result"]["queries"] = 2**63 - 1
        doc["result"]["queries_not_output_checked"] = 0

    refused_700(split, forged(split, "huge", huge, shards=(0, 1)), ["--impl", "cpu"],
                "huge1/shard.json: result.queries", "INT64_MAX counts that overflow when added")

    def unreachable(doc):
        doc["result"]["reachable"] = [False] * len(doc["result"]["reachable"])

    refused_700(split, forged(split, "unreach", unreachable), [],
                "unreach0/shard.json: result.reachable[0]", "every class unreachable with a CPU cache")

    # A claimed failure that does not reproduce is refused, naming the shard.
    passing = os.path.join(root, "pass", "split")

    def claims_failure(doc):
        doc["result"]["failures"] = 1
        doc["result"]["first_failing_case"] = 1  # case 1 is shard 1/3's

    names = forged(passing, "claim", claims_failure, shards=(1,))
    err = refused_700(passing, names, ["--impl", "cpu"], "claim1/shard.json: result.first_failing_case",
                      "a claimed failing case that passes")
    expect("does not reproduce" in err, "a claimed failing case: the message says it does not reproduce")
    # A real failure that depends on earlier cases (leaky_adapter.py).
    leaky = "exec:python3 " + os.path.join(os.path.dirname(os.path.abspath(__file__)), "leaky_adapter.py")
    for i in range(2):
        code, _, err = run(["check", "--impl", leaky, "--cases", "12", "--seed", "3", "--threads", "1",
                            "--shard", f"{i}/2", "--out", f"leak{i}"], split)
        expect(code == 0, f"leaky shard {i}/2 written ({err.strip()[-200:]})")
    code, _, err = run(["merge", "leak0", "leak1", "--out", "out", "--impl", leaky], split)
    one_error_line(code, err, "/shard.json: result.first_failing_case", "a leaky shard's failure")
    expect("does not reproduce" in err, "a leaky shard: the message says its failure does not reproduce")


def main():
    root = tempfile.mkdtemp(prefix="kvcheck-shard-test-")
    try:
        # A failing run: the lowest failing case of the whole run is shrunk once, in the merge.
        split = check_case(root, "fault", ["--fault", "accept-no-rollback", "--cases", "300", "--seed", "5"], 1,
                           ["--impl", "cpu"])
        ce = os.path.join(split, "out", "counterexample-accept-no-rollback-seed5.json")
        expect(os.path.isfile(ce), "fault: the merge wrote the counterexample")
        report = json.load(open(os.path.join(split, "out", "report.json")))
        expect(report["check"]["cases"] == 300 and report["check"]["failures"] > 0,
               "fault: the merged report counts all 300 cases")
        expect("--shard" not in report["context"]["command"] and "--out" not in report["context"]["command"],
               "fault: the recorded command has no --shard or --out")
        # A passing run, with more shards than some cases' residues would need.
        check_case(root, "pass", ["--cases", "200", "--seed", "11"], 0)
        # The production profile travels in the shard documents: 16 cases
        # pass but leave verify_8_drafts unreached (exit 1), in both.
        production = check_case(root, "production", ["--profile", "production", "--cases", "16", "--seed", "4"], 1)
        report = json.load(open(os.path.join(production, "out", "report.json")))
        names = [c["name"] for c in report["check"]["coverage"]]
        expect({"window_4096", "chunk_1024", "verify_8_drafts", "position_100k", "verify_then_other_request",
                "finish_or_reset_with_drafts_pending", "feature:trim", "pair:verify+trim"} <= set(names),
               "production: the merged report has the profile's coverage classes and the cache's features")

        # Refusals: one line naming the shard, exit 2, --out left as it was.
        out = os.path.join(split, "out")
        before = {n: open(os.path.join(out, n), "rb").read() for n in os.listdir(out)}
        code, _, err = run(["merge", "shard0", "shard1", "--out", "out"], split)
        one_error_line(code, err, "shard 2/3", "missing shard")
        code, _, err = run(["merge", "shard0", "shard1", "shard1", "shard2", "--out", "out"], split)
        one_error_line(code, err, "shard1/shard.json", "duplicated shard")
        code, _, _ = run(["check", "--fault", "accept-no-rollback", "--cases", "300", "--seed", "6",
                          "--shard", "1/3", "--out", "other1"], split)
        code, _, err = run(["merge", "shard0", "other1", "shard2", "--out", "out"], split)
        one_error_line(code, err, "other1/shard.json", "different seed")
        expect("options.seed" in err, "different seed: the message names options.seed")
        shutil.copytree(os.path.join(split, "shard2"), os.path.join(split, "version2"))
        doc = json.load(open(os.path.join(split, "version2", "shard.json")))
        doc["tool_version"] = "9.9.9"
        json.dump(doc, open(os.path.join(split, "version2", "shard.json"), "w"))
        code, _, err = run(["merge", "shard0", "shard1", "version2", "--out", "out"], split)
        one_error_line(code, err, "version2/shard.json", "different version")
        code, _, _ = run(["check", "--fault", "accept-no-rollback", "--cases", "300", "--seed", "5",
                          "--shard", "0/4", "--out", "four0"], split)
        code, _, err = run(["merge", "four0", "shard1", "shard2", "--out", "out"], split)
        one_error_line(code, err, "shard1/shard.json", "different shard count")
        code, _, err = run(["merge", "shard0", "shard1", "nothing-here", "--out", "out"], split)
        one_error_line(code, err, "nothing-here/shard.json", "not a shard directory")
        untrusted_documents(root, split)
        after = {n: open(os.path.join(out, n), "rb").read() for n in os.listdir(out)}
        expect(before == after, "refused merges left --out as it was")
        code, _, err = run(["check", "--shard", "3/3", "--out", "x"], split)
        expect(code == 2 and "--shard" in err and len(err.strip().split("\n")) == 1,
               f"--shard 3/3 is refused naming the flag ({err.strip()})")

        # Sweep: 3 shards (columns I mod 3) merged = one process, files and table.
        sweep = ["sweep", "--window", "8,16", "--drafts", "0,3", "--chunk", "1,5", "--order", "both",
                 "--formula", "W + k"]
        single = os.path.join(root, "sweep", "single")
        split = os.path.join(root, "sweep", "split")
        os.makedirs(single)
        os.makedirs(split)
        code1, table1, _ = run(sweep + ["--json", "sweep.json", "--csv", "sweep.csv"], single)
        expect(code1 == 1, f"sweep: the unsafe formula exits 1 (got {code1})")
        for i in range(3):
            code, _, err = run(sweep + ["--shard", f"{i}/3", "--threads", "1", "--out", f"shard{i}"], split)
            expect(code == 0, f"sweep: shard {i}/3 exits 0 ({err.strip()})")
        code2, table2, err = run(["merge", "shard1", "shard2", "shard0", "--json", "sweep.json", "--csv", "sweep.csv"],
                                 split)
        expect(code2 == code1, f"sweep: merge exits like one process ({code2}; {err.strip()})")
        expect(table1 == table2, "sweep: the merged table equals one process's")
        for name in ("sweep.json", "sweep.csv"):
            expect(open(os.path.join(single, name), "rb").read() == open(os.path.join(split, name), "rb").read(),
                   f"sweep: {name} byte-identical")
        same_tree(os.path.join(single, "kvcheck-out", "sweep"), os.path.join(split, "kvcheck-out", "sweep"),
                  "sweep: counterexample files")
        code, _, err = run(["merge", "shard0", "shard1", "shard2", "--json", "x.json", "--out", "o"],
                           os.path.join(root, "fault", "split"))
        expect(code == 2, "merge of check shards refuses --json")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return finish()


if __name__ == "__main__":
    sys.exit(main())
