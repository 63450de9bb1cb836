"""kvcheck.Engine, its helpers, `python3 -m kvcheck` and numpy rows, over the
protocol session (no kvcheck executable needed)."""
import json
import os
import subprocess
import sys

import pytest

import kvcheck
from kvcheck import protocol, testing

SPEC = {"states": 2, "capacity": 5, "window": {"param": 3, "convention": "keys", "keys": 3},
        "q_heads": 2, "kv_heads": 1, "head_dim": 2, "shared_row": False, "format": "f32",
        "rope": {"style": "none", "rotary_dims": 0, "base": 10000.0}, "softmax_scale": 0.5,
        "sink_logit": None, "layers": 1, "max_step_rows": 4}


class Ring(kvcheck.Engine):
    outputs = False
    addressing = "ring"
    seen = []

    def decode(self, step):
        Ring.seen.append(step)
        if step.position > 100:
            raise kvcheck.Refusal("too-long", "position past 100")

        def slot(p): return kvcheck.ring_slot(self.spec, step.state, p)
        return kvcheck.answer(written=[slot(p) for p in step.positions],
                              read=[[slot(j) for j in kvcheck.window(self.spec, p)] for p in step.positions])

    prefill = decode

    def finish(self, layer, state, request):
        pass


class NumpyOut(kvcheck.Engine):
    rows = "numpy"
    formats = ["f64", "f32"]
    seen = []

    def __init__(self, spec):
        super().__init__(spec)
        if spec.format != "f64":
            raise kvcheck.OpenRefused("f64 only")

    def decode(self, step):
        NumpyOut.seen.append(step)
        return kvcheck.answer(out=step.q * 2, stored=kvcheck.stored_rows(step.k, step.v))


def session(engine_class, spec=SPEC):
    s = protocol.Session(kvcheck.EngineAdapter(engine_class))
    hello = json.loads(s.handle(b'{"op":"hello","protocol":"kvcheck-exec","version":1}'))
    opened = json.loads(s.handle(json.dumps({"op": "open", "spec": spec}).encode()))
    return s, hello, opened


def ask(s, msg):
    return json.loads(s.handle(json.dumps(msg).encode()))


def decode(position, q=((1.0, 2.0, 3.0, 4.0),), k=((1.0, -1.0),), v=((0.5, 0.25),)):
    return {"op": "decode", "layer": 0, "request": 7, "state": 1, "position": position,
            "k": [list(r) for r in k], "v": [list(r) for r in v], "q": [list(r) for r in q]}


def test_the_hello_is_what_the_class_defines():
    s, hello, opened = session(Ring)
    assert hello["name"] == "Ring"
    assert hello["capabilities"] == {
        "steps": ["prefill_store_then_load", "decode", "finish"], "formats": ["f32"],
        "rope": ["none", "neox", "interleaved"], "layouts": ["mha", "gqa", "mqa", "shared"],
        "reports": {"written_slots": True, "read_slots": True}, "outputs": False, "addressing": "ring"}
    assert opened == {"ok": True}


def test_a_write_step_answers_slots_and_a_refusal_is_typed():
    s, _, _ = session(Ring)
    assert ask(s, {"op": "begin", "layer": 0, "request": 7, "state": 1}) == {"ok": True}
    # state 1 of capacity 5: slots 5..9; position 6 -> slot 6; window of 3 keys: positions 4, 5, 6.
    assert ask(s, decode(6)) == {"ok": True, "written": [6], "read": [[9, 5, 6]], "read_view": "after_writes"}
    assert list(Ring.seen[-1].positions) == [6]
    assert isinstance(Ring.seen[-1].k, list)
    assert ask(s, decode(101)) == {"ok": False, "error": "too-long", "detail": "position past 100"}
    # Strict as ever: a bool among the numbers never reaches the engine.
    bad = ask(s, decode(3, k=((True, 1.0),)))
    assert bad["error"] == "bad-request" and "decode.k[0][0]" in bad["detail"]


