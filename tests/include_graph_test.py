#!/usr/bin/env python3
"""The folders are the architecture: the include graph says it.

Reads every #include line of the source tree and follows each include
through the headers it reaches (a header's own includes, and theirs), so a
rule holds for what a file compiles with, not only for what it names. Fails,
naming the file and the chain of includes, where a folder reaches one it
must not:

  model/       the reference: only model/ and support/ (never impl/, engines/,
               scenarios/, properties/, ...: a bug must not sit in both the
               oracle and the thing under test, and the model sees no JSON)
  properties/  the checker: never impl/ (it knows no cache; what a cache can
               reach it declares in engines::Capabilities, faults travel by
               name)
  cli/         flags only: never model/ or impl/ (the work is in pipelines/,
               sweep/ and properties/)
  reports/     writers only: never model/ or impl/
  sweep/       impl/ only through impl/ring_pool.hpp (the sweep drives
               RingPool, the composition `check --impl cpu` runs, never the
               kernels or the addressing on its own)

pipelines/, sweep/, engines/ and tests/ may join the model and the
implementations; they are not checked otherwise. An include is resolved from the
source root (the project's own form, "impl/kv_cache.hpp" or
<impl/kv_cache.hpp>), then beside the including file; one that names no
file of the tree (a system or generated header) is followed no further.

Before the tree, the checker is run on a small tree of its own with one
violation per rule, direct and through headers, so a checker that cannot
fail fails here.

usage: include_graph_test.py SOURCE_DIR
"""
import os
import re
import sys
import tempfile

RULES = [
    ("model", ("impl/", "engines/", "scenarios/", "properties/", "sweep/", "pipelines/", "reports/", "cli/",
               "api/", "adapters/")),
    ("properties", ("impl/",)),
    ("cli", ("model/", "impl/")),
    ("reports", ("model/", "impl/")),
]
# (folder, forbidden prefix, the one file through which it may be reached)
THROUGH_RULES = [
    ("sweep", "impl/", "impl/ring_pool.hpp"),
]
SOURCE_SUFFIXES = (".hpp", ".cpp", ".h", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]')


class Graph:
    """The include edges of a tree, read lazily and kept."""

    def __init__(self, root):
        self.root = root
        self.edges = {}

    def includes(self, rel):
        """(name as written, resolved path relative to root or None) of each include of `rel`."""
        if rel not in self.edges:
            found = []
            with open(os.path.join(self.root, rel), encoding="utf-8", errors="replace") as f:
                for line in f:
                    m = INCLUDE.match(line)
                    if m:
                        found.append((m.group(1), self.resolve(rel, m.group(1))))
            self.edges[rel] = found
        return self.edges[rel]

    def resolve(self, rel, name):
        for candidate in (name, os.path.join(os.path.dirname(rel), name)):
            candidate = os.path.normpath(candidate)
            if not candidate.startswith("..") and os.path.isfile(os.path.join(self.root, candidate)):
                return candidate
        return None

    def reached(self, rel, stop=()):
        """Every include reached from `rel`: {name or path: chain of files from rel}.
        Files in `stop` are reached but not followed."""
        chains = {}
        queue = [(rel, [rel])]
        seen = {rel}
        while queue:
            at, chain = queue.pop(0)
            for name, path in self.includes(at):
                key = path if path is not None else name
                if key in chains or key in seen:
                    continue
                chains[key] = chain + [key]
                if path is not None and path not in stop:
                    seen.add(path)
                    queue.append((path, chain + [path]))
        return chains


def violations(root):
    graph = Graph(root)
    found = []
    for folder, forbidden in RULES:
        base = os.path.join(root, folder)
        for dirpath, dirnames, files in os.walk(base):
            dirnames.sort()
            for name in sorted(files):
                if not name.endswith(SOURCE_SUFFIXES):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), root)
                for target, chain in sorted(graph.reached(rel).items()):
                    if target.startswith(forbidden):
                        found.append(f"{rel}: {folder}/ reaches {target} through " + " -> ".join(chain))
    for folder, forbidden, gate in THROUGH_RULES:
        for rel in source_files(root, folder):
            for target, chain in sorted(graph.reached(rel, stop=(gate,)).items()):
                if target.startswith(forbidden) and target != gate:
                    found.append(f"{rel}: {folder}/ reaches {target} not through {gate}: " + " -> ".join(chain))
    return found


def source_files(root, folder):
    """The sources under `folder`, relative to root, in order."""
    for dirpath, dirnames, files in os.walk(os.path.join(root, folder)):
        dirnames.sort()
        for name in sorted(files):
            if name.endswith(SOURCE_SUFFIXES):
                yield os.path.relpath(os.path.join(dirpath, name), root)


