"""The small harness of the split-run tests (shard_test.py, mpi_test.py):
expect() prints every check as it is made and remembers the failed ones;
finish() is the script's exit code."""

failures = []


def expect(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def finish():
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    return 0
