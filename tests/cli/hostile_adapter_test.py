#!/usr/bin/env python3
"""No exec adapter can hang kvcheck or outlive it (issue 19.1).

Usage: hostile_adapter_test.py KVCHECK_BINARY SOURCE_DIR

Runs kvcheck against tests/cli/hostile_adapter.py in each hostile mode (and
kvcheck itself killed by SIGINT, SIGTERM, SIGHUP mid-run), each run with a
time limit. Every process kvcheck starts inherits a marker in its
environment; after kvcheck has exited, no process may carry it. Prints, per
behaviour, the exit status, the time to exit, kvcheck's peak memory and the
processes left behind.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import expect, finish  # noqa: E402

KVCHECK, ROOT = sys.argv[1], sys.argv[2]
ADAPTER = os.path.join(ROOT, "tests", "cli", "hostile_adapter.py")
MARKER_NAME = b"KVCHECK_HOSTILE_MARKER="
rows = []  # the summary table


def marked(marker):
    """Pids of live processes whose environment carries the marker."""
    entry = MARKER_NAME + marker.encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as f:
                if entry in f.read().split(b"\0"):
                    found.append(int(name))
        except OSError:
            pass
    return found


def kill_marked(marker):
    for pid in marked(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def default_signals():
    """In kvcheck's child before exec: SIGINT, SIGTERM and SIGHUP back to
    their default action. A CI runner or `nohup` may start this test with
    SIGHUP ignored (and a shell's background job with SIGINT ignored); kvcheck
    keeps an inherited SIG_IGN, as a program under nohup must, so the test
    gives kvcheck the disposition whose handling it checks."""
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)


def run(name, args, limit, tmp, sig=None, want_code=None, want_err=()):
    """Runs kvcheck ARGS with a fresh marker; with `sig`, sends it once the
    adapters are running. Checks the exit status, the stderr lines, the time
    limit and that no marked process is left."""
    marker = "%s-%d-%d" % (name.replace(" ", "-"), os.getpid(), len(rows))
    env = dict(os.environ)
    env[MARKER_NAME[:-1].decode()] = marker
    out_path = os.path.join(tmp, marker + ".out")
    err_path = os.path.join(tmp, marker + ".err")
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        start = time.monotonic()
        p = subprocess.Popen([KVCHECK] + args, stdout=out, stderr=err, env=env, preexec_fn=default_signals)
        if sig is not None:
            # Mid-run: two adapters (one per thread) and a setsid sleeper up.
            while time.monotonic() - start < limit and len([x for x in marked(marker) if x != p.pid]) < 3:
                time.sleep(0.02)
            start = time.monotonic()
            p.send_signal(sig)
        status = rusage = None
        while time.monotonic() - start < limit:
            pid, status, rusage = os.wait4(p.pid, os.WNOHANG)
            if pid == p.pid:
                break
            status = None
            time.sleep(0.005)
        seconds = time.monotonic() - start
        if status is None:
            p.kill()
            _, status, rusage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
    left = marked(marker)
    kill_marked(marker)
    stderr = open(err_path, errors="replace").read()
    code = p.returncode
    timed_out = seconds >= limit
    peak_mb = rusage.ru_maxrss / 1024.0  # kvcheck's, or a reaped adapter's if larger
    cpu = rusage.ru_utime + rusage.ru_stime  # kvcheck's and its reaped adapters'
    rows.append((name, code, seconds, cpu, peak_mb, len(left), timed_out))
    print("%s: exit %s after %.2f s (%.2f s CPU), peak %.0f MB, %d process(es) left%s" %
          (name, code, seconds, cpu, peak_mb, len(left), " (TIMED OUT)" if timed_out else ""))
    expect(not timed_out, "%s: kvcheck exits within %d s" % (name, limit))
    expect(not left, "%s: no process left behind (found %s)" % (name, left))
    if want_code is not None:
        codes = want_code if isinstance(want_code, tuple) else (want_code,)
        expect(code in codes, "%s: exit status %s (got %s)" % (name, want_code, code))
    for text in want_err:
        expect(text in stderr, "%s: stderr says %r%s" % (name, text, "" if text in stderr else "\n" + stderr[-1500:]))
    return cpu, peak_mb


def scenario(path, name, cache, steps):
    base = json.load(open(os.path.join(ROOT, "scenarios", "fast", "prefill-w3-s5-store-then-load-4-6.json")))
    base["name"] = name
    base["description"] = "hostile adapter test: " + name
    base["cache"].update(cache)
    base["steps"] = steps
    base.pop("expect", None)
    with open(path, "w") as f:
        json.dump(base, f)
    return path


def impl(mode, *extra):
    return "exec:python3 %s %s %s" % (ADAPTER, mode, " ".join(extra))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        # One prefill of 512 rows of 8 heads x 32: an 8 MB request line.
        big = scenario(os.path.join(tmp, "big.json"), "big-prefill",
                       {"window": 4, "ring_rows": 600, "q_heads": 8, "kv_heads": 8, "head_dim": 32},
                       [{"kind": "prefill", "request": 0, "rows": 512, "order": "store_then_load"}])
        one = scenario(os.path.join(tmp, "one.json"), "one-prefill", {},
                       [{"kind": "prefill", "request": 0, "rows": 4, "order": "load_then_store"},
                        {"kind": "decode", "request": 0}])

        # 16 MB of stderr after each answer, then an 8 MB request: kvcheck
        # drains stderr while it writes, so both sides make progress.
        run("stderr flood + 8 MB request", ["replay", big, "--step-timeout", "20", "--impl",
                                            impl("stderr-flood", "16")], 60, tmp, want_code=0)
        # An adapter that stops reading stdin: the send's deadline fires.
        run("adapter stops reading stdin", ["replay", big, "--step-timeout", "5", "--impl", impl("deaf")], 40,
            tmp, want_code=2, want_err=("(prefill, layer 0): the adapter read ", "it stopped reading its stdin"))
        # Two answer lines for one request: named at the request they followed.
        run("two answer lines for one request", ["replay", one, "--impl", impl("twice")], 30, tmp, want_code=2,
            want_err=("kvcheck error 600 at steps[0] (prefill, layer 0): an unrequested line after the answer",))
        # Answer lines of 0, 16 and 128 MB: time and memory linear in the line.
        # CPU seconds, not wall time: this machine's load must not decide.
        # Time and memory are judged in the Release tree; the sanitizer tree
        # (AddressSanitizer's allocator and shadow multiply both, and a
        # 128 MB line takes minutes there) parses a 16 MB line only.
        sanitized = os.environ.get("KVCHECK_SANITIZED") == "1"
        t0, m0 = run("answer line padded by 0 MB", ["replay", one, "--impl", impl("long-line", "0")], 30, tmp,
                     want_code=0)
        t16, m16 = run("answer line padded by 16 MB", ["replay", one, "--impl", impl("long-line", "16")], 60, tmp,
                       want_code=0)
        if not sanitized:
            t128, m128 = run("answer line padded by 128 MB", ["replay", one, "--impl", impl("long-line", "128")],
                             120, tmp, want_code=0)
            # Two answers each, 256 MB read in all for 128 MB lines: linear is 8x
            # the 16 MB cost (about 12x measured: page faults, the parser's token
            # buffer), the old rescan for '\n' after every read 31x in wall time
            # and more in CPU time.
            expect(t128 - t0 <= 24 * max(t16 - t0, 0.05),
                   "128 MB lines take at most 24x the CPU time of 16 MB lines (linear is 8x; %.2f s vs %.2f s)" %
                   (t128 - t0, t16 - t0))
            # Three copies are the floor: the line, the JSON parser's token
            # buffer and the string value it builds (measured 384.x MB more
            # than none: the copies and up to a 1 MB read chunk, so a bound of
            # exactly 3x failed now and then); a fourth copy would be 512.
            expect(m128 - m0 <= 3 * 128 + 16,
                   "a 128 MB line costs at most 3x its size (+16 MB) in kvcheck's memory (%.0f MB more than none)" %
                   (m128 - m0))
            # A line past the 1 GiB guard ends the run, in bounded memory.
            _, mguard = run("answer line past the 1 GiB guard", ["replay", one, "--step-timeout", "100", "--impl",
                                                                    impl("over-guard")], 150, tmp,
                            want_code=2, want_err=("an answer line longer than 1 GiB",))
            expect(mguard <= 2.5 * 1024, "the guard is reached within 2.5 GB (%.0f MB)" % mguard)
        # Grandchildren in their own session or process group: reaped too.
        # (5 cases pass every property; a coverage class they do not reach
        # may still make the run exit 1: the verdict is not what is judged here.)
        run("setsid and setpgid grandchildren", ["check", "--cases", "5", "--out", os.path.join(tmp, "setsid"),
                                                 "--impl", impl("setsid")], 120, tmp, want_code=(0, 1))
        # kvcheck itself killed mid-run: the conventional status, nothing left.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            run("kvcheck killed by %s mid-run" % sig.name,
                ["check", "--cases", "400", "--threads", "2", "--out", os.path.join(tmp, sig.name), "--impl",
                 impl("slow")], 30, tmp, sig=sig, want_code=-sig)

    print("\n%-40s %6s %9s %9s %9s %5s" % ("behaviour", "exit", "seconds", "CPU s", "peak MB", "left"))
    for name, code, seconds, cpu, peak, left, timed_out in rows:
        print("%-40s %6s %9.2f %9.2f %9.0f %5d%s" %
              (name, code, seconds, cpu, peak, left, "  timed out" if timed_out else ""))
    return finish()


if __name__ == "__main__":
    sys.exit(main())
