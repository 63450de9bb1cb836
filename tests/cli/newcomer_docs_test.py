#!/usr/bin/env python3
"""What the docs tell a newcomer holds (issue 30 item 9).

    newcomer_docs_test.py KVCHECK SOURCE_DIR

* How many adapter processes a run starts: counted with a wrapper that logs
  each start, a passing 20-case check starts the adapter once for the
  coordinating thread and once per worker thread (2 with --threads 1, 3 with
  --threads 2), a replay once; docs/checking-an-engine.md says so (and no
  longer "one adapter process per worker thread").
* Which interpreter `exec:python3` runs: the first python3 on PATH. With a
  broken python3 first on PATH, `exec:python3 ...` fails at hello and
  `exec:/usr/bin/python3 ...` (the interpreter named by its path, as the docs
  say) passes.
* The pages a newcomer reads say what `begin` may answer (slot events,
  judged as in any step) and what kvcheck does not model (preemption,
  lookahead slots).
* Comments and messages cite docs/semantics.md's sections, never "SPEC"
  section numbers of a document the repository does not ship.
"""
import os
import shutil
import stat
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import harness
from harness import expect, finish

KVCHECK = sys.argv[1]
SOURCE = sys.argv[2]
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
RING = os.path.join(SOURCE, "adapters", "ring_cache.py")


def read(*parts):
    with open(os.path.join(SOURCE, *parts), encoding="utf-8") as f:
        return " ".join(f.read().split())  # one line: sentences wrap anywhere


def executable(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


work = tempfile.mkdtemp(prefix="kvcheck-newcomer-")
try:
    log = os.path.join(work, "starts.log")
    counted = executable(os.path.join(work, "counted-adapter"),
                         "#!/bin/sh\necho start >> %s\nexec %s %s \"$@\"\n" % (log, PYTHON, RING))

    def starts(args):
        if os.path.exists(log):
            os.remove(log)
        code, out, err = harness.run([KVCHECK] + args, cwd=work)
        n = len(open(log).read().split()) if os.path.exists(log) else 0
        return code, n, err

    for threads, expected in ((1, 2), (2, 3)):
        code, n, err = starts(["check", "--impl", "exec:" + counted, "--cases", "20", "--threads", str(threads),
                               "--no-coverage-gate", "--out", os.path.join(work, "out%d" % threads)])
        expect(code == 0 and n == expected,
               "check --threads %d of 20 passing cases starts the adapter %d times (exit %d, %d starts; %s)"
               % (threads, expected, code, n, err.strip()[-200:]))
    scenario = os.path.join(SOURCE, "scenarios", "fast")
    code, n, err = starts(["replay", scenario, "--impl", "exec:" + counted])
    expect(n == 1, "replay of the bundled scenarios starts the adapter once (exit %d, %d starts)" % (code, n))

    engine_doc = read("docs", "checking-an-engine.md")
    expect("One adapter process per worker thread is reused for every case" not in engine_doc
           and "starts the adapter twice" in engine_doc and "`--threads 4` five times" in engine_doc,
           "checking-an-engine.md says a run starts one adapter for the coordinating thread and one per worker")

    # exec:python3 runs the first python3 on PATH; a path names the interpreter.
    shim = os.path.join(work, "shim")
    os.makedirs(shim)
    executable(os.path.join(shim, "python3"), "#!/bin/sh\necho 'not this python' >&2\nexit 1\n")
    env = dict(os.environ, PATH=shim + os.pathsep + os.environ.get("PATH", ""))
    tiny = os.path.join(SOURCE, "scenarios", "fast")
    code, out, err = harness.run([KVCHECK, "replay", tiny, "--impl", "exec:python3 " + RING], cwd=work, env=env)
    expect(code == 2 and "not this python" in err,
           "exec:python3 runs the first python3 on PATH, here a broken one (exit %d)" % code)
    code, out, err = harness.run([KVCHECK, "replay", tiny, "--impl", "exec:%s %s" % (PYTHON, RING)], cwd=work,
                                 env=env)
    expect(code == 0, "exec:%s names the interpreter whatever PATH holds (exit %d; %s)"
           % (PYTHON, code, err.strip()[-200:]))
    expect("exec:/usr/bin/python3 my_adapter.py" in engine_doc,
           "checking-an-engine.md says how to name the interpreter")

    protocol = read("adapters", "PROTOCOL.md")
    expect("Answer to `begin`, `accept`, `finish`, `reset`, `trim`: `{\"ok\":true}`" in protocol
           and "a `begin` that evicts blocks" in protocol and "They are judged as in any step" in protocol,
           "PROTOCOL.md says a begin may answer freed, moved and padded, judged as in any step")
    expect("preemption" in engine_doc and "lookahead" in engine_doc,
           "checking-an-engine.md says what kvcheck does not model: preemption, lookahead slots")
    # Comments and messages cite the project's own pages (docs/semantics.md),
    # never the section numbers of "SPEC", a document the repository does not ship.
    cited = []
    for top in ("model", "impl", "engines", "scenarios", "properties", "sweep", "reports", "pipelines", "cli",
                "api", "adapters", "python", "support", "tests", "bench", "scripts", "examples"):
        for root, _, names in os.walk(os.path.join(SOURCE, top)):
            for name in names:
                if name.endswith((".cpp", ".hpp", ".cu", ".cuh", ".py", ".sh", ".md", ".txt")):
                    with open(os.path.join(root, name), encoding="utf-8", errors="replace") as f:
                        if "SPEC \u00a7" in f.read():
                            cited.append(os.path.relpath(os.path.join(root, name), SOURCE))
    expect(not cited, "no file cites 'SPEC \u00a7N' (found in %s)" % cited[:5])
    expect(os.path.isfile(os.path.join(SOURCE, "docs", "semantics.md")), "docs/semantics.md, the page cited, ships")
finally:
    shutil.rmtree(work, ignore_errors=True)
sys.exit(finish())
