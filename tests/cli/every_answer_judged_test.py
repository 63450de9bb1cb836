#!/usr/bin/env python3
"""Every answer judged, every failure a counterexample (issue 30 items 1-4).

    every_answer_judged_test.py KVCHECK SOURCE_DIR

1. A begin's slot events go through the shadow map as any step's: a free of
   a still-visible row answered at a begin fails as the same free answered
   in the request's first step does; `--record` keeps it in the trace and
   `kvcheck audit` of that trace fails alike; the bundled prefix cache
   (whose begins answer their evictions) still passes, live and audited.
2. A well-formed answer naming a slot the cache does not have (-4, past the
   ring) fails its case at the step, naming the layer and the field; the
   case is shrunk to a counterexample that replays (exit 1, never exit 2).
3. Side by side, two caches that crash alike do not agree: `--against`
   itself and `--repeat-bitwise` fail, and the summary counts such cases.
4. report.json lists every failing case's seed (with the count left out),
   says `observed` for a passing check too, and `slots` for a
   bookkeeping-only cache.
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
HERE = os.path.dirname(os.path.abspath(__file__))
FAST = os.path.join(SOURCE, "scenarios", "fast", "prefill-w3-s5-store-then-load-4-6.json")


def run(args):
    return harness.run([KVCHECK] + args)


impl = harness.exec_impl
twisted = harness.twisted


def adapter(name, *flags):
    return harness.bundled_adapter(SOURCE, name, *flags)


def report(out_dir):
    with open(os.path.join(out_dir, "report.json")) as f:
        return json.load(f)


def first_failure(stdout):
    lines = [l.strip() for l in stdout.splitlines() if l.strip().startswith("first failure: ")]
    return lines[0][len("first failure: "):] if lines else ""


def item_1(work):
    """A begin's frees are judged: at the begin and in the first step alike."""
    freed = "freed 1 rows still visible"
    at = {}
    for twist in ("begin-frees-visible", "step-frees-visible"):
        out_dir = os.path.join(work, twist)
        code, out, err = run(["check", "--impl", twisted(twist), "--cases", "20", "--seed", "1", "--threads", "1",
                              "--out", out_dir])
        at[twist] = first_failure(out)
        expect(code == 1 and freed in at[twist],
               f"{twist}: exit 1, first failure '{freed}' (got {code}: {at[twist]!r} {err[:200]})")
    expect(at["begin-frees-visible"].endswith("(freed by the begin)"),
           f"the begin's free is named as the begin's: {at['begin-frees-visible']!r}")
    # --record and audit: the begin record keeps its free, and the audit fails at it too.
    shrunk = os.path.join(work, "begin-frees-visible", "counterexample-exec-seed1.json")
    trace = os.path.join(work, "begin-frees.trace")
    code, out, _ = run(["replay", shrunk, "--impl", twisted("begin-frees-visible"), "--record", trace])
    live = first_failure(out)
    expect(code == 1 and live == at["begin-frees-visible"], f"replay of the counterexample fails alike (got {code}: {live!r})")
    with open(trace) as f:
        begins = [json.loads(l) for l in f if '"kind":"begin"' in l]
    expect(any("freed" in b for b in begins), f"the trace's begin record keeps its freed slots: {begins}")
    code, out, err = run(["audit", trace])
    expect(code == 1 and first_failure(out) == live,
           f"audit of the recorded trace fails as the live run (got {code}: {first_failure(out)!r} {err[:200]})")
    # The bundled prefix cache, whose begins answer their evictions' frees,
    # still passes live and audited.
    prefix = adapter("paged_cache.py", "--prefix-cache")
    trace = os.path.join(work, "prefix.trace")
    code, out, err = run(["check", "--impl", prefix, "--profile", "prefix", "--cases", "60", "--seed", "1",
                          "--threads", "1", "--record", trace, "--out", os.path.join(work, "prefix")])
    expect(code == 0, f"paged_cache.py --prefix-cache passes (got {code}: {out[-300:]} {err[:200]})")
    code, out, err = run(["audit", trace])
    expect(code == 0, f"its trace passes the audit (got {code}: {out[-300:]} {err[:200]})")



