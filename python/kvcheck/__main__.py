"""`python3 -m kvcheck MODULE:CLASS [ARGS]`: serves kvcheck's exec protocol
for an Engine (or protocol.Adapter) subclass, so that kvcheck can run it:

    kvcheck check --impl "exec:python3 -m kvcheck my_engine.adapter:MyCache"
    kvcheck check --impl "exec:python3 -m kvcheck tests/test_cache.py:MyCache"

MODULE is a module name (importable from the current directory or the
path) or the path of a .py file. ARGS go to the adapter's own command line.
"""

import importlib
import importlib.util
import os
import sys

from .engine import serve


def load(target):
    """'module:Class' or 'path/file.py:Class' -> the class."""
    where, sep, name = target.rpartition(":")
    if not sep or not where or not name:
        raise SystemExit(f"kvcheck: expected MODULE:CLASS or FILE.py:CLASS, got {target!r}")
    if where.endswith(".py") or os.sep in where:
        path = os.path.abspath(where)
        if not os.path.isfile(path):
            raise SystemExit(f"kvcheck: no file {where!r}")
        # The file's folder on the path, as when it runs as a script.
        sys.path.insert(0, os.path.dirname(path))
        module_name = os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    else:
        sys.path.insert(0, os.getcwd())
        module = importlib.import_module(where)
    try:
        return getattr(module, name)
    except AttributeError:
        raise SystemExit(f"kvcheck: {where} has no {name!r}") from None


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr)
        raise SystemExit(0 if argv else 2)
    # The module is imported before serve() sends stdout's writes to stderr:
    # a print at import time must not reach kvcheck either.
    answers = sys.stdout
    sys.stdout = sys.stderr
    engine_class = load(argv[0])
    sys.stdout = answers
    serve(engine_class, argv[1:])


if __name__ == "__main__":
    main()
