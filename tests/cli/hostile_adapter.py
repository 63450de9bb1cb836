#!/usr/bin/env python3
"""A kvcheck exec adapter that is correct but hostile to its host (tests only).

Usage: hostile_adapter.py MODE [SIZE_MB]

It answers every request as adapters/ring_cache.py does (so a run passes
unless kvcheck is hurt by the behaviour), and in MODE also:
  stderr-flood  writes SIZE_MB (default 16) MB to stderr after each answer
  deaf          declares no refusal probes and stops reading stdin after
                the first begin (sleeps), before the first row-writing step
  twice         writes each answer to a row-writing step twice, in one write
  long-line     pads each answer to a row-writing step with SIZE_MB MB of
                leading spaces (still one valid JSON line)
  over-guard    answers the first row-writing step with 1 GiB + 1 byte of
                spaces and no newline
  setsid        starts a `sleep 600` in a new session (setsid) and one in its
                own process group at each row-writing step, then goes on
  slow          sleeps 20 ms per answer and starts a setsid `sleep 600` at
                each row-writing step (for the signal tests)
Tests find leftover processes by a marker in their environment, which every
child inherits.
"""
import json
import os
import subprocess
import sys
import time

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "adapters"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))  # the kvcheck package

from kvcheck import protocol as kp  # noqa: E402
import ring_cache  # noqa: E402

MODE = sys.argv[1]
SIZE = int(float(sys.argv[2]) * (1 << 20)) if len(sys.argv) > 2 else 16 << 20
WRITES = (b'"op":"prefill"', b'"op":"decode"', b'"op":"verify"')


def write(stream, data):
    stream.write(data)
    stream.flush()


def main():
    session = kp.Session(ring_cache.RingAdapter())
    out, err = sys.stdout.buffer, sys.stderr.buffer
    begun = False
    while not session.done:
        raw = sys.stdin.buffer.readline()
        if not raw:
            break
        answer = session.handle(raw).encode("utf-8") + b"\n"
        if MODE == "deaf" and b'"op":"hello"' in raw:
            # No refusal probes: the request after begin is the big prefill.
            hello = json.loads(answer)
            hello["capabilities"].pop("probes", None)
            answer = json.dumps(hello).encode("utf-8") + b"\n"
        writes = any(w in raw for w in WRITES)
        if MODE == "twice" and writes:
            answer = answer + answer
        if MODE == "long-line" and writes:
            chunk = b" " * (1 << 20)  # the padding in pieces: the adapter stays small
            for _ in range(SIZE >> 20):
                out.write(chunk)
        if MODE == "over-guard" and writes:
            chunk = b" " * (1 << 20)
            for _ in range(1024):
                out.write(chunk)
            write(out, b" ")
            time.sleep(600)
        if MODE in ("setsid", "slow") and writes:
            subprocess.Popen(["sleep", "600"], start_new_session=True)
            if MODE == "setsid":
                subprocess.Popen(["sleep", "600"], preexec_fn=lambda: os.setpgid(0, 0))
        if MODE == "slow":
            time.sleep(0.02)
        write(out, answer)
        if MODE == "stderr-flood":
            write(err, b"adapter log line that nobody reads\n" * (SIZE // 35))
        if MODE == "deaf" and b'"op":"begin"' in raw and not begun:
            begun = True
            time.sleep(600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
