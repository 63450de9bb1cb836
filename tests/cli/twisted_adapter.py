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
Answer twists, malformed (kvcheck must end the run, exit 2, naming the field):
  read-2-63           every read list of the first write step gets slot 2^63
  out-with-no-outputs capabilities.outputs false, yet answers carry out
Answer twists, well-formed but impossible slots (the case fails at the step,
naming the layer and answer.read[i][j] / answer.written[i]):
  read-minus-two      every read list of the first write step gets slot -2
  written-minus-one   the first write step's written[0] is -1
  decode-minus-four   every decode's written[0] is -4 (a free list's sentinel block -1 of 4 rows)
  written-past-pool   the first write step's written[0] is states * capacity (one past the ring)
Slot events (issue 30 item 1: a begin's are judged as any step's):
  begin-frees-visible the first begin that finds another request live on its layer answers
                      "freed": [the slot of that request's last row] (still visible)
  step-frees-visible  the same free, answered by that begun request's first write step instead
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
    last_slot = {}      # (layer, request) -> the slot of its last written row, while it is live (per case)
    frees_done = False  # begin-frees-visible / step-frees-visible: only once
    pending_free = None  # step-frees-visible: (layer, request, slot) freed by that request's first write

    def op_begin(self, msg):
        answer = super().op_begin(msg)
        if TWIST in ("begin-frees-visible", "step-frees-visible") and not self.frees_done and answer.get("ok"):
            layer, request = msg["layer"], msg["request"]
            live = [s for (l, r), s in sorted(self.last_slot.items()) if l == layer and r != request]
            if live:
                self.frees_done = True
                if TWIST == "begin-frees-visible":
                    answer["freed"] = answer.get("freed", []) + [live[0]]
                else:
                    self.pending_free = (layer, request, live[0])
        return answer

    def op_open(self, msg):
        self.last_slot = {}  # a new case: no request is live
        return super().op_open(msg)

    def op_finish(self, msg):
        self.last_slot.pop((msg["layer"], msg["request"]), None)
        return super().op_finish(msg)

    def op_reset(self, msg):
        self.last_slot.pop((msg["layer"], msg["request"]), None)
        return super().op_reset(msg)

    def op_hello(self, msg):
        answer = super().op_hello(msg)
        if TWIST == "top-level-key":
            answer["capabilites"] = {}
        elif TWIST == "protocol-name":
            answer["protocol"] = "not-kvcheck"
        return answer

    def op_write(self, msg):
        answer = super().op_write(msg)
        if answer.get("ok") and "written" in answer:
            self.last_slot[(msg["layer"], msg["request"])] = answer["written"][-1]
            if self.pending_free and self.pending_free[:2] == (msg["layer"], msg["request"]):
                answer["freed"] = answer.get("freed", []) + [self.pending_free[2]]
                self.pending_free = None
            if TWIST == "decode-minus-four" and msg["op"] == "decode":
                answer["written"][0] = -4
        if self.first_write and answer.get("ok"):
            self.first_write = False
            if TWIST == "read-minus-two":
                for reads in answer["read"]:
                    reads.append(-2)
            elif TWIST == "read-2-63":
                for reads in answer["read"]:
                    reads.append(2**63)
            elif TWIST == "written-minus-one":
                answer["written"][0] = -1
            elif TWIST == "written-past-pool":
                answer["written"][0] = self.cache.spec.states * self.cache.spec.capacity
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
