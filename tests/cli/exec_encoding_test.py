#!/usr/bin/env python3
"""The binary transport changes nothing but the bytes on the pipe.

Usage: exec_encoding_test.py KVCHECK_BINARY SOURCE_DIR

Runs `kvcheck check` twice per bundled adapter, once with --exec-encoding
json and once with --exec-encoding binary, on the same seed, through a tee
that keeps what kvcheck sent: the paged adapter with its free-early bug (a
failing case, shrunk, with a counterexample) and the ring adapter. Every
report file of the two runs must be the same bytes, the same exit code; the
binary run's requests must carry frames and no JSON rows, the JSON run's no
frames. Exits 0 when all of that holds, 1 otherwise.
"""
import filecmp
import os
import shutil
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True

RUNS = [("paged_cache.py --bug free-early", 6, 1), ("ring_cache.py", 6, 2)]


def main():
    kvcheck, root = sys.argv[1], sys.argv[2]
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        sent = os.path.join(tmp, "sent")
        out = os.path.join(tmp, "out")
        for adapter, cases, seed in RUNS:
            # One command line for both runs (the report names it): the tee
            # appends what kvcheck writes to the adapter's stdin to `sent`.
            impl = "exec:tee -a %s | %s %s" % (sent, sys.executable, os.path.join(root, "adapters", adapter))
            codes = {}
            for encoding in ("json", "binary"):
                if os.path.exists(sent):
                    os.remove(sent)
                shutil.rmtree(out, ignore_errors=True)
                run = subprocess.run([kvcheck, "check", "--impl", impl, "--cases", str(cases), "--seed", str(seed),
                                      "--threads", "1", "--out", out,
                                      "--exec-encoding", encoding],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                codes[encoding] = run.returncode
                if run.returncode not in (0, 1):
                    print("%s, %s: exit %d\n%s" % (adapter, encoding, run.returncode, run.stderr))
                    failures += 1
                os.rename(out, os.path.join(tmp, encoding))
                data = open(sent, "rb").read()
                frames, json_rows = data.count(b'"frame":{'), data.count(b'"k":[[')
                if encoding == "binary" and (frames == 0 or json_rows != 0 or b'"encodings":["binary","json"]' not in data):
                    print("%s: the binary run sent %d frames and %d JSON rows" % (adapter, frames, json_rows))
                    failures += 1
                if encoding == "json" and (frames != 0 or json_rows == 0 or b"encodings" in data):
                    print("%s: the JSON run sent %d frames and %d JSON rows" % (adapter, frames, json_rows))
                    failures += 1
            if codes["json"] != codes["binary"]:
                print("%s: exit %d with JSON, %d with binary frames" % (adapter, codes["json"], codes["binary"]))
                failures += 1
            if adapter.endswith("free-early") and codes["json"] != 1:
                print("%s: the planted bug was not caught (exit %d)" % (adapter, codes["json"]))
                failures += 1
            a, b = os.path.join(tmp, "json"), os.path.join(tmp, "binary")
            names = sorted(os.listdir(a))
            if names != sorted(os.listdir(b)) or "report.json" not in names:
                print("%s: the runs wrote %s and %s" % (adapter, names, sorted(os.listdir(b))))
                failures += 1
            for name in names:
                if os.path.isfile(os.path.join(a, name)) and not filecmp.cmp(os.path.join(a, name),
                                                                             os.path.join(b, name), shallow=False):
                    print("%s: %s differs between JSON and binary frames" % (adapter, name))
                    failures += 1
            print("%s: %d cases, seed %d, exit %d, reports identical: %s" % (adapter, cases, seed, codes["json"],
                                                                            ", ".join(names)))
            shutil.rmtree(a)
            shutil.rmtree(b)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
