#!/usr/bin/env python3
"""The folders are the architecture: the include graph says it.

Reads every #include line of the source tree and fails, naming file, line and
header, where a folder includes one it must not:

  cli/      flags only: never model/ or impl/ (the work is in pipelines/,
            sweep/ and properties/, which may link them)
  reports/  writers only: never model/ or impl/
  model/    the reference: never impl/ (a bug must not sit in both)

Direct includes are checked (what a file says it needs); a header of an
allowed part may still include model/ or impl/ for its own types.

Before the tree, the checker is run on a small tree of its own with one
violation per rule, so a checker that cannot fail fails here.

usage: include_graph_test.py SOURCE_DIR
"""
import os
import re
import sys
import tempfile

RULES = [
    ("cli", ("model/", "impl/")),
    ("reports", ("model/", "impl/")),
    ("model", ("impl/",)),
]
SOURCE_SUFFIXES = (".hpp", ".cpp", ".h", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]')


def violations(root):
    found = []
    for folder, forbidden in RULES:
        base = os.path.join(root, folder)
        for dirpath, _, files in os.walk(base):
            for name in sorted(files):
                if not name.endswith(SOURCE_SUFFIXES):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if m and m.group(1).startswith(forbidden):
                            found.append(f"{os.path.relpath(path, root)}:{number}: {folder}/ includes {m.group(1)}")
    return found


def self_test():
    with tempfile.TemporaryDirectory() as root:
        bad = {
            "cli/a.cpp": '#include "model/real.hpp"\n',
            "cli/b.hpp": '#include <impl/kv_cache.hpp>\n',
            "reports/c.cpp": '  #  include "impl/cpu/cpu_backend.hpp"\n',
            "model/d.hpp": '#include "impl/ring_index.hpp"\n',
            "model/ok.hpp": '#include "model/real.hpp"\n',
            "cli/ok.cpp": '#include "pipelines/check.hpp"\n// #include "impl/kv_cache.hpp" in a comment\n',
        }
        for rel, text in bad.items():
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w") as f:
                f.write(text)
        got = violations(root)
        if len(got) != 4:
            print("include graph checker self-test: expected 4 violations, got", len(got), *got, sep="\n  ")
            return False
    return True


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    if not self_test():
        return 1
    found = violations(sys.argv[1])
    for v in found:
        print(v)
    if found:
        print(f"{len(found)} include(s) against the layout (README 'Layout', STYLE.md)")
        return 1
    print("include graph: cli/ and reports/ include neither model/ nor impl/; model/ never includes impl/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