def item_2(work):
    """An impossible slot in a well-formed answer fails the case, shrunk."""
    out_dir = os.path.join(work, "minus-four")
    code, out, err = run(["check", "--impl", twisted("decode-minus-four"), "--cases", "30", "--seed", "1",
                          "--out", out_dir])
    line = first_failure(out)
    expect(code == 1 and line.startswith("step 0 (decode) layer 0: answer.written[0]: slot -4 is not a slot"),
           f"slot -4: exit 1, first failure names the step, layer and field (got {code}: {line!r} {err[:200]})")
    shrunk = os.path.join(out_dir, "counterexample-exec-seed1.json")
    expect(os.path.exists(shrunk) and report(out_dir)["check"]["failures"] > 1,
           "slot -4: a counterexample is written, and every case with a decode fails")
    if os.path.exists(shrunk):
        with open(shrunk) as f:
            steps = json.load(f)["steps"]
        expect(len(steps) == 1, f"slot -4: shrunk to the one decode ({len(steps)} steps)")
        code, out, _ = run(["replay", shrunk, "--impl", twisted("decode-minus-four")])
        expect(code == 1 and first_failure(out) == line, f"slot -4: the counterexample replays (got {code})")
    code, out, err = run(["replay", FAST, "--impl", twisted("written-past-pool")])
    expect(code == 1 and "answer.written[0]: slot 5 is not a slot of the cache" in first_failure(out),
           f"a slot past the ring: exit 1 naming it (got {code}: {first_failure(out)!r} {err[:200]})")



def item_3(work):
    """Side by side: crashing alike is not agreeing. (Few cases: every crash
    costs a restart of the adapter, each case and shrink run two.)"""
    crash = impl(os.path.join(HERE, "misbehaving_adapter.py"), "crash")
    for name, flags in (("against", ["--against", crash]), ("repeat", ["--repeat-bitwise"])):
        out_dir = os.path.join(work, "crash-" + name)
        code, out, err = run(["check", "--impl", crash, *flags, "--cases", "3", "--seed", "1",
                              "--no-coverage-gate", "--out", out_dir])
        expect(code == 1, f"{name}: two caches crashing alike fail (got {code}: {out[-400:]} {err[:200]})")
        expect("cases where both crashed or refused (not agreements)" in out,
               f"{name}: the summary counts the cases both crashed in: {out[-400:]}")
        if os.path.exists(os.path.join(out_dir, "report.json")):
            side = report(out_dir)["check"]["side_by_side"]
            expect(side.get("cases_both_stopped") == 3, f"{name}: cases_both_stopped 3, got {side.get('cases_both_stopped')}")
            expect(any("both-stopped" in d for d in side["differences"]), f"{name}: shown as both-stopped: {side['differences']}")



def item_4(work):
    """Every failing seed, observed in every report, slots for bookkeeping-only."""
    out_dir = os.path.join(work, "passing")
    code, _, _ = run(["check", "--impl", "cpu", "--cases", "10", "--no-coverage-gate", "--out", out_dir])
    check = report(out_dir)["check"]
    expect(code == 0 and check.get("observed") == "slots+outputs" and check.get("failing_case_seeds") == [],
           f"a passing check says observed slots+outputs and lists no failing seed: {check.get('observed')!r}")
    out_dir = os.path.join(work, "free-early")
    code, out, _ = run(["check", "--impl", adapter("paged_cache.py", "--bug", "free-early"), "--cases", "60",
                        "--seed", "1", "--out", out_dir])
    check = report(out_dir)["check"]
    seeds = check.get("failing_case_seeds", [])
    expect(code == 1 and check["failures"] > 1 and len(seeds) == check["failures"] and
           check.get("failing_case_seeds_omitted") == 0 and seeds[:1] == [check["failing_case_seed"]],
           f"every failing seed is listed, the reported one first: {check['failures']} failures, {seeds[:4]}")
    if len(seeds) > 1:
        code, _, _ = run(["check", "--impl", adapter("paged_cache.py", "--bug", "free-early"), "--case-seed",
                          str(seeds[-1]), "--out", os.path.join(work, "last-seed")])
        expect(code == 1, f"the last listed seed fails again with --case-seed (got {code})")
    out_dir = os.path.join(work, "no-outputs")
    code, out, _ = run(["check", "--impl", adapter("paged_cache.py", "--no-outputs", "--bug", "free-early"),
                        "--cases", "60", "--seed", "1", "--out", out_dir])
    r = report(out_dir)
    expect(code == 1 and r["check"].get("observed") == "slots" and r["runs"][0]["observed"] == "slots",
           f"a bookkeeping-only cache is observed as slots: {r['check'].get('observed')!r}, "
           f"{r['runs'][0]['observed']!r}")


work = tempfile.mkdtemp(prefix="kvcheck-answers-")
try:
    for item in (item_1, item_2, item_3, item_4):
        try:
            item(work)
        except (OSError, KeyError, IndexError, ValueError) as e:  # a report or file the run did not write
            harness.fail(f"{item.__name__}: {type(e).__name__}: {e}")
finally:
    shutil.rmtree(work, ignore_errors=True)
sys.exit(finish())
