#!/usr/bin/env python3
"""The longest functions of the tree, for the rule "no function over ~80 lines".

Lists function bodies by length: lines from the signature's first line to the
closing brace, as Universal Ctags' end: field gives them, and code lines (the
same without blank and comment-only lines). CUDA sources (.cu, .cuh) and build
trees are left out; C++ sources (.cpp, .hpp, .h) of every folder are read.

usage: scripts/longest-functions.py [ROOT] [N] [PATH_PREFIX...]
  e.g. scripts/longest-functions.py . 10           the ten longest in the tree
       scripts/longest-functions.py . 3 properties/ the three longest in properties/
Needs universal-ctags (Debian: universal-ctags).
"""
import os
import subprocess
import sys


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    prefixes = tuple(sys.argv[3:])
    files = []
    for dirpath, dirnames, names in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(("build", ".")))
        for name in sorted(names):
            if name.endswith((".cpp", ".hpp", ".h")):
                rel = os.path.relpath(os.path.join(dirpath, name), root)
                if not prefixes or rel.startswith(prefixes):
                    files.append(rel)
    tags = subprocess.run(["ctags", "--fields=+ne", "--c++-kinds=f", "--language-force=C++", "-o", "-"] + files,
                          cwd=root, capture_output=True, text=True, check=True).stdout
    rows = []
    for line in tags.splitlines():
        parts = line.split("\t")
        fields = dict(p.split(":", 1) for p in parts[3:] if ":" in p)
        if "line" not in fields or "end" not in fields:
            continue
        first, last = int(fields["line"]), int(fields["end"])
        with open(os.path.join(root, parts[1]), encoding="utf-8", errors="replace") as f:
            body = f.read().split("\n")[first - 1:last]
        code = sum(1 for t in body if t.strip() and not t.strip().startswith(("//", "/*", "*")))
        rows.append((last - first + 1, code, parts[1], first, parts[0]))
    rows.sort(key=lambda r: (-r[0], r[2], r[3]))
    print("lines  code  function")
    for lines, code, path, first, name in rows[:count]:
        print(f"{lines:5d}  {code:4d}  {path}:{first}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