def self_test():
    with tempfile.TemporaryDirectory() as root:
        tree = {
            # direct
            "cli/a.cpp": '#include "model/real.hpp"\n',
            "cli/b.hpp": '#include <impl/kv_cache.hpp>\n',
            "reports/c.cpp": '  #  include "impl/cpu/cpu_backend.hpp"\n',
            "model/d.hpp": '#include "impl/ring_index.hpp"\n',
            "properties/e.cpp": '#include "impl/kv_cache.hpp"\n',
            # through headers: each reaches one forbidden file
            "cli/f.cpp": '#include "pipelines/p.hpp"\n',
            "pipelines/p.hpp": '#include "engines/e.hpp"\n',
            "engines/e.hpp": '#include "impl/kv_cache.hpp"\n#include "engines/e.hpp"\n',  # and a cycle
            "properties/g.hpp": '#include "engines/e.hpp"\n',
            "reports/h.cpp": '#include "properties/o.hpp"\n',
            "properties/o.hpp": '#include "model/real.hpp"\n',
            "model/i.hpp": '#include "model/j.hpp"\n',
            "model/j.hpp": '#include "scenarios/s.hpp"\n',
            "scenarios/s.hpp": '#include <vector>\n',
            # beside the including file
            "properties/k.cpp": '#include "local.hpp"\n',
            "properties/local.hpp": '#include "impl/kv_cache.hpp"\n',
            # sweep/: impl/ only through impl/ring_pool.hpp
            "sweep/l.cpp": '#include "impl/ring_pool.hpp"\n#include "impl/kv_cache.hpp"\n',
            "sweep/m.cpp": '#include "engines/e.hpp"\n',
            "sweep/ok.cpp": '#include "impl/ring_pool.hpp"\n#include "model/real.hpp"\n',
            "impl/ring_pool.hpp": '#include "impl/kv_cache.hpp"\n#include "impl/ring_index.hpp"\n',
            # allowed
            "impl/kv_cache.hpp": "",
            "impl/ring_index.hpp": "",
            "impl/cpu/cpu_backend.hpp": '#include "impl/kv_cache.hpp"\n',
            "model/real.hpp": '#include "support/assert.hpp"\n',
            "support/assert.hpp": "",
            "model/ok.hpp": '#include "model/real.hpp"\n#include <cstdint>\n#include "generated.hpp"\n',
            "pipelines/ok.cpp": '#include "impl/kv_cache.hpp"\n#include "model/real.hpp"\n',
            "cli/ok.cpp": '#include "cli/clean.hpp"\n// #include "impl/kv_cache.hpp" in a comment\n',
            "cli/clean.hpp": '#include "reports/clean.hpp"\n',
            "reports/clean.hpp": '#include "scenarios/s.hpp"\n',
        }
        for rel, text in tree.items():
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w") as f:
                f.write(text)
        expected = {
            "cli/a.cpp: cli/ reaches model/real.hpp",
            "cli/b.hpp: cli/ reaches impl/kv_cache.hpp",
            "reports/c.cpp: reports/ reaches impl/cpu/cpu_backend.hpp",
            "reports/c.cpp: reports/ reaches impl/kv_cache.hpp",
            "model/d.hpp: model/ reaches impl/ring_index.hpp",
            "properties/e.cpp: properties/ reaches impl/kv_cache.hpp",
            "cli/f.cpp: cli/ reaches impl/kv_cache.hpp",
            "properties/g.hpp: properties/ reaches impl/kv_cache.hpp",
            "reports/h.cpp: reports/ reaches model/real.hpp",
            "model/i.hpp: model/ reaches scenarios/s.hpp",
            "model/j.hpp: model/ reaches scenarios/s.hpp",
            "properties/k.cpp: properties/ reaches impl/kv_cache.hpp",
            "properties/local.hpp: properties/ reaches impl/kv_cache.hpp",
            "sweep/l.cpp: sweep/ reaches impl/kv_cache.hpp not through impl/ring_pool.hpp: sweep/l.cpp -> impl/kv_cache.hpp",
            "sweep/m.cpp: sweep/ reaches impl/kv_cache.hpp not through impl/ring_pool.hpp: sweep/m.cpp -> engines/e.hpp -> impl/kv_cache.hpp",
        }
        got = {v if " not through " in v else v.split(" through ")[0] for v in violations(root)}
        if got != expected:
            print("include graph checker self-test: expected", *sorted(expected), "got", *sorted(got), sep="\n  ")
            return False
        chain = [v for v in violations(root) if v.startswith("cli/f.cpp")]
        if chain != ["cli/f.cpp: cli/ reaches impl/kv_cache.hpp through "
                     "cli/f.cpp -> pipelines/p.hpp -> engines/e.hpp -> impl/kv_cache.hpp"]:
            print("include graph checker self-test: the chain is not named:", *chain, sep="\n  ")
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
        print(f"{len(found)} include(s) against the layout (docs/development.md 'Layout', STYLE.md)")
        return 1
    print("include graph, through every header: model/ reaches only model/ and support/; properties/ "
          "reaches no impl/; cli/ and reports/ reach neither model/ nor impl/; sweep/ reaches impl/ only "
          "through impl/ring_pool.hpp")
    return 0


if __name__ == "__main__":
    sys.exit(main())
