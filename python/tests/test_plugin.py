"""The pytest plugin as an engine developer meets it: the ten-line toy test
passes, the same test with a planted bug fails with the first failure, the
shrunk counterexample and a replay command that reproduces it."""
import os
import re
import subprocess
import sys

import pytest

import kvcheck
from kvcheck import testing

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with open(os.path.join(PYTHON_DIR, "examples", "test_toy_cache.py"), encoding="utf-8") as f:
    TOY = f.read()


# Installed (pip install ./python), the plugin loads through its pytest11
# entry point; from a checkout, through -p with python/ on PYTHONPATH.
INSTALLED = not os.path.abspath(kvcheck.__file__).startswith(os.path.join(PYTHON_DIR, ""))


@pytest.fixture
def run_toy(pytester, monkeypatch, request):
    binary = testing.find_binary(request.config.getoption("--kvcheck-binary"))
    plugin = []
    if not INSTALLED:
        monkeypatch.setenv("PYTHONPATH", PYTHON_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""))
        plugin = ["-p", "kvcheck.pytest_plugin"]

    def run(source, *args):
        pytester.makepyfile(test_toy=source)
        result = pytester.runpytest_subprocess(*plugin, f"--kvcheck-binary={binary}", *args)
        return binary, result
    return run


def test_the_toy_test_passes(run_toy):
    _, result = run_toy(TOY)
    result.assert_outcomes(passed=1)


def test_a_planted_bug_fails_with_the_counterexample_and_replay(run_toy, pytester):
    # The bug: every state's rows go to the first state's ring.
    buggy = TOY.replace("kvcheck.ring_slot(self.spec, step.state, p)", "p % self.spec.capacity")
    assert buggy != TOY
    binary, result = run_toy(buggy, "--kvcheck-seed", "1")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "kvcheck found a failing case: check: 100 cases" in out
    assert re.search(r"first failure: step \d+ \((prefill|decode)\)", out), out
    # The shrunk counterexample itself, shown and written under the test's tmp_path.
    assert '"schema_version": 1' in out and '"requests": [' in out and '"steps": [' in out
    m = re.search(r"replay: (\S+) replay (\S+/counterexample-exec-seed1\.json) --impl '(exec:[^']+)'", out)
    assert m, out
    assert m.group(1) == binary
    assert m.group(2).startswith(str(pytester.path)) and os.path.isfile(m.group(2))
    assert "rerun: pytest test_toy.py::test_toy_ring --kvcheck-seed 1 --kvcheck-cases 100" in out
    # The replay command, run from a shell, fails the same way.
    replay = subprocess.run(m.group(0)[len("replay: "):], shell=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=str(pytester.path))
    assert replay.returncode == 1, replay.stdout
    assert "FAIL" in replay.stdout or "fail" in replay.stdout, replay.stdout
    # And testing.replay: the same counterexample passes on the correct toy.
    toy = os.path.join(PYTHON_DIR, "examples", "toy_ring_cache.py")
    passed = testing.replay(m.group(2), f"{sys.executable} -m kvcheck {toy}:ToyRing", binary=binary,
                            out=str(pytester.path / "replay-ok"))
    assert passed.exit_code == 0 and os.path.isfile(str(pytester.path / "replay-ok" / "report.json"))


def test_a_bad_option_is_a_usage_error_naming_it(run_toy):
    _, result = run_toy(TOY, "--kvcheck-seed", "one")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--kvcheck-seed: an integer or 'random', got 'one'" in result.stderr.str()


SIDE_BY_SIDE = f"""
import sys
sys.path.insert(0, {os.path.join(PYTHON_DIR, "examples")!r})
from paged_prefix_cache import PagedPrefixCache, SkipCopyOnWrite


def test_same_engine_agrees(check_engine):
    result = check_engine(PagedPrefixCache, against=PagedPrefixCache, cases=100, profile="prefix")
    assert "agreement of " in result.stdout and "--against" in result.command


def test_against_its_bug(check_engine):
    check_engine(PagedPrefixCache, against=SkipCopyOnWrite, cases=100, profile="prefix")
"""


def test_against_fails_with_the_first_difference_and_replay(run_toy, pytester):
    # The paged example against its planted SkipCopyOnWrite: the two differ
    # (what they hold after a write into a shared block), shrunk, with a
    # replay command that runs both again; the example against itself agrees.
    binary, result = run_toy(SIDE_BY_SIDE, "--kvcheck-seed", "1")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert re.search(r"agreement of exec:\S+ \S+PagedPrefixCache\.py \(A\) and exec:\S+ \S+SkipCopyOnWrite\.py "
                     r"\(B\).*: 100 cases", out), out
    assert re.search(r"counterexample: [123] requests, [1-8] steps", out), out
    assert re.search(r"first difference \(A = .*\):\n\s+step \d+ \(\w+\) layer \d+ request \d+: ", out), out
    assert '"schema_version": 1' in out and '"steps": [' in out
    m = re.search(r"replay: (\S+) replay (\S+/counterexample-agreement-seed1\.json) --impl '(exec:[^']+)' "
                  r"--against '(exec:[^']+SkipCopyOnWrite\.py)'", out)
    assert m, out
    assert m.group(1) == binary
    replay = subprocess.run(m.group(0)[len("replay: "):], shell=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=str(pytester.path))
    assert replay.returncode == 1, replay.stdout
    assert "differs: counterexample-agreement-seed1: step " in replay.stdout, replay.stdout
    # testing.replay with against=: the same difference, named as its first failure.
    with pytest.raises(testing.CheckFailed) as failed:
        testing.replay(m.group(2), m.group(3)[len("exec:"):], against=m.group(4), binary=binary,
                       out=str(pytester.path / "replay-differs"))
    assert re.match(r"first difference: counterexample-agreement-seed1: step \d+ ", failed.value.first_failure)
    # testing.replay with against= on the same file: the fixed engine against itself agrees.
    fixed = m.group(3)
    passed = testing.replay(m.group(2), fixed[len("exec:"):], against=fixed, binary=binary,
                            out=str(pytester.path / "replay-ok"))
    assert passed.exit_code == 0 and "--against" in passed.command


def test_repeat_bitwise_passes_on_a_deterministic_engine(request, tmp_path):
    binary = testing.find_binary(request.config.getoption("--kvcheck-binary"))
    toy = os.path.join(PYTHON_DIR, "examples", "toy_ring_cache.py")
    result = testing.check(f"{sys.executable} -m kvcheck {toy}:ToyRing", cases=20, binary=binary,
                           out=str(tmp_path), repeat_bitwise=True)
    assert "--repeat-bitwise" in result.command and result.passed
