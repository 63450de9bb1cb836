import json
import subprocess

import pytest

import kvcheck.testing
from paged_prefix_cache import PagedPrefixCache, SkipCopyOnWrite


@pytest.mark.parametrize("profile", ["paged", "prefix", "layers"])
def test_paged_prefix_cache(check_engine, profile):
    check_engine(PagedPrefixCache, cases=150, profile=profile)


def test_skipped_copy_on_write_is_caught_shrunk_and_audited(request, tmp_path):
    # The planted bug fails the prefix profile with a small counterexample, and
    # the audit of its recording fails as the live run did; the recording of
    # the correct cache audits clean (its steps carry slots, no outputs).
    binary = kvcheck.testing.find_binary(request.config.getoption("--kvcheck-binary"))
    with pytest.raises(kvcheck.testing.CheckFailed) as failed:
        kvcheck.testing.check(SkipCopyOnWrite, cases=150, binary=binary, out=str(tmp_path / "bug"),
                              args=["--profile", "prefix", "--record", str(tmp_path / "bug.jsonl")])
    case = json.loads(failed.value.counterexample)
    assert len(case["requests"]) <= 3 and len(case["steps"]) <= 8, failed.value.counterexample
    assert "overwritten" in failed.value.first_failure
    kvcheck.testing.check(PagedPrefixCache, cases=20, binary=binary, out=str(tmp_path / "ok"),
                          args=["--profile", "prefix", "--record", str(tmp_path / "ok.jsonl")])
    audits = {name: subprocess.run([binary, "audit", str(tmp_path / f"{name}.jsonl")], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True) for name in ("ok", "bug")}
    assert audits["ok"].returncode == 0, audits["ok"].stdout
    assert audits["bug"].returncode == 1 and "overwritten" in audits["bug"].stdout, audits["bug"].stdout


class PrefixWindowOfLayer0(PagedPrefixCache):
    """A bug where two features meet: a begin from a shared prefix keeps the
    prefix blocks layer 0's window still sees, on every layer (a global layer
    then loses the prefix rows its first query must read)."""

    def begin_prefix(self, layer, state, request, prefix):
        own = self.first_seen
        self.first_seen = lambda _layer, position: own(0, position)
        try:
            return super().begin_prefix(layer, state, request, prefix)
        finally:
            del self.first_seen


def test_a_bug_where_prefixes_and_layer_windows_meet_fails_a_plain_check(request, tmp_path):
    # No --profile: the example declares shared prefixes and a window per
    # layer, so a plain check draws both, together in some cases, and the
    # failure shrinks to a few requests and steps with both still in it.
    binary = kvcheck.testing.find_binary(request.config.getoption("--kvcheck-binary"))
    with pytest.raises(kvcheck.testing.CheckFailed) as failed:
        kvcheck.testing.check(PrefixWindowOfLayer0, cases=2000, binary=binary, out=str(tmp_path / "bug"),
                              args=["--max-failures", "4"])
    assert failed.value.counterexample, str(failed.value)
    case = json.loads(failed.value.counterexample)
    assert len(case["requests"]) <= 3 and len(case["steps"]) <= 8, failed.value.counterexample
    assert any("prefix" in r for r in case["requests"]), failed.value.counterexample
    assert "layer_windows" in case["cache"], failed.value.counterexample
    assert "missing" in failed.value.first_failure, failed.value.first_failure
    # The correct cache passes the same counterexample.
    kvcheck.testing.replay(failed.value.counterexample_path, PagedPrefixCache, binary=binary,
                           out=str(tmp_path / "ok"))
