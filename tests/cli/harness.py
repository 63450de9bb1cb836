"""The small harness of kvcheck's Python tests (tests/cli/*_test.py,
tests/reports/wellformed_test.py): expect() prints every check as it is made
and remembers the failed ones, fail() records one that failed outright,
run() runs a command and returns its exit code, stdout and stderr as text;
finish() is the script's exit code; exec_impl() and its two shorthands name
an adapter as `--impl exec:...` takes it."""

import os
import shlex
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))

failures = []


def expect(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def fail(what):
    expect(False, what)


def run(command, timeout=600, **kwargs):
    """Runs `command` (a list) with stdout and stderr captured as text;
    keyword arguments go to subprocess.run (cwd, env, preexec_fn, errors)."""
    p = subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)
    return p.returncode, p.stdout, p.stderr


def finish():
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    return 0


def exec_impl(path, *flags):
    """`exec:python3 PATH FLAGS...`, each word quoted for the shell."""
    return "exec:" + " ".join(shlex.quote(a) for a in ["python3", path, *flags])


def twisted(twist):
    """The twisted test adapter (tests/cli/twisted_adapter.py) with one twist."""
    return exec_impl(os.path.join(HERE, "twisted_adapter.py"), twist)


def bundled_adapter(source, name, *flags):
    """A bundled adapter (SOURCE/adapters/NAME) with its flags."""
    return exec_impl(os.path.join(source, "adapters", name), *flags)
