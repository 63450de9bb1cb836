"""Binary frames in the protocol session (adapters/PROTOCOL.md "Binary
frames"): negotiated at hello, rows in as little-endian f64, outputs and
stored rows out as one frame, read as strictly as JSON, and the stream kept
in step (no kvcheck executable needed)."""
import io
import json
import math
import struct

import pytest

import kvcheck
from kvcheck import protocol

SPEC = {"states": 2, "capacity": 5, "window": {"param": 3, "convention": "keys", "keys": 3},
        "q_heads": 2, "kv_heads": 1, "head_dim": 2, "shared_row": False, "format": "f64",
        "rope": {"style": "none", "rotary_dims": 0, "base": 10000.0}, "softmax_scale": 0.5,
        "sink_logit": None, "layers": 1, "max_step_rows": 4}
HELLO = {"op": "hello", "protocol": "kvcheck-exec", "version": 1, "encodings": ["binary", "json"]}


class Doubler(kvcheck.Engine):
    """out = 2 q; stored rows as sent; rows as lists."""
    formats = ["f64"]
    seen = []

    def decode(self, step):
        Doubler.seen.append(step)
        if step.position == 99:
            return kvcheck.answer(out=[[1.0]], stored=kvcheck.stored_rows(step.k, step.v))  # a wrong shape
        return kvcheck.answer(out=[[2 * x for x in row] for row in step.q],
                              stored=kvcheck.stored_rows(step.k, step.v))

    prefill = decode


class NumpyDoubler(Doubler):
    rows = "numpy"

    def decode(self, step):
        Doubler.seen.append(step)
        return kvcheck.answer(out=step.q * 2, stored=kvcheck.stored_rows(step.k, step.v))

    prefill = decode


def line(msg):
    return json.dumps(msg).encode() + b"\n"


def f64(rows):
    return b"".join(struct.pack("<%dd" % len(r), *r) for r in rows)


def prefill(position, k, v, q, arrays=None, payload=None):
    """A framed prefill request: its line and its frame's bytes."""
    n = len(k)
    arrays = arrays or [["k", n, 2], ["v", n, 2], ["q", n, 4]]
    payload = f64(k) + f64(v) + f64(q) if payload is None else payload
    msg = {"op": "prefill", "layer": 0, "request": 7, "state": 1, "position": position, "rows": n,
           "order": "store_then_load", "frame": {"dtype": "f64", "bytes": len(payload), "arrays": arrays}}
    return line(msg) + payload


def serve(engine, requests, hello=HELLO):
    """The answers (header dict, frame bytes) of a session over `requests`."""
    stdin = io.BytesIO(line(hello) + line({"op": "open", "spec": SPEC}) + b"".join(requests))
    stdout = io.BytesIO()
    protocol.Session(kvcheck.EngineAdapter(engine)).serve(stdin, stdout)
    data, answers = stdout.getvalue(), []
    while data:
        head, data = data.split(b"\n", 1)
        header = json.loads(head)
        size = header.get("frame", {}).get("bytes", 0)
        answers.append((header, data[:size]))
        data = data[size:]
    return answers


K, V, Q = [[1.0, -1.0], [0.5, 3.0]], [[0.25, 0.5], [-2.0, 1e-300]], [[0.1, 2.0, 3.0, -4.5], [1.0, 2.0, 3.0, 4.0]]


@pytest.mark.parametrize("engine", [Doubler, NumpyDoubler])
def test_rows_arrive_and_outputs_leave_as_frames(engine):
    if engine is NumpyDoubler:
        pytest.importorskip("numpy")
    answers = serve(engine, [prefill(0, K, V, Q)])
    hello, opened, (header, frame) = answers
    assert hello[0]["encoding"] == "binary" and opened[0] == {"ok": True}
    assert header == {"ok": True, "read_view": "after_writes", "frame": {
        "dtype": "f64", "bytes": 128, "arrays": [["out", 2, 4], ["stored.k", 2, 2], ["stored.v", 2, 2]]}}
    assert frame == f64([[2 * x for x in r] for r in Q]) + f64(K) + f64(V)
    step = Doubler.seen[-1]
    rows = [[list(map(float, r)) for r in x] for x in (step.k, step.v, step.q)]
    assert rows == [K, V, Q]  # exactly the binary64 values sent


def test_hello_offers_and_the_adapter_chooses():
    assert serve(Doubler, [], hello={"op": "hello", "protocol": "kvcheck-exec", "version": 1})[0][0].get(
        "encoding") is None
    Declines = type("Declines", (Doubler,), {})
    adapter = kvcheck.EngineAdapter(Declines)
    adapter.encodings = ("json",)
    s = protocol.Session(adapter)
    assert json.loads(s.handle(line(HELLO)))["encoding"] == "json" and not s.binary
    bad = json.loads(protocol.Session(kvcheck.EngineAdapter(Doubler)).handle(line(dict(HELLO, encodings=["f16"]))))
    assert bad["error"] == "bad-request" and "hello.encodings" in bad["detail"]
    # A frame without binary negotiated: refused, and the stream stays in step.
    answers = serve(Doubler, [prefill(0, K, V, Q), line({"op": "close"})],
                    hello={"op": "hello", "protocol": "kvcheck-exec", "version": 1})
    assert "binary frames were not negotiated" in answers[2][0]["detail"]
    assert answers[3][0] == {"ok": True}


def test_a_frame_that_disagrees_with_the_step_is_a_bad_request_and_the_stream_stays_in_step():
    nan = f64(K) + f64(V) + f64([[math.nan, 2.0, 3.0, 4.0], Q[1]])
    swapped = [["v", 2, 2], ["k", 2, 2], ["q", 2, 4]]
    short = f64(K) + f64(V) + f64(Q)[:-8]
    answers = serve(Doubler, [prefill(0, K, V, Q, arrays=swapped), prefill(0, K, V, Q, payload=nan),
                              prefill(0, K, V, Q, arrays=[["k", 2, 2], ["v", 2, 2], ["q", 2, 4]], payload=short),
                              line({"op": "close"})])
    details = [a[0].get("detail", "") for a in answers[2:5]]
    assert "prefill.frame.arrays: expected" in details[0]
    assert details[1] == "prefill.q: not finite"
    assert "disagrees with the arrays' shapes" in details[2]
    assert answers[5][0] == {"ok": True}


def test_a_frame_length_that_cannot_be_followed_ends_the_session():
    forged = line({"op": "prefill", "layer": 0, "request": 7, "state": 1, "position": 0, "rows": 1,
                   "order": "store_then_load", "frame": {"dtype": "f64", "bytes": 1 << 40, "arrays": []}})
    answers = serve(Doubler, [forged, line({"op": "close"})])
    assert len(answers) == 3 and "frame.bytes" in answers[2][0]["detail"]
    # Input that ends inside a frame: no answer, the session ends.
    assert len(serve(Doubler, [prefill(0, K, V, Q)[:-5]])) == 2


def test_an_answer_of_the_wrong_shape_stays_json_for_kvcheck_to_judge():
    (header, frame), = serve(Doubler, [prefill(99, K, V, Q)])[2:]
    assert header["out"] == [[1.0]] and header["frame"]["arrays"] == [["stored.k", 2, 2], ["stored.v", 2, 2]]
    assert frame == f64(K) + f64(V)