@pytest.mark.filterwarnings("ignore:overflow encountered")
def test_numpy_rows_in_and_arrays_out():
    np = pytest.importorskip("numpy")
    spec = dict(SPEC, format="f64")
    s, hello, opened = session(NumpyOut, spec)
    assert hello["capabilities"]["steps"] == ["decode"] and "outputs" not in hello["capabilities"]
    assert ask(s, decode(0, q=((0.1, 2.0, 1e300, -4.5),))) == {
        "ok": True, "out": [[0.2, 4.0, 2e300, -9.0]], "read_view": "after_writes",
        "stored": {"k": [[1.0, -1.0]], "v": [[0.5, 0.25]]}}
    step = NumpyOut.seen[-1]
    assert isinstance(step.q, np.ndarray) and step.q.dtype == np.float64 and step.q.shape == (1, 4)
    assert step.k.shape == (1, 2) and step.q[0, 0] == 0.1  # exactly the binary64 sent
    # An output that overflows to infinity is never sent.
    assert ask(s, decode(1, q=((1.0, 2.0, 1e308, 0.0),)))["error"] == "non-finite"
    assert ask(s, decode(2, q=((1.0, 2.0, 3.0, 1e999),)))["error"] == "bad-request"
    # numpy scalars encode as numbers.
    assert protocol.encode({"x": np.float32(0.5), "n": np.int64(3)}) == '{"x":0.5,"n":3}'
    assert json.loads(s.handle(json.dumps({"op": "open", "spec": SPEC}).encode())) == {
        "ok": False, "refused": "f64 only"}


def test_a_class_that_declares_nonsense_is_refused_at_start():
    class VerifyOnly(kvcheck.Engine):
        def verify(self, step):
            pass

    class NoWrites(kvcheck.Engine):
        def finish(self, layer, state, request):
            pass

    class BadOrder(kvcheck.Engine):
        prefill_orders = ["load_first"]

        def prefill(self, step):
            pass

    for cls, words in ((VerifyOnly, "verify and accept"), (NoWrites, "at least one of prefill"),
                       (BadOrder, "prefill_orders")):
        with pytest.raises(TypeError, match=words):
            kvcheck.EngineAdapter(cls)
    with pytest.raises(TypeError, match="not a kvcheck.Engine"):
        kvcheck.EngineAdapter(object)


def test_slot_helpers():
    table = [3, -1, 7]
    assert [kvcheck.block_slot(table, p, 4) for p in (0, 1, 5, 9, 11, 12)] == [12, 13, -1, 29, 31, -1]
    spec = protocol.Spec(SPEC)
    assert list(kvcheck.window(spec, 1)) == [0, 1] and list(kvcheck.window(spec, 5)) == [3, 4, 5]
    assert [kvcheck.ring_slot(spec, 1, p) for p in (0, 4, 5, 12)] == [5, 9, 5, 7]


class Rolling(kvcheck.Engine):
    """Answers slot events: a decode pads one slot and moves one row, finish frees."""
    outputs = False

    def decode(self, step):
        return kvcheck.answer(written=[0], read=[[0]], padded=[9], moved=[[0, 1]], freed=[])

    def finish(self, layer, state, request):
        return kvcheck.slot_events(freed=[0, 1])


def test_slot_events_are_answered_by_any_step():
    s, _, _ = session(Rolling)
    assert ask(s, {"op": "begin", "layer": 0, "request": 7, "state": 1}) == {"ok": True}
    assert ask(s, decode(0)) == {"ok": True, "written": [0], "read": [[0]], "read_view": "after_writes",
                                 "padded": [9], "moved": [[0, 1]]}
    assert ask(s, {"op": "finish", "layer": 0, "request": 7, "state": 1}) == {"ok": True, "freed": [0, 1]}
    assert kvcheck.slot_events() == {}


class Caching(Rolling):
    """A prefix cache's finish: one block freed, one kept cached (readable by a later prefix hit)."""
    cached = True

    def finish(self, layer, state, request):
        return kvcheck.slot_events(freed=[2, 3], cached=[0, 1])


