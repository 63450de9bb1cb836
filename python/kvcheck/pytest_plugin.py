"""The kvcheck pytest plugin: the `check_engine` fixture.

    def test_my_cache(check_engine):
        check_engine(MyCache)                 # kvcheck check, 200 cases, seed 1
        check_engine(MyCache, cases=50, args=["--profile", "production"])
        check_engine.replay("tests/kvcheck/", MyCache)
        check_engine(MyCache, against=MyCacheV1)   # two caches side by side
        check_engine(MyCache, repeat_bitwise=True)  # two runs, bitwise-equal outputs

A failing check fails the test with the first-failure line, the shrunk
counterexample (written under the test's tmp_path) and the exact replay
command. Options: --kvcheck-cases N, --kvcheck-seed X (X may be "random":
the seed drawn is shown with the failure) and --kvcheck-profile NAME (over
every check_engine call, as Hypothesis profiles set a budget per run),
--kvcheck-binary PATH (default: $KVCHECK, else kvcheck on PATH). The marker
`@pytest.mark.kvcheck(cases=N, seed=X, profile=NAME)` sets a test's own
defaults.

Loaded by the package's `pytest11` entry point once installed; from a
checkout, `pytest -p kvcheck.pytest_plugin` with python/ on PYTHONPATH.
"""

import os
import random
import shlex

import pytest

from . import testing

DEFAULT_CASES = 200
DEFAULT_SEED = 1


def pytest_addoption(parser):
    group = parser.getgroup("kvcheck", "kvcheck: check an engine's KV cache")
    group.addoption("--kvcheck-cases", type=int, default=None, metavar="N",
                    help=f"cases of every check_engine call (default: the call's or the kvcheck marker's, "
                         f"else {DEFAULT_CASES})")
    group.addoption("--kvcheck-seed", default=None, metavar="X",
                    help=f"seed of every check_engine call, or 'random' (default: the call's or the kvcheck "
                         f"marker's, else {DEFAULT_SEED})")
    group.addoption("--kvcheck-profile", default=None, metavar="NAME",
                    help="kvcheck's --profile for every check_engine call: default, production, trim, layers, "
                         "prefix or paged (default: the "
                         "call's or the kvcheck marker's, else kvcheck's own)")
    group.addoption("--kvcheck-binary", default=None, metavar="PATH",
                    help="the kvcheck executable (default: $KVCHECK, else kvcheck on PATH)")


def pytest_configure(config):
    config.addinivalue_line("markers", "kvcheck(cases=N, seed=X, profile=NAME): this test's check_engine defaults")
    seed = config.getoption("--kvcheck-seed")
    if seed is not None and seed != "random":
        try:
            int(seed)
        except ValueError:
            raise pytest.UsageError(f"--kvcheck-seed: an integer or 'random', got {seed!r}") from None
    cases = config.getoption("--kvcheck-cases")
    if cases is not None and cases < 1:
        raise pytest.UsageError(f"--kvcheck-cases: at least 1, got {cases}")


class EngineChecker:
    """The `check_engine` fixture: call it to check an engine, `.replay` to
    replay files. Both return a testing.CheckResult when the run passes."""

    def __init__(self, request, tmp_path):
        self.config = request.config
        # The test's id as a pytest command line in the invocation folder takes it.
        _, sep, rest = request.node.nodeid.partition("::")
        node_path = getattr(request.node, "path", None) or request.node.fspath  # pytest < 7: fspath
        path = os.path.relpath(str(node_path), str(self.config.invocation_params.dir))
        self.nodeid = path + sep + rest
        marker = request.node.get_closest_marker("kvcheck")
        self.marker = dict(marker.kwargs) if marker is not None else {}
        self.tmp_path = tmp_path
        self.runs = 0
        self.binary = self.config.getoption("--kvcheck-binary")

    def _out(self):
        self.runs += 1
        return str(self.tmp_path / f"kvcheck-out-{self.runs}")

    def _find_binary(self):
        try:
            return testing.find_binary(self.binary)
        except FileNotFoundError as e:
            failure = str(e)
        pytest.fail(failure, pytrace=False)

    def __call__(self, engine, cases=None, seed=None, profile=None, args=(), python=None, timeout=None,
                 against=None, bitwise=False, repeat_bitwise=False):
        profile = self.config.getoption("--kvcheck-profile") or profile or self.marker.get("profile")
        if profile is not None:
            args = ["--profile", profile] + list(args)
        option_cases = self.config.getoption("--kvcheck-cases")
        option_seed = self.config.getoption("--kvcheck-seed")
        cases = option_cases or cases or self.marker.get("cases") or DEFAULT_CASES
        seed = option_seed if option_seed is not None else (seed if seed is not None else
                                                            self.marker.get("seed", DEFAULT_SEED))
        if seed == "random":
            seed = random.SystemRandom().randrange(1, 2 ** 63)
        seed = int(seed)
        rerun = f"pytest {shlex.quote(self.nodeid)} --kvcheck-seed {seed} --kvcheck-cases {cases}"
        if profile is not None:
            rerun += f" --kvcheck-profile {shlex.quote(profile)}"
        try:
            return testing.check(engine, cases=cases, seed=seed, args=args, binary=self._find_binary(),
                                 out=self._out(), python=python, timeout=timeout, rerun=rerun, against=against,
                                 bitwise=bitwise, repeat_bitwise=repeat_bitwise)
        except testing.CheckFailed as e:
            failure = str(e)
        pytest.fail(failure, pytrace=False)  # outside the except: no "during handling" chain

    def replay(self, path, engine, args=(), python=None, timeout=None, against=None, bitwise=False,
               repeat_bitwise=False):
        try:
            return testing.replay(path, engine, args=args, binary=self._find_binary(), out=self._out(),
                                  python=python, timeout=timeout, against=against, bitwise=bitwise,
                                  repeat_bitwise=repeat_bitwise)
        except testing.CheckFailed as e:
            failure = str(e)
        pytest.fail(failure, pytrace=False)


@pytest.fixture
def check_engine(request, tmp_path):
    """Runs kvcheck on an engine class (or adapter command); a failure fails
    the test with the counterexample and the replay command."""
    return EngineChecker(request, tmp_path)
