#!/usr/bin/env python3
"""An exec adapter that keeps a row from one case to the next (tests only).

It is the bundled ring cache (adapters/ring_cache.py) with one bug that no
single case shows: the last row any case stored outlives `close` and `open`,
and the first query of the next case in the same process reads it too (its
slot is reported in `read[0]`, and the row is attended when it has the
query's width). A case run alone in a fresh process therefore passes; the
same case run after another one fails with an extra read. kvcheck must label
such a failure "depends on earlier cases" and keep the cases that ran before
it (reproduce_test.py).

Usage: leaky_adapter.py [MARKER]   (MARKER is ignored: tests use it to find processes)
"""
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "adapters"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))  # the kvcheck package

from kvcheck import protocol as kp  # noqa: E402
import window_cache  # noqa: E402
import ring_cache  # noqa: E402

# The row the last case stored, kept across close/open: (key row, value row).
LEFTOVER = None


class LeakyCache(ring_cache.RingCache):
    def __init__(self, spec, bugs):
        super().__init__(spec, bugs)
        self.stale = LEFTOVER  # what the previous case left behind

    def write_step(self, step):
        global LEFTOVER
        answer = super().write_step(step)
        q, position = step.q, step.position
        stored_k = answer["stored"]["k"]
        stored_v = answer["stored"].get("v", stored_k)
        if self.stale is not None:
            key, value = self.stale
            self.stale = None
            # The first query of the case also reads the stale row, from the
            # pool's last slot (a duplicate or unwritten read: an extra read).
            answer["read"][0].append(self.spec.states * self.spec.capacity - 1)
            if len(key) == self.spec.kv_width:
                spec = self.spec
                query = window_cache.rotate_heads(q[0], spec.q_heads, spec.head_dim, position, self.rope)
                entries = [(key, value)] + [(stored_k[0], stored_v[0])]
                answer["out"][0] = window_cache.attend(query, entries, spec)
        LEFTOVER = (stored_k[-1], stored_v[-1])
        return answer


class LeakyAdapter(ring_cache.RingAdapter):
    """Ring cache that keeps its last stored row across close/open."""

    name = "leaky-ring-cache"
    bugs = {}

    def parse_args(self, argv):
        # The marker argument is accepted and ignored.
        return super().parse_args([a for a in argv if a.startswith("--")])

    def make_cache(self, spec):
        return LeakyCache(spec, self.active_bugs)


if __name__ == "__main__":
    kp.run(LeakyAdapter)
