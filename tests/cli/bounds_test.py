#!/usr/bin/env python3
"""Forged inputs are refused up front, files are written whole, flags are strict (issue 19).

    bounds_test.py KVCHECK SOURCE_DIR

Every forged file is made here, small: a few hundred bytes that used to ask
for gigabytes or minutes. Each must end quickly with exit 2 and the typed
error naming the field that drives it (300 work, 302 memory, 100 usage),
and nothing may end in exit 3 (an internal error). Then the output rules:
two outputs naming one file are refused before any work, --record is
written with the reports as one set (a write failure keeps a FAIL's exit 1
and leaves no half trace), and numeric flags are decimal only.
"""
import json
import os
import resource
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


def run(args, timeout=120, preexec=None, address_space=4 << 30):
    """kvcheck ARGS under a 4 GiB address-space limit: exit code, output, seconds."""
    def limits():
        # AddressSanitizer reserves terabytes of shadow address space: the
        # address-space limit is the Release tree's (memory bounds are
        # judged there; the sanitizer run judges the code paths).
        if os.environ.get("KVCHECK_SANITIZED") != "1":
            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
        if preexec:
            preexec()
    start = time.monotonic()
    code, out, err = harness.run([KVCHECK] + args, timeout=timeout, preexec_fn=limits)
    return code, out + err, time.monotonic() - start


def write_lines(path, records):
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    return path


def refused(what, args, error, where, seconds=10):
    code, text, took = run(args)
    expect(code == 2 and ("kvcheck error %d at %s" % (error, where)) in text and took < seconds,
           "%s: exit %d in %.1f s, error %d at %s (%s)" % (what, code, took, error, where, text.strip()[-200:]))


CACHE = {"q_heads": 1, "kv_heads": 1, "head_dim": 1, "shared_row": False, "format": "f64",
         "rope": {"style": "none"}}
DECODE = {"step": 0, "layer": 0, "kind": "decode", "request": 0, "state": 0, "position": 0, "rows": 1,
          "written": [0], "read": [[0]]}


def header(name, **extra):
    h = {"kvcheck_trace": 1, "name": name, "window": {"param": 4, "convention": "keys"}, "capacity": 4,
         "addressing": "ring"}
    h.update(extra)
    return h


def scenario(rows, window, ring_rows):
    return {"schema_version": 1, "name": "forged", "description": "forged by bounds_test.py",
            "cache": {"window": window, "window_convention": "keys", "ring_rows": ring_rows, "states": 1,
                      "q_heads": 1, "kv_heads": 1, "head_dim": 1, "shared_row": False, "format": "f64",
                      "rope": {"style": "none", "rotary_dims": 0, "base": 10000.0}, "layers": 1,
                      "softmax_scale": None, "sink_logit": None},
            "data": {"seed": 0}, "requests": [{"id": 0, "state": 0}],
            "steps": [{"kind": "prefill", "request": 0, "rows": rows, "order": "store_then_load"}]}