def test_cached_slots_are_declared_and_answered():
    assert Caching.hello_capabilities()["reports"] == {"written_slots": True, "read_slots": True, "cached": True}
    assert "cached" not in Rolling.hello_capabilities()["reports"]
    s, _, _ = session(Caching)
    assert ask(s, {"op": "begin", "layer": 0, "request": 7, "state": 1}) == {"ok": True}
    assert ask(s, {"op": "finish", "layer": 0, "request": 7, "state": 1}) == {"ok": True, "freed": [2, 3],
                                                                              "cached": [0, 1]}
    assert kvcheck.answer(written=[0], cached=[4])["cached"] == [4]
    assert "cached" not in kvcheck.answer(written=[0], cached=[])


def test_python_m_kvcheck_serves_a_file_and_keeps_prints_off_stdout(tmp_path):
    module = tmp_path / "printing_cache.py"
    module.write_text("import kvcheck\nprint('imported')\n\n"
                      "class Printing(kvcheck.Engine):\n"
                      "    def decode(self, step):\n"
                      "        print('decoding')\n"
                      "        return kvcheck.answer(out=[[0.0] * self.spec.q_width])\n")
    requests = [{"op": "hello", "protocol": "kvcheck-exec", "version": 1}, {"op": "open", "spec": SPEC},
                {"op": "begin", "layer": 0, "request": 7, "state": 1}, decode(0), {"op": "bye"}]
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(kvcheck.__file__)))
    done = subprocess.run([sys.executable, "-m", "kvcheck", f"{module}:Printing"], env=env, text=True,
                          input="".join(json.dumps(r) + "\n" for r in requests), capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert [a["ok"] for a in answers] == [True] * 5
    assert answers[0]["name"] == "Printing" and answers[3]["out"] == [[0.0, 0.0, 0.0, 0.0]]
    assert "imported" in done.stderr and "decoding" in done.stderr


def test_a_class_kvcheck_cannot_reach_is_named():
    class Local(kvcheck.Engine):
        def decode(self, step):
            pass
    with pytest.raises(TypeError, match="top level of a module"):
        testing.adapter_command(Local, "/nonexistent")
    assert testing.adapter_command("python3 my_adapter.py", "/nonexistent") == "python3 my_adapter.py"


def test_per_layer_windows_in_the_spec_and_window():
    # A sliding layer of 2 keys and a global layer: each layer's window.
    layered = dict(SPEC, layers=2, layer_windows=[{"param": 1, "convention": "left", "keys": 2},
                                                  {"param": None, "convention": None, "keys": None}])
    spec = protocol.Spec(layered)
    assert spec.layer_keys == [2, None]
    assert list(kvcheck.window(spec, 5, 0)) == [4, 5]
    assert list(kvcheck.window(spec, 5, 1)) == [0, 1, 2, 3, 4, 5]
    assert list(kvcheck.window(spec, 5)) == [3, 4, 5]  # the spec's own window
    assert protocol.Spec(SPEC).layer_keys == [3]
    for bad, field in ((dict(layered, layer_windows=layered["layer_windows"][:1]), "spec.layer_windows"),
                       (dict(layered, layer_windows=[{"param": 1, "convention": "left", "keys": 1},
                                                     layered["layer_windows"][1]]), "spec.layer_windows[0].keys"),
                       (dict(layered, layer_windows=[layered["layer_windows"][0],
                                                     {"param": None, "convention": "keys", "keys": None}]),
                        "spec.layer_windows[1]")):
        with pytest.raises(protocol.BadRequest, match=field.replace("[", r"\[").replace("]", r"\]")):
            protocol.Spec(bad)


class Sharing(Ring):
    """A ring that takes shared prefixes: it stores the prefix rows it is sent."""
    prefixes = []

    def begin_prefix(self, layer, state, request, prefix):
        Sharing.prefixes.append(prefix)
        return {"written": [kvcheck.ring_slot(self.spec, state, p) for p in range(prefix.positions)]}


def test_begin_prefix_declares_prefix_sharing_and_answers_written():
    assert "prefix_sharing" not in Ring.hello_capabilities()
    s, hello, _ = session(Sharing)
    assert hello["capabilities"]["prefix_sharing"] is True
    begin = {"op": "begin", "layer": 0, "request": 1, "state": 1, "prefix": {"request": 0, "positions": 2},
             "k": [[1.0, 2.0], [3.0, 4.0]], "v": [[5.0, 6.0], [7.0, 8.0]]}
    assert json.loads(s.handle(json.dumps(begin).encode())) == {"ok": True, "written": [5, 6]}
    prefix = Sharing.prefixes[-1]
    assert (prefix.request, prefix.positions, prefix.k[1], prefix.v[0]) == (0, 2, [3.0, 4.0], [5.0, 6.0])
    # Rows for a prefix are checked as a step's are: two rows for two positions.
    bad = dict(begin, k=[[1.0, 2.0]])
    assert json.loads(s.handle(json.dumps(bad).encode()))["ok"] is False
    # A plain begin still reaches begin().
    assert json.loads(s.handle(b'{"op":"begin","layer":0,"request":2,"state":0}')) == {"ok": True}


class Recomputing(Ring):
    """A ring that leaves a prefix to its first step: the begin stores nothing, the decode
    stores the prefix rows before its own and says where (docs/semantics.md "Recompute in a step")."""
    recompute_in_step = True
    left = {}

    def begin_prefix(self, layer, state, request, prefix):
        Recomputing.left[request] = list(range(prefix.positions))
        return {"written": [-1] * prefix.positions, "recompute": Recomputing.left[request]}

    def decode(self, step):
        def slot(p): return kvcheck.ring_slot(self.spec, step.state, p)
        left = Recomputing.left.pop(step.request, [])
        return kvcheck.answer(written=[slot(p) for p in step.positions],
                              read=[[slot(j) for j in kvcheck.window(self.spec, p)] for p in step.positions],
                              recomputed=[(p, slot(p)) for p in left])


def test_recompute_in_step_is_declared_and_its_lists_reach_the_answers():
    assert "recompute_in_step" not in Sharing.hello_capabilities()
    s, hello, _ = session(Recomputing)
    assert hello["capabilities"]["recompute_in_step"] is True
    begin = {"op": "begin", "layer": 0, "request": 7, "state": 1, "prefix": {"request": 0, "positions": 2},
             "k": [[1.0, 2.0], [3.0, 4.0]], "v": [[5.0, 6.0], [7.0, 8.0]]}
    assert ask(s, begin) == {"ok": True, "written": [-1, -1], "recompute": [0, 1]}
    answer = ask(s, decode(2))
    assert answer["recomputed"] == [[0, 5], [1, 6]]  # state 1 of a ring of 5: slots 5, 6
    assert "recomputed" not in ask(s, decode(3))  # nothing left
    # Declared without a begin that carries rows, or not a bool: refused at start.
    for attrs, words in (({"recompute_in_step": 1}, "recompute_in_step: True or False"),):
        with pytest.raises(TypeError, match=words):
            type("Bad", (Recomputing,), attrs).hello_capabilities()

    class NoPrefix(Ring):
        recompute_in_step = True
    with pytest.raises(TypeError, match="recompute_in_step: needs begin_prefix or resume"):
        NoPrefix.hello_capabilities()


class Preempting(Ring):
    """A ring that preempts: it frees the request's slots, and its resume stores every row sent."""
    resumed = []

    def preempt(self, layer, state, request):
        return kvcheck.slot_events(freed=[kvcheck.ring_slot(self.spec, state, 0)])

    def resume(self, layer, state, request, prefix):
        Preempting.resumed.append(prefix)
        return {"written": [kvcheck.ring_slot(self.spec, state, p) for p in range(prefix.positions)]}


def test_preempt_and_resume_are_declared_together_and_reach_their_methods():
    assert "preempt" not in Ring.hello_capabilities()["steps"]
    s, hello, _ = session(Preempting)
    assert "preempt" in hello["capabilities"]["steps"]
    assert "prefix_sharing" not in hello["capabilities"]  # a resume is no other request's prefix
    assert json.loads(s.handle(b'{"op":"begin","layer":0,"request":1,"state":1}')) == {"ok": True}
    freed = json.loads(s.handle(b'{"op":"preempt","layer":0,"request":1,"state":1}'))
    assert freed == {"ok": True, "freed": [kvcheck.ring_slot(protocol.Spec(SPEC), 1, 0)]}
    begin = {"op": "begin", "layer": 0, "request": 1, "state": 1, "prefix": {"request": 1, "positions": 2},
             "k": [[1.0, 2.0], [3.0, 4.0]], "v": [[5.0, 6.0], [7.0, 8.0]]}
    assert json.loads(s.handle(json.dumps(begin).encode())) == {"ok": True, "written": [5, 6]}
    assert (Preempting.resumed[-1].request, Preempting.resumed[-1].positions) == (1, 2)

    class Half(Ring):
        def preempt(self, layer, state, request):
            pass

    with pytest.raises(TypeError, match="preempt and resume go together"):
        Half.hello_capabilities()


def test_lookahead_and_free_deferral_are_declared_in_hello():
    class Slack(Ring):
        addressing = "paged"
        lookahead_slots = 4
        free_deferral_steps = 2
        capabilities = {"block_size": 4, "reports": {"written_slots": True, "read_slots": True, "frees": True}}

    caps = Slack.hello_capabilities()
    assert (caps["lookahead_slots"], caps["free_deferral_steps"]) == (4, 2)
    # Nothing declared: neither key (an old kvcheck reads the same hello).
    assert "lookahead_slots" not in Ring.hello_capabilities()
    assert "free_deferral_steps" not in Ring.hello_capabilities()

    class Zero(Slack):
        free_deferral_steps = 0  # frees with the step that leaves them: a deadline of 0 is declared

    assert Zero.hello_capabilities()["free_deferral_steps"] == 0
    for bad in (-1, 65537, 2.0, True, "4"):
        class Bad(Slack):
            lookahead_slots = bad
        with pytest.raises(TypeError, match="lookahead_slots: an integer in 0..65536"):
            Bad.hello_capabilities()

    class NoFrees(Slack):
        capabilities = {"block_size": 4}
    with pytest.raises(TypeError, match="free_deferral_steps: a free deferral needs frees reported"):
        NoFrees.hello_capabilities()


def test_shared_pool_is_declared_in_hello():
    class Hybrid(Ring):
        addressing = "paged"
        shared_pool = True
        capabilities = {"block_size": 4}

    assert Hybrid.hello_capabilities()["shared_pool"] is True
    assert "shared_pool" not in Ring.hello_capabilities()  # nothing declared: no key
    for bad in (1, "yes", None):
        class Bad(Hybrid):
            shared_pool = bad
        with pytest.raises(TypeError, match="shared_pool: True or False"):
            Bad.hello_capabilities()

    class RingShared(Ring):
        shared_pool = True
    with pytest.raises(TypeError, match="shared_pool: a pool shared by the layers needs paged or opaque"):
        RingShared.hello_capabilities()


def test_output_format_is_declared_and_round_output_rounds_to_nearest_even():
    class Bf16Out(kvcheck.Engine):
        output_format = "bf16"

        def decode(self, step):
            return kvcheck.answer(out=[kvcheck.round_output(q, self.output_format) for q in step.q])

    s, hello, _ = session(Bf16Out)
    assert hello["capabilities"]["output_format"] == "bf16"
    assert "output_format" not in session(NumpyOut)[1]["capabilities"]
    # A declared format that is not one, or one on an engine without outputs, is refused at start.
    for attrs, words in (({"output_format": "bfloat16"}, "output_format: one of"),
                         ({"output_format": "fp16", "outputs": False}, "output_format needs outputs")):
        cls = type("Bad", (Bf16Out,), attrs)
        with pytest.raises(TypeError, match=words):
            kvcheck.EngineAdapter(cls)
    r = kvcheck.round_output
    # bf16: 8 significand bits, ties to even, straight from the double.
    assert r([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -40], "bf16") == [1.0, 1 + 2 ** -6, 1 + 2 ** -7]
    assert r([0.905148], "bf16") == [0.90625] and r([0.905148], "bf16", truncate=True) == [0.90234375]
    # fp16: 11 bits, subnormals from 2^-24, 65520 (the tie past 65504) overflows.
    assert r([1 + 2 ** -11, 65519.0, 65520.0, 2 ** -24, -1e-9], "fp16") == [1.0, 65504.0, float("inf"), 2 ** -24, -0.0]
    with pytest.raises(ValueError, match="output_format"):
        r([1.0], "fp8")
