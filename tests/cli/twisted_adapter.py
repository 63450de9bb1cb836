#!/usr/bin/env python3
"""The bundled ring adapter with one twist in its hello or its answers (tests only).

Usage: twisted_adapter.py TWIST [ring adapter options...]
Hello twists (kvcheck must refuse the handshake, naming the field):
  step-prefill        capabilities.steps lists "prefill" (not a step name)
  format-float32      capabilities.formats lists "float32"
  layout-typo         capabilities.layouts lists "gqa " (a trailing space)
  addressing-typo     capabilities.addressing is "rign"
  unknown-key         capabilities has "max_head_dims" (a misspelled key)
  top-level-key       the hello answer has "capabilites" besides capabilities
  protocol-name       the hello answer's protocol is "not-kvcheck"
  max-states-huge     capabilities.max_states is 2^64 - 1
  max-heads-negative  capabilities.max_heads is -1
  verify-no-accept    capabilities.steps has verify without accept
  outputs-no-slots    capabilities.outputs false and reports no read slots
Answer twists (kvcheck must end the run, naming answer.read[i][j] / answer.written[i]):
  read-minus-two      every read list of the first write step gets slot -2
  read-2-63           every read list of the first write step gets slot 2^63
  written-minus-one   the first write step's written[0] is -1
  out-with-no-outputs capabilities.outputs false, yet answers carry out
"""
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "adapters"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))  # the kvcheck package

from kvcheck import protocol as kp  # noqa: E402
import ring_cache  # noqa: E402

TWIST = sys.argv[1]


class TwistedAdapter(ring_cache.RingAdapter):
    name = "twisted-ring-cache"

    def capabilities(self):
        caps = super().capabilities()
        if TWIST == "step-prefill":
            caps["steps"] = ["prefill", "decode"]
        elif TWIST == "format-float32":
            caps["formats"] = ["f64", "float32"]
        elif TWIST == "layout-typo":
            caps["layouts"] = ["mha", "gqa ", "mqa"]
        elif TWIST == "addressing-typo":
            caps["addressing"] = "rign"
        elif TWIST == "unknown-key":
            caps["max_head_dims"] = 64
        elif TWIST == "max-states-huge":
            caps["max_states"] = 2**64 - 1
        elif TWIST == "max-heads-negative":
            caps["max_heads"] = -1
        elif TWIST == "verify-no-accept":
            caps["steps"] = [s for s in caps["steps"] if s != "accept"]
        elif TWIST == "outputs-no-slots":
            caps["outputs"] = False
            caps["reports"] = {"written_slots": True, "read_slots": False}
        elif TWIST == "out-with-no-outputs":
            caps["outputs"] = False
        return caps


class TwistedSession(kp.Session):
    first_write = True

    def op_hello(self, msg):
        answer = super().op_hello(msg)
        if TWIST == "top-level-key":
            answer["capabilites"] = {}
        elif TWIST == "protocol-name":
            answer["protocol"] = "not-kvcheck"
        return answer

    def op_write(self, msg):
        answer = super().op_write(msg)
        if self.first_write:
            self.first_write = False
            if TWIST == "read-minus-two":
                for reads in answer["read"]:
                    reads.append(-2)
            elif TWIST == "read-2-63":
                for reads in answer["read"]:
                    reads.append(2**63)
            elif TWIST == "written-minus-one":
                answer["written"][0] = -1
        if TWIST == "out-with-no-outputs":
            answer["out"] = [[0.0] * self.cache.spec.q_width for _ in answer["written"]]
        return answer


if __name__ == "__main__":
    adapter = TwistedAdapter()
    adapter.parse_args(sys.argv[2:])
    try:
        code = TwistedSession(adapter).serve(sys.stdin.buffer, sys.stdout.buffer)
    except BrokenPipeError:
        code = 0
    sys.exit(code)