work = tempfile.mkdtemp(prefix="kvcheck-bounds-")
try:
    w = lambda name: os.path.join(work, name)

    # --- audit: bounded by estimate -------------------------------------
    n = 1 << 26
    reads = write_lines(w("reads.jsonl"), [
        {"kvcheck_trace": 1, "name": "r", "window": {"param": n, "convention": "keys"}, "addressing": "paged"},
        {"step": 0, "layer": 0, "kind": "decode", "request": 0, "state": 0, "position": 0, "rows": 1,
         "written": [0], "block_table": {"blocks": [0], "block_size": n, "seq_lens": [n]}}])
    expect(os.path.getsize(reads) < 300, "the block-table trace is under 300 bytes")
    # Its reads' memory (2^26 * 136 bytes) is refused before any is expanded;
    # its work only past a --work-limit the user sets (issue 30 item 5).
    refused("audit: one decode whose block table expands to 2^26 reads, --memory-limit 4G",
            ["audit", reads, "--memory-limit", "4G"], 302, "line 2: block_table.seq_lens")
    refused("audit: the same under --work-limit 4M", ["audit", reads, "--work-limit", "4M"], 300,
            "line 2: block_table.seq_lens")

    # A tiny trace whose one decode reads 2^20 slots (a block table over a
    # 2^20-key window, under the work bound), all but one of them extra: the
    # report lists 256 entries per list and counts the rest (it used to list
    # every one: 70 MB from 250 bytes).
    n = 1 << 20
    many_reads = write_lines(w("many-reads.jsonl"), [
        {"kvcheck_trace": 1, "name": "m", "window": {"param": n, "convention": "keys"}, "addressing": "paged"},
        {"step": 0, "layer": 0, "kind": "decode", "request": 0, "state": 0, "position": 0, "rows": 1,
         "written": [0], "block_table": {"blocks": [0], "block_size": n, "seq_lens": [n]}}])
    report = w("many-reads-report.json")
    html = w("many-reads.html")
    code, text, took = run(["audit", many_reads, "--report", report, "--html", html], timeout=300)
    size = os.path.getsize(report) if os.path.exists(report) else -1
    expect(code == 1 and 0 < size < (1 << 20),
           "audit: a 2^20-slot read list fails in a report under 1 MB (exit %d, %d bytes, %.1f s)" % (code, size, took))
    if size > 0:
        query = json.load(open(report))["runs"][0]["steps"][0]["queries"][0]
        expect(len(query["extra_reads"]) == 256 and query["omitted"]["extra_reads"] == n - 1 - 256,
               "... listing 256 extra reads and counting the other %d (%s)" % (n - 1 - 256, query.get("omitted")))

    wide = dict(CACHE, head_dim=2**31 - 1)
    refused("audit: head_dim 2^31-1 and no rows",
            ["audit", write_lines(w("head_dim.jsonl"), [header("h", cache=wide)])], 302, "cache.head_dim")
    many = dict(CACHE, q_heads=2**31 - 1)
    refused("audit: q_heads 2^31-1", ["audit", write_lines(w("q_heads.jsonl"), [header("q", cache=many), DECODE])],
            302, "cache.q_heads")
    refused("audit: --memory-limit 1K", ["audit", os.path.join(SOURCE, "traces", "paged-engine-ok.jsonl"),
                                          "--memory-limit", "1K"], 302, "")

    capacity = write_lines(w("capacity.jsonl"), [header("c", capacity=2**40 - 1), DECODE])
    code, text, took = run(["audit", capacity])
    expect(code in (0, 1, 2) and took < 10,
           "audit: capacity 2^40-1 ends in %.1f s with exit %d, not 3 (%s)" % (took, code, text.strip()[-160:]))
    # The HTML report draws what the trace touched, not the capacity (issue
    # 30 item 6: it classified 2^40 slots, exit 3 with no message under 3 GiB).
    page = w("capacity.html")
    code, text, took = run(["audit", capacity, "--html", page], address_space=3 << 30)
    size = os.path.getsize(page) if os.path.exists(page) else -1
    expect(code in (0, 1) and took < 10 and 0 < size < (1 << 20),
           "audit --html: capacity 2^40-1 under a 3 GiB address space ends in %.1f s with exit %d and a %d-byte "
           "page (%s)" % (took, code, size, text.strip()[-160:]))

    # --- replay: work refused before it starts ------------------------------
    prefill = w("prefill.json")
    with open(prefill, "w", encoding="utf-8") as f:
        json.dump(scenario(8192, 8192, 8192), f, separators=(",", ":"))
    expect(os.path.getsize(prefill) < 500, "the prefill scenario is under 500 bytes")
    refused("replay: one 8192-row prefill over an 8192-row window, --work-limit 4M",
            ["replay", prefill, "--work-limit", "4M"], 300, "steps[0].rows")
    # Without a limit a long replay runs: it says so first, with its estimates
    # (a 3000-row prefill over a 3000-row window, 4.5 M reads, over 2^22).
    announced = w("announced.json")
    with open(announced, "w", encoding="utf-8") as f:
        json.dump(scenario(3000, 3000, 3000), f, separators=(",", ":"))
    limit_as = None if os.environ.get("KVCHECK_SANITIZED") == "1" else \
        (lambda: resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30)))
    p = subprocess.Popen([KVCHECK, "replay", announced], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         preexec_fn=limit_as)
    try:
        first = p.stderr.readline()
    finally:
        p.kill()
        p.wait()
    expect(first.startswith("kvcheck replay: about 4.5e+06 reads, estimated peak memory ")
           and "--work-limit ROWS refuses such runs" in first,
           "replay: with no --work-limit a 3000-row prefill over a 3000-row window runs, announced (%r)" % first)

    # An exec engine holds its own slots: a ring of 2^30 rows is not charged to kvcheck.
    big_ring = w("big-ring.json")
    with open(big_ring, "w", encoding="utf-8") as f:
        json.dump(scenario(4, 8, 1 << 30), f)
    adapter = "exec:python3 " + os.path.join(SOURCE, "adapters", "ring_cache.py")
    code, text, took = run(["replay", big_ring, "--impl", adapter, "--memory-limit", "1G"], timeout=60)
    expect(code != 3 and "kvcheck error 302" not in text,
           "replay on exec: ring_rows 2^30 is not charged as kvcheck's pool (exit %d: %s)" % (code, text.strip()[-160:]))
    code, text, took = run(["replay", big_ring, "--memory-limit", "1G"])
    expect(code == 2 and "kvcheck error 302 at cache.ring_rows" in text,
           "replay on cpu: the same ring is charged as kvcheck's pool (exit %d)" % code)

    # --- sweep and merge ------------------------------------------------------
    refused("sweep --window 1:40000 --drafts 0:16 --chunk 1:256",
            ["sweep", "--window", "1:40000", "--drafts", "0:16", "--chunk", "1:256", "--memory-limit", "16G"],
            302, "--window")
    refused("sweep --window 1:4000 --drafts 0:16 --chunk 1:64 --work-limit 16G (fits in memory, hours of probes)",
            ["sweep", "--window", "1:4000", "--drafts", "0:16", "--chunk", "1:64", "--memory-limit", "16G",
             "--work-limit", "16G"], 300, "--window")
    refused("check --cases 100000 --work-limit 1M", ["check", "--cases", "100000", "--work-limit", "1M", "--out",
                                                     w("work")], 300, "--cases")
    shard = w("shard0")
    code, text, _ = run(["sweep", "--window", "8:16:8", "--drafts", "0:1", "--chunk", "1", "--shard", "0/1",
                         "--out", shard])
    expect(code == 0, "a one-shard sweep runs (exit %d)" % code)
    refused("merge --memory-limit 1K", ["merge", shard, "--memory-limit", "1K", "--out", w("merged")], 302, "")

    # --- strict flags --------------------------------------------------------
    for value in ("0x10", "1e1", "inf", " 5", "+5"):
        refused("--step-timeout %r" % value, ["replay", prefill, "--step-timeout", value], 100, "--step-timeout")
    refused("--cases 0x10", ["check", "--cases", "0x10", "--out", w("flags")], 100, "--cases")
    refused("--seed 2^64", ["check", "--seed", "18446744073709551616", "--out", w("flags")], 100, "--seed")

    # --- whole files ---------------------------------------------------------
    small = w("small.json")
    with open(small, "w", encoding="utf-8") as f:
        json.dump(scenario(4, 8, 8), f)
    same = w("same-file")
    refused("replay --report F --junit F --html F",
            ["replay", small, "--report", same, "--junit", same, "--html", same], 100, "--junit")
    expect(not os.path.exists(same), "nothing was written at F")
    out = w("out")
    refused("check --record OUT/report.json",
            ["check", "--cases", "5", "--out", out, "--record", os.path.join(out, "report.json")], 100, "--record")
    expect(not os.path.exists(os.path.join(out, "report.json")), "check ran nothing into OUT")
    refused("audit --text F --report ./F", ["audit", os.path.join(SOURCE, "traces", "paged-engine-ok.jsonl"),
                                             "--text", same, "--report", os.path.join(work, ".", "same-file")],
            100, "--report")

    # --record with the reports as one set: a failing check whose writes fail
    # (file size limit, as a full disk) exits 1 (its verdict) and leaves no
    # trace cut mid-record.
    def limited():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
    trace = w("check.jsonl")
    code, text, _ = run(["check", "--cases", "30", "--fault", "window-too-wide", "--out", w("fail-out"),
                         "--record", trace], timeout=300, preexec=limited)
    expect(code == 1 and "the verdict (FAIL) stands" in text,
           "check --record on a full disk exits 1 with the verdict (exit %d: %s)" % (code, text.strip()[-160:]))
    expect(not os.path.exists(trace), "no half-written trace is left")
    code, text, _ = run(["check", "--cases", "30", "--fault", "window-too-wide", "--out", w("fail-out"),
                         "--record", trace], timeout=300)
    expect(code == 1 and os.path.exists(trace), "with room, the failing check writes its trace (exit %d)" % code)
    code, text, _ = run(["audit", trace])
    expect(code == 1, "the recorded counterexample fails its audit (exit %d)" % code)
    refused("--record into a missing directory", ["replay", small, "--record", w("missing/t.jsonl")], 400, "--record")
finally:
    shutil.rmtree(work, ignore_errors=True)
sys.exit(finish())
