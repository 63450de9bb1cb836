#!/usr/bin/env python3
"""Tests of the Python exec adapters (ring_cache.py, paged_cache.py).

    python3 adapters/test_adapters.py        (from the repository root; a few seconds)

Each adapter runs as a subprocess and is spoken to over kvcheck exec protocol
v1 (adapters/PROTOCOL.md), as kvcheck does. The judge here is written
independently of the adapters: its own RoPE, rounding (bf16 through exact
fractions, f32 through struct), attention with plain sums, and a small shadow
map (slot -> the row last reported written there) that checks every query
read exactly the latest row of each visible position and nothing else, in the
answer's read view. The default caches must pass hand-made and randomly
generated schedules (sized as kvcheck's generator sizes them); every bug
switch must fail a crafted one and some generated ones; malformed requests
must get ok:false; and, when `jsonschema` is importable, every line sent and
received must validate against scenarios/schema/exec-protocol.schema.json
(against the whole request/answer `oneOf`; in the tests that run many
generated schedules, against the one definition the line's op or shape names,
which is several times faster).
"""

import json
import math
import os
import random
import struct
import subprocess
import sys
import unittest
from collections import Counter
from fractions import Fraction

sys.dont_write_bytecode = True  # keep adapters/ free of __pycache__

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RING = os.path.join(HERE, "ring_cache.py")
PAGED = os.path.join(HERE, "paged_cache.py")
SCHEMA_PATH = os.path.join(ROOT, "scenarios", "schema", "exec-protocol.schema.json")

sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))
from kvcheck import protocol as kvcheck_protocol  # noqa: E402  (the library an engine's adapter imports, on its own)
import window_cache  # noqa: E402  (only for unit tests of its rounding)

try:
    import jsonschema
except ImportError:  # the schema checks are skipped
    jsonschema = None


def _load_schema():
    if jsonschema is None:
        return None
    with open(SCHEMA_PATH, encoding="utf-8") as f:
        root = json.load(f)
    jsonschema.Draft202012Validator.check_schema(root)
    return root


SCHEMA = _load_schema()
_VALIDATORS = {}


def validator(name):
    """A validator of one definition of the protocol schema ("request", "answer", "decode", ...)."""
    if name not in _VALIDATORS:
        _VALIDATORS[name] = jsonschema.Draft202012Validator(
            {"$schema": SCHEMA["$schema"], "$defs": SCHEMA["$defs"], "$ref": "#/$defs/" + name})
    return _VALIDATORS[name]


REQUEST_SCHEMA = validator("request") if SCHEMA else None
ANSWER_SCHEMA = validator("answer") if SCHEMA else None


def answer_kind(answer):
    """The one answer definition a well-formed answer matches."""
    if "capabilities" in answer:
        return "hello_answer"
    if "out" in answer or "written" in answer:  # a bookkeeping-only engine answers no out
        return "step_answer"
    if "refused" in answer:
        return "refused_answer"
    if "error" in answer:
        return "error_answer"
    return "ok_answer"


def check_schema(msg, is_request, exact):
    """Validates one line. `exact`: against the whole request/answer `oneOf`
    (which also checks exactly one alternative matches); otherwise, faster,
    against the one alternative the line's op (or shape) names."""
    if SCHEMA is None:
        return
    if exact:
        v = REQUEST_SCHEMA if is_request else ANSWER_SCHEMA
    elif is_request:
        v = validator(msg["op"]) if isinstance(msg.get("op"), str) and msg["op"] in SCHEMA["$defs"] \
            else REQUEST_SCHEMA
    else:
        v = validator(answer_kind(msg))
    errors = sorted(v.iter_errors(msg), key=str)
    assert not errors, (f"{'request' if is_request else 'answer'} {json.dumps(msg)[:300]} "
                        f"breaks the schema: {errors[0].message}")


# ---------------------------------------------------------------------------
# Talking to an adapter

class Adapter:
    """One adapter child process. send() validates both lines against the schema."""

    def __init__(self, script, *args, exact_schema=True):
        self.exact_schema = exact_schema
        self.args = [sys.executable, script, *args]
        self.proc = subprocess.Popen(self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)

    def send_raw(self, line):
        self.proc.stdin.write(line.encode("utf-8") + b"\n")
        self.proc.stdin.flush()
        out = self.proc.stdout.readline()
        if not out:
            raise AssertionError(f"{self.args}: no answer to {line[:200]}; stderr: "
                                 f"{self.proc.stderr.read().decode(errors='replace')[-2000:]}")
        text = out.decode("utf-8")
        assert text.endswith("\n") and "\n" not in text[:-1], "one answer line"
        answer = json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
        check_schema(answer, False, self.exact_schema)
        return answer

    def send(self, msg):
        check_schema(msg, True, self.exact_schema)
        return self.send_raw(json.dumps(msg, allow_nan=False))

    def hello(self):
        return self.send({"op": "hello", "protocol": "kvcheck-exec", "version": 1})

    def bye(self):
        answer = self.send({"op": "bye"})
        rc = self.proc.wait(timeout=10)
        self._close_pipes()
        return answer, rc

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._close_pipes()

    def _close_pipes(self):
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                f.close()
            except OSError:
                pass


# ---------------------------------------------------------------------------
# The judge's own math (independent of window_cache.py)

def send_rows_step(adapter, target, op, position, n=1, **fields):
    """Sends a write step of n constant rows (head_dim 4) at `position` for
    `target` (layer, request, state), with `fields` added; returns the answer."""
    m = {"op": op, **target, "position": position, "k": [[0.1] * 4] * n, "v": [[0.2] * 4] * n,
         "q": [[0.3] * 4] * n}
    m.update(fields)
    return adapter.send(m)


def make_spec(states=1, capacity=8, param=4, convention="keys", q_heads=1, kv_heads=1, head_dim=4,
              shared_row=False, fmt="f64", style="none", rotary_dims=0, base=10000.0,
              softmax_scale=None, sink=None, layers=1, max_step_rows=16):
    keys = param if convention == "keys" else param + 1
    return {"states": states, "capacity": capacity,
            "window": {"param": param, "convention": convention, "keys": keys},
            "q_heads": q_heads, "kv_heads": kv_heads, "head_dim": head_dim,
            "shared_row": shared_row, "format": fmt,
            "rope": {"style": style, "rotary_dims": rotary_dims, "base": base},
            "softmax_scale": 1 / math.sqrt(head_dim) if softmax_scale is None else softmax_scale,
            "sink_logit": sink, "layers": layers, "max_step_rows": max_step_rows}


def ref_rope(row, heads, head_dim, position, rope):
    out = list(row)
    r = rope["rotary_dims"]
    if rope["style"] == "none" or r == 0:
        return out
    for h in range(heads):
        for i in range(r // 2):
            angle = position * rope["base"] ** (-2 * i / r)
            if rope["style"] == "neox":
                a, b = h * head_dim + i, h * head_dim + i + r // 2
            else:
                a, b = h * head_dim + 2 * i, h * head_dim + 2 * i + 1
            x, y = out[a], out[b]
            out[a] = x * math.cos(angle) - y * math.sin(angle)
            out[b] = x * math.sin(angle) + y * math.cos(angle)
    return out


def ref_bf16(x):
    """Exact round-to-nearest-even to 8 significant bits, binary32 exponents."""
    if x == 0 or not math.isfinite(x):
        return x
    a = abs(Fraction(x))
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1  # now 2^e <= a < 2^(e+1)
    quantum = Fraction(2) ** (max(e, -126) - 7)
    q, rem = divmod(a, quantum)
    if 2 * rem > quantum or (2 * rem == quantum and q % 2 == 1):
        q += 1
    y = q * quantum
    if y >= Fraction(2) ** 128:
        return math.copysign(math.inf, x)
    return math.copysign(float(y), x)


def ref_round(row, fmt):
    if fmt == "f32":
        return [struct.unpack("<f", struct.pack("<f", x))[0] for x in row]
    if fmt == "bf16":
        return [ref_bf16(x) for x in row]
    return list(row)


def ref_attend(q, rows, spec):
    hd = spec["head_dim"]
    group = spec["q_heads"] // spec["kv_heads"]
    sink = spec["sink_logit"]
    out = []
    for h in range(spec["q_heads"]):
        g = h // group
        scores = [spec["softmax_scale"] * sum(q[h * hd + d] * k[g * hd + d] for d in range(hd))
                  for k, _ in rows]
        m = max(scores + ([sink] if sink is not None else []))
        ex = [math.exp(s - m) for s in scores]
        total = sum(ex) + (math.exp(sink - m) if sink is not None else 0.0)
        for d in range(hd):
            out.append(sum(e / total * v[g * hd + d] for e, (_, v) in zip(ex, rows)))
    return out


# ---------------------------------------------------------------------------
# Running and judging a schedule

class Case:
    """One open...close of an adapter, judged step by step.

    `requests` maps request id -> state id. Steps are dicts: {"kind": "prefill",
    "request": r, "rows": n, "order": ...}, decode, verify (drafts), accept
    (accepted), finish, reset. Rows come from `seed`. `failures` collects what
    the judge found; a refused step is a failure too (and stops the case)."""

    def __init__(self, adapter, spec, requests, seed=0, ring=True):
        self.adapter = adapter
        self.spec = spec
        self.requests = requests
        self.rng = random.Random(seed)
        self.ring = ring
        self.keys = spec["window"]["keys"]
        self.failures = []
        self.answers = []  # every answer of a write step (for comparing runs)
        self.progress = {r: {"begun": False, "length": 0, "pending": None} for r in requests}
        self.layers = [{"shadow": {}, "latest": {}, "rows": {}, "seq": 0} for _ in range(spec["layers"])]
        answer = adapter.send({"op": "open", "spec": spec})
        assert answer == {"ok": True}, answer

    def close(self):
        assert self.adapter.send({"op": "close"}) == {"ok": True}

    def fail(self, what):
        self.failures.append(what)

    def rows(self, n, width):
        return [[self.rng.uniform(-1.0, 1.0) for _ in range(width)] for _ in range(n)]

    def run(self, steps):
        for index, step in enumerate(steps):
            if not self.step(index, step):
                break
        return self.failures

    def step(self, index, step):
        kind = step["kind"]
        r = step["request"]
        prog = self.progress[r]
        state = self.requests[r]
        spec = self.spec
        for layer in range(spec["layers"]):
            target = {"layer": layer, "request": r, "state": state}
            if not prog["begun"]:
                a = self.adapter.send({"op": "begin", **target})
                if not a.get("ok"):
                    self.fail(f"step {index}: begin refused: {a}")
                    return False
            if kind in ("accept", "finish", "reset"):
                msg = {"op": kind, **target}
                if kind == "accept":
                    msg["accepted"] = step["accepted"]
                a = self.adapter.send(msg)
                # ok, with the slots it freed when the cache reports frees.
                if a.get("ok") is not True or set(a) - {"ok", "freed"}:
                    self.fail(f"step {index} ({kind}): refused: {a}")
                    return False
                continue
            n = {"prefill": step.get("rows"), "decode": 1, "verify": step.get("drafts", 0) + 1}[kind]
            msg = {"op": kind, **target, "position": prog["length"]}
            if kind == "prefill":
                msg["rows"] = n
                msg["order"] = step["order"]
            if kind == "verify":
                msg["drafts"] = step["drafts"]
            kw = spec["kv_heads"] * spec["head_dim"]
            msg["k"] = self.rows(n, kw)
            if not spec["shared_row"]:
                msg["v"] = self.rows(n, kw)
            msg["q"] = self.rows(n, spec["q_heads"] * spec["head_dim"])
            a = self.adapter.send(msg)
            if not a.get("ok"):
                self.fail(f"step {index} ({kind}): refused: {a}")
                return False
            self.answers.append(a)
            self.judge(index, layer, r, state, prog["length"], msg, a)
        prog["begun"] = True
        if kind in ("prefill", "decode"):
            prog["length"] += {"prefill": step.get("rows"), "decode": 1}[kind]
        elif kind == "verify":
            prog["pending"] = prog["length"]
            prog["length"] += step["drafts"] + 1
        elif kind == "accept":
            prog["length"] = prog["pending"] + 1 + step["accepted"]
            prog["pending"] = None
        elif kind == "reset":
            prog["length"] = 0
            prog["pending"] = None
        elif kind == "finish":
            prog["pending"] = None
        return True

    def judge(self, index, layer, r, state, first, msg, a):
        spec = self.spec
        lm = self.layers[layer]
        n = len(msg["k"])
        qw = spec["q_heads"] * spec["head_dim"]
        where = f"step {index} layer {layer} ({msg['op']})"
        out, written, read = a.get("out"), a.get("written"), a.get("read")
        if (not isinstance(out, list) or len(out) != n or any(len(o) != qw for o in out)
                or not isinstance(written, list) or len(written) != n
                or not isinstance(read, list) or len(read) != n):
            self.fail(f"{where}: answer shape {json.dumps(a)[:200]}")
            return
        view = a.get("read_view", "after_writes")
        if len(set(written)) != n:
            self.fail(f"{where}: two rows of the step in one slot: {written}")
        cap = spec["capacity"]
        before = {}
        tags = []
        rope = spec["rope"]
        for j, s in enumerate(written):
            p = first + j
            if self.ring and not state * cap <= s < (state + 1) * cap:
                self.fail(f"{where}: row {p} written to slot {s} outside state {state}'s block")
            before.setdefault(s, lm["shadow"].get(s))
            lm["seq"] += 1
            tag = (r, p, lm["seq"])
            lm["shadow"][s] = tag
            lm["latest"][(r, p)] = lm["seq"]
            tags.append(tag)
            key = ref_round(ref_rope(msg["k"][j], spec["kv_heads"], spec["head_dim"], p, rope), spec["format"])
            value = key if spec["shared_row"] else ref_round(msg["v"][j], spec["format"])
            lm["rows"][(r, p)] = (key, value)
        for i in range(n):
            p = first + i
            visible = range(max(0, p - self.keys + 1), p + 1)
            got = Counter()
            for s in read[i]:
                if s == -1:
                    continue
                tag = None
                if view == "causal":
                    for j in range(i, -1, -1):  # the step's own rows up to query i
                        if written[j] == s:
                            tag = tags[j]
                            break
                    if tag is None:
                        tag = before[s] if s in before else lm["shadow"].get(s)
                else:
                    tag = lm["shadow"].get(s)
                got[tag] += 1
            want = Counter((r, x, lm["latest"][(r, x)]) for x in visible)
            lost = sorted(t[1] for t in (want - got))
            extra = sorted(got - want, key=str)
            if lost:
                self.fail(f"{where}: query at {p} lost visible rows {lost}")
            if extra:
                self.fail(f"{where}: query at {p} read extra rows {extra}")
            q = ref_rope(msg["q"][i], spec["q_heads"], spec["head_dim"], p, rope)
            rows = [lm["rows"][(r, x)] for x in visible]
            ref = ref_attend(q, rows, spec)
            vmax = max(1.0, max(abs(x) for _, v in rows for x in v))
            diff = max(abs(x - y) for x, y in zip(out[i], ref))
            if not diff <= 1e-12 * vmax:
                self.fail(f"{where}: query at {p} output differs by {diff:.3g}")


def random_case(seed, conventions=("keys", "keys", "keys", "keys", "left", "off-by-one")):
    """A schedule drawn as kvcheck's generator draws one (properties/generator.cpp):
    swarm step weights, a ring sized to the docs/semantics.md "Safe capacity" minimum plus 0..2 rows."""
    rng = random.Random(seed)
    kinds = ["lts", "stl", "decode", "verify", "finish", "reset"]
    weights = {k: (rng.randint(1, 4) if rng.random() < 2 / 3 else 0) for k in kinds}
    if weights["lts"] + weights["stl"] + weights["decode"] + weights["verify"] == 0:
        weights["decode"] = 2
    weights["finish"] = min(weights["finish"], 1)
    weights["reset"] = min(weights["reset"], 1)
    param = rng.randint(1, 7)
    convention = rng.choice(conventions)
    keys = param if convention == "keys" else param + 1
    max_drafts = rng.randint(1, 4) if weights["verify"] else 0
    max_chunk = rng.randint(1, 2 * keys + 2) if weights["lts"] + weights["stl"] else 1
    safe = max(keys + max_drafts, max_chunk)
    if weights["stl"]:
        safe = max(safe, keys + max_chunk - 1)
    capacity = safe + rng.choice([0, 0, 0, 0, 0, 1, 2])
    kv_heads = rng.randint(1, 2)
    q_heads = kv_heads * rng.randint(1, 2)
    head_dim = rng.choice([2, 4, 8])
    style, rotary = "none", 0
    if rng.random() < 2 / 3:
        style = rng.choice(["neox", "interleaved"])
        rotary = 2 * rng.randint(1, head_dim // 2)
    spec = make_spec(states=rng.randint(1, 3), capacity=capacity, param=param, convention=convention,
                     q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim,
                     shared_row=kv_heads == 1 and rng.random() < 0.25,
                     fmt=rng.choice(["f64", "f64", "f32", "bf16"]), style=style, rotary_dims=rotary,
                     base=rng.choice([10000.0, 100.0]),
                     sink=float(rng.randint(-2, 2)) if rng.random() < 1 / 6 else None,
                     layers=2 if rng.random() < 1 / 6 else 1,
                     max_step_rows=max(max_chunk, max_drafts + 1))
    requests = {r: rng.randrange(spec["states"]) for r in range(rng.randint(1, 3))}
    live = {r: {"started": False, "finished": False, "pending": None} for r in requests}
    holder = {}
    steps = []
    for _ in range(rng.randint(4, 16)):
        ready = [r for r in requests if not live[r]["finished"]
                 and (live[r]["started"] or requests[r] not in holder)]
        if not ready:
            break
        r = rng.choice(ready)
        lv = live[r]
        if lv["pending"] is not None:
            step = {"kind": "accept", "request": r, "accepted": rng.randint(0, lv["pending"])}
            lv["pending"] = None
        else:
            kind = rng.choices(kinds, weights=[weights[k] for k in kinds])[0]
            if kind in ("lts", "stl"):
                rows = max_chunk if rng.random() < 0.5 else rng.randint(1, max_chunk)
                step = {"kind": "prefill", "request": r, "rows": rows,
                        "order": "load_then_store" if kind == "lts" else "store_then_load"}
            elif kind == "verify":
                step = {"kind": "verify", "request": r, "drafts": rng.randint(0, max_drafts)}
                lv["pending"] = step["drafts"]
            elif kind in ("finish", "reset") and lv["started"]:
                step = {"kind": kind, "request": r}
            else:
                step = {"kind": "decode", "request": r}
        if not lv["started"]:
            lv["started"] = True
            holder[requests[r]] = r
        if step["kind"] == "finish":
            lv["finished"] = True
            del holder[requests[r]]
        steps.append(step)
    for r in requests:
        if live[r]["pending"] is not None:
            steps.append({"kind": "accept", "request": r, "accepted": rng.randint(0, live[r]["pending"])})
    return spec, requests, steps


def prefill(r, n, order="load_then_store"):
    return {"kind": "prefill", "request": r, "rows": n, "order": order}


def decode(r):
    return {"kind": "decode", "request": r}


def verify(r, k):
    return {"kind": "verify", "request": r, "drafts": k}


def accept(r, a):
    return {"kind": "accept", "request": r, "accepted": a}


# ---------------------------------------------------------------------------

class AdapterTest(unittest.TestCase):
    def start(self, script, *args, exact_schema=True):
        adapter = Adapter(script, *args, exact_schema=exact_schema)
        self.addCleanup(adapter.kill)
        hello = adapter.hello()
        self.assertTrue(hello["ok"], hello)
        return adapter

    def run_case(self, adapter, spec, requests, steps, seed=0, ring=True):
        case = Case(adapter, spec, requests, seed=seed, ring=ring)
        failures = case.run(steps)
        case.close()
        return failures, case


class ProtocolTest(AdapterTest):
    def test_hello_capabilities_and_bye(self):
        for script, addressing in ((RING, "ring"), (PAGED, "paged")):
            adapter = self.start(script)
            hello = adapter.hello()
            self.assertEqual(hello["protocol"], "kvcheck-exec")
            self.assertEqual(hello["version"], 1)
            caps = hello["capabilities"]
            self.assertEqual(caps["addressing"], addressing)
            # Only the ring declares trim (the paged cache frees rows a trim could return to).
            self.assertEqual(set(caps["steps"]), {"prefill_load_then_store", "prefill_store_then_load",
                                                  "decode", "verify", "accept", "finish", "reset"} |
                             ({"trim"} if script == RING else set()))
            self.assertEqual(caps["formats"], ["f64", "f32", "bf16"])
            # The paged cache also answers the slots it frees.
            self.assertEqual(caps["reports"], {"written_slots": True, "read_slots": True} |
                             ({"frees": True} if script == PAGED else {}))
            answer, rc = adapter.bye()
            self.assertEqual(answer, {"ok": True})
            self.assertEqual(rc, 0)

    def test_ring_output_format_is_declared_or_not(self):
        # --output-format declares it; --undeclared-output-format rounds without saying so.
        for args, declared in ((["--output-format", "bf16"], "bf16"), (["--bug", "output-truncated"], "bf16"),
                               (["--output-format", "fp16"], "fp16"),
                               (["--output-format", "bf16", "--undeclared-output-format"], None), ([], None)):
            adapter = Adapter(RING, *args)
            self.addCleanup(adapter.kill)
            self.assertEqual(adapter.hello()["capabilities"].get("output_format"), declared, args)
            self.assertEqual(adapter.bye()[1], 0)
        for args in (["--undeclared-output-format"], ["--output-format", "bf16", "--no-outputs"],
                     ["--output-format", "bfloat16"]):
            bad = subprocess.run([sys.executable, RING, *args], capture_output=True, text=True, input="")
            self.assertNotEqual(bad.returncode, 0, args)

    def test_end_of_input_exits_zero(self):
        adapter = self.start(PAGED, "--block-size", "2")
        adapter.proc.stdin.close()
        self.assertEqual(adapter.proc.wait(timeout=10), 0)
        self.assertEqual(adapter.proc.stdout.read(), b"")

    def test_list_bugs_and_bad_flags(self):
        for script, names in ((RING, ["ring-sized-window", "rope-at-slot", "window-plus-one", "zero-output", "bf16-truncate",
                                      "keep-drafts-on-finish", "trim-keeps-drafts", "padding-through-ring",
                                      "layer-window-swapped", "output-truncated"]),
                              (PAGED, ["free-speculative", "free-early", "left-as-keys", "double-free", "layer-window-swapped",
                                       "no-window-free", "trim-keeps-drafts", "lookahead-shared", "lookahead-leak",
                                       "free-late", "shared-pool-double", "preempt-stale-table", "free-shared",
                                       "cow-skipped", "evicted-prefix-reused", "evict-leaves-hash",
                                       "partial-block-hash", "recompute-drops-last", "resume-stale-cached"])):
            out = subprocess.run([sys.executable, script, "--list-bugs"], capture_output=True,
                                 text=True, check=True).stdout.splitlines()
            self.assertEqual([line.split()[0] for line in out], names)
            self.assertTrue(all(len(line.split(None, 1)) == 2 for line in out))
            bad = subprocess.run([sys.executable, script, "--bug", "no-such-bug"], capture_output=True,
                                 text=True, input="")
            self.assertNotEqual(bad.returncode, 0)
        # Switches of the plain paged cache that the prefix cache does not
        # have are refused with it, not silently ignored.
        for args in (["--prefix-cache", "--bug", "double-free"], ["--bug", "free-shared", "--bug", "no-window-free"],
                     ["--prefix-cache", "--store-first"]):
            bad = subprocess.run([sys.executable, PAGED, *args], capture_output=True, text=True, input="")
            self.assertNotEqual(bad.returncode, 0, args)
            self.assertIn("does not go with the prefix cache", bad.stderr)

    def test_open_refuses_fp8_and_checks_version(self):
        adapter = self.start(RING)
        answer = adapter.send({"op": "open", "spec": make_spec(fmt="fp8")})
        self.assertFalse(answer["ok"])
        self.assertIn("fp8", answer["refused"])
        answer = adapter.send_raw('{"op":"hello","protocol":"kvcheck-exec","version":2}')
        self.assertEqual(answer["error"], "unsupported-version")

    def test_malformed_requests(self):
        adapter = self.start(RING)
        spec = make_spec(q_heads=2, kv_heads=1, head_dim=2, capacity=6, param=3)
        self.assertEqual(adapter.send({"op": "open", "spec": spec}), {"ok": True})
        self.assertEqual(adapter.send({"op": "begin", "layer": 0, "request": 5, "state": 0}), {"ok": True})
        good = {"op": "decode", "layer": 0, "request": 5, "state": 0, "position": 0,
                "k": [[0.5, 0.25]], "v": [[1.0, 2.0]], "q": [[1, 0, 0, 1]]}

        def with_(**kw):
            m = dict(good)
            m.update(kw)
            return json.dumps(m)

        def without(key):
            m = dict(good)
            del m[key]
            return json.dumps(m)

        bad_lines = [
            "not json",
            "",
            "[1,2]",
            '{"op":1}',
            '{"op":"decode","op":"decode"}',
            without("position"),
            without("v"),
            with_(position=0.0),
            with_(position=True),
            with_(layer=-1),
            with_(extra=1),
            with_(k=[[0.5, 0.25], [1, 1]]),
            with_(k=[[0.5]]),
            with_(q=[[1, 0, 0, "1"]]),
            with_(v=[[1.0, None]]),
            with_(k="rows"),
            json.dumps(good).replace("0.25", "NaN"),
            json.dumps(good).replace("0.25", "Infinity"),
            json.dumps(good).replace("0.25", "1e999"),
            json.dumps(good).replace("0.25", "1" + "0" * 400),
            json.dumps(good).replace("0.25", "[" * 100000),
            '{"op":"prefill","layer":0,"request":5,"state":0,"position":0,"rows":1,"order":"sideways",'
            '"k":[[1,1]],"v":[[1,1]],"q":[[1,1,1,1]]}',
            '{"op":"prefill","layer":0,"request":5,"state":0,"position":0,"rows":0,"order":"load_then_store",'
            '"k":[],"v":[],"q":[]}',
            '{"op":"verify","layer":0,"request":5,"state":0,"position":0,"drafts":-1,"k":[],"v":[],"q":[]}',
            '{"op":"open"}',
            '{"op":"hello","protocol":"kvcheck-exec"}',
        ]
        for line in bad_lines:
            answer = adapter.send_raw(line)
            self.assertEqual((answer["ok"], answer["error"]), (False, "bad-request"), line)
            self.assertIsInstance(answer["detail"], str)
        self.assertEqual(adapter.send_raw('{"op":"frobnicate"}')["error"], "unknown-op")
        # Broken open specs.
        for broken in ({"window": {"param": 3, "convention": "left", "keys": 3}},
                       {"q_heads": 3, "kv_heads": 2}, {"shared_row": True, "kv_heads": 2, "q_heads": 2},
                       {"rope": {"style": "neox", "rotary_dims": 3, "base": 10000.0}},
                       {"capacity": 0}, {"sink_logit": "none"}):
            s = dict(make_spec())
            s.update(broken)
            answer = adapter.send_raw(json.dumps({"op": "open", "spec": s}))
            self.assertEqual(answer["error"], "bad-request", broken)
        # After all that, the case is still usable... once reopened (the
        # broken opens closed it).
        self.assertEqual(adapter.send_raw(json.dumps(good))["error"], "not-open")
        self.assertEqual(adapter.send({"op": "open", "spec": spec}), {"ok": True})
        self.assertEqual(adapter.send({"op": "begin", "layer": 0, "request": 5, "state": 0}), {"ok": True})
        self.assertTrue(adapter.send(good)["ok"])

    def test_bookkeeping_only_and_declared_head_dims(self):
        # --no-outputs: hello says "outputs": false, steps answer slots and no out.
        for script in (RING, PAGED):
            adapter = self.start(script, "--no-outputs", "--require-head-dim-multiple", "4")
            caps = adapter.hello()["capabilities"]
            self.assertFalse(caps["outputs"])
            self.assertEqual(caps["head_dim"], {"multiple_of": 4})
            self.assertNotIn("max_head_dim", caps)  # head_dim and max_head_dim never both
            self.assertEqual(adapter.send({"op": "open", "spec": make_spec(head_dim=2)})["ok"], False)
            self.assertEqual(adapter.send({"op": "open", "spec": make_spec()}), {"ok": True})
            t = {"layer": 0, "request": 1, "state": 0}
            self.assertEqual(adapter.send({"op": "begin", **t}), {"ok": True})
            answer = adapter.send({"op": "prefill", **t, "position": 0, "rows": 2, "order": "store_then_load",
                                   "k": [[0.1] * 4] * 2, "v": [[0.2] * 4] * 2, "q": [[0.3] * 4] * 2})
            self.assertNotIn("out", answer)
            self.assertEqual(len(answer["written"]), 2)
            self.assertEqual(len(answer["read"][1]), 2)
        # Undeclared: the same refusal, and hello says nothing of it.
        adapter = self.start(RING, "--require-head-dim-multiple", "4", "--undeclared-limits")
        caps = adapter.hello()["capabilities"]
        self.assertNotIn("head_dim", caps)
        self.assertTrue(caps["outputs"])
        self.assertEqual(adapter.send({"op": "open", "spec": make_spec(head_dim=2)})["ok"], False)

    def test_padding_and_frees_are_answered(self):
        spec = make_spec(states=1, capacity=8, param=4)
        t = {"layer": 0, "request": 1, "state": 0}
        # --pad-prefill 4: a 3-row prefill pads one row, at a scratch slot
        # outside the ring; with padding-through-ring at position 3's ring slot.
        for args, pad in ((("--pad-prefill", "4"), None),
                          (("--bug", "padding-through-ring", "--pad-prefill", "4"), [3])):
            adapter = self.start(RING, *args)
            self.assertEqual(adapter.send({"op": "open", "spec": spec}), {"ok": True})
            self.assertEqual(adapter.send({"op": "begin", **t}), {"ok": True})
            a = send_rows_step(adapter, t, "prefill", 0, 3, rows=3, order="store_then_load")
            self.assertEqual(len(a["padded"]), 1, a)
            if pad is None:
                self.assertGreaterEqual(a["padded"][0], 8)
            else:
                self.assertEqual(a["padded"], pad)
            self.assertNotIn("padded", send_rows_step(adapter, t, "decode", 3))
        # The paged cache answers the slots of the blocks it frees: a finish
        # returns the request's two blocks of two rows.
        adapter = self.start(PAGED, "--block-size", "2")
        self.assertEqual(adapter.send({"op": "open", "spec": spec}), {"ok": True})
        self.assertEqual(adapter.send({"op": "begin", **t}), {"ok": True})
        a = send_rows_step(adapter, t, "prefill", 0, 3, rows=3, order="store_then_load")
        self.assertNotIn("freed", a)
        slots = a["written"]
        freed = adapter.send({"op": "finish", **t})["freed"]
        self.assertEqual(len(freed), 4)
        self.assertTrue(set(slots) <= set(freed))

    def test_paged_prefix_sharing_copy_on_write_and_eviction(self):
        """--prefix-cache: a begin from a prefix shares the source's blocks
        (written -1), a write into a shared block copies it first (moved), a
        finished request's full blocks go to the free pool cached (answered
        "cached", still shared by a later begin) until a write needs the
        block, and a prefix whose block was evicted is stored again from the
        rows sent; each bug switch breaks its part."""
        spec = {**make_spec(states=2, capacity=8, param=4), "block_size": 2, "pool_blocks": 4}
        r0, r1 = {"layer": 0, "request": 0, "state": 0}, {"layer": 0, "request": 1, "state": 1}
        rows = {"k": [[0.1] * 4] * 4, "v": [[0.2] * 4] * 4}
        rows3 = {"k": rows["k"][:3], "v": rows["v"][:3]}
        self.assertNotIn("prefix_sharing", self.start(PAGED).hello()["capabilities"])

        def share(*args):
            adapter = self.start(PAGED, "--block-size", "2", *args)
            caps = adapter.hello()["capabilities"]
            self.assertTrue(caps["prefix_sharing"])
            self.assertTrue(caps["reports"]["cached"])
            self.assertEqual(adapter.send({"op": "open", "spec": spec}), {"ok": True})
            adapter.send({"op": "begin", **r0})
            source = send_rows_step(adapter, r0, "prefill", 0, 3, rows=3, order="store_then_load")["written"]
            begun = adapter.send({"op": "begin", **r1, "prefix": {"request": 0, "positions": 3}, **rows3})
            return adapter, source, begun

        def evict(adapter, source):
            """r1 copies block 1 and r0 completes it; r0 finishes (block 1
            cached, block 0 still r1's); r2 takes the last unused block and
            evicts block 1, then finishes; r3 begins from r0's 4 positions."""
            a = send_rows_step(adapter, r1, "decode", 3)
            send_rows_step(adapter, r0, "decode", 3)
            finished = adapter.send({"op": "finish", **r0})
            r2 = {"layer": 0, "request": 2, "state": 0}
            adapter.send({"op": "begin", **r2})
            taken = send_rows_step(adapter, r2, "prefill", 0, 4, rows=4, order="store_then_load")["written"]
            adapter.send({"op": "finish", **r2})
            r3 = {"layer": 0, "request": 3, "state": 0}
            again = adapter.send({"op": "begin", **r3, "prefix": {"request": 0, "positions": 4}, **rows})
            return a, finished, taken, again

        adapter, source, begun = share("--prefix-cache")
        self.assertEqual(begun, {"ok": True, "written": [-1, -1, -1]})
        a, finished, taken, again = evict(adapter, source)
        self.assertEqual([m[0] for m in a["moved"]], [source[2], source[2] + 1][:len(a["moved"])])
        self.assertNotIn(a["written"][0], source)
        self.assertEqual(a["read"][0][:2], source[:2])  # blocks the write did not touch stay shared
        # Block 1 (positions 2, 3) is no request's: cached, not freed; block 0 is still r1's.
        self.assertEqual(finished, {"ok": True, "cached": [source[2], source[2] + 1]})
        self.assertIn(source[2], taken)  # evicted: the pool had no other block
        # Block 0 is shared; block 1 was evicted, so its rows are stored again.
        self.assertEqual(again["written"][:2], [-1, -1])
        self.assertTrue(all(s >= 0 for s in again["written"][2:]), again)

        # A cached block is still shared by a later begin (a prefix hit).
        adapter, source, _ = share("--prefix-cache")
        send_rows_step(adapter, r1, "decode", 3)
        send_rows_step(adapter, r0, "decode", 3)
        adapter.send({"op": "finish", **r0})
        hit = adapter.send({"op": "begin", **{**r0, "request": 2}, "prefix": {"request": 0, "positions": 4}, **rows})
        self.assertEqual(hit, {"ok": True, "written": [-1, -1, -1, -1]})

        # cow-skipped: the sharer writes into the source's block in place.
        adapter, source, _ = share("--bug", "cow-skipped")
        a = send_rows_step(adapter, r1, "decode", 3)
        self.assertNotIn("moved", a)
        self.assertEqual(a["written"][0], source[2] + 1)
        # evict-leaves-hash and evicted-prefix-reused: the evicted block is
        # answered as shared, though it now holds r2's rows.
        for bug in ("evict-leaves-hash", "evicted-prefix-reused"):
            adapter, source, _ = share("--bug", bug)
            _, _, taken, again = evict(adapter, source)
            self.assertIn(source[2], taken)
            self.assertEqual(again["written"], [-1, -1, -1, -1], bug)

    def test_paged_content_hash_caches_a_stored_again_prefix_under_the_source_hash(self):
        """--content-hash: a block a begin stored again (the source's blocks
        evicted) is cached under the source block's hash when its request
        finishes, so a later begin from the source shares that copy (written
        -1: kvcheck's row lineage); plain --prefix-cache indexes it under the
        begun request and the later begin stores the rows a third time."""
        spec = {**make_spec(states=2, capacity=8, param=4), "block_size": 2, "pool_blocks": 4}
        rows = {"k": [[0.1] * 4] * 4, "v": [[0.2] * 4] * 4}

        def run(*args):
            adapter = self.start(PAGED, "--block-size", "2", *args)
            self.assertEqual(adapter.send({"op": "open", "spec": spec}), {"ok": True})
            for request in (0, 2, 3):  # r0's blocks cached, r2's cached, r3 evicts r0's
                t = {"layer": 0, "request": request, "state": 0}
                adapter.send({"op": "begin", **t})
                send_rows_step(adapter, t, "prefill", 0, 4, rows=4, order="store_then_load")
                if request != 3:
                    self.assertEqual(len(adapter.send({"op": "finish", **t})["cached"]), 4)
            r1 = {"layer": 0, "request": 1, "state": 1}
            stored = adapter.send({"op": "begin", **r1, "prefix": {"request": 0, "positions": 4}, **rows})
            self.assertTrue(all(slot >= 0 for slot in stored["written"]), stored)  # r0's blocks evicted
            self.assertEqual(sorted(adapter.send({"op": "finish", **r1})["cached"]), sorted(stored["written"]))
            r4 = {"layer": 0, "request": 4, "state": 1}
            return stored, adapter.send({"op": "begin", **r4, "prefix": {"request": 0, "positions": 4}, **rows})

        _, again = run("--content-hash")
        self.assertEqual(again, {"ok": True, "written": [-1, -1, -1, -1]})
        stored, again = run("--prefix-cache")
        self.assertTrue(all(slot >= 0 for slot in again["written"]), again)
        self.assertEqual(sorted(again["written"]), sorted(stored["written"]))  # r1's copies evicted for a third

    def test_typed_refusals_change_nothing(self):
        for script in (RING, PAGED):
            adapter = self.start(script)
            spec = make_spec(states=2, capacity=6, param=3, max_step_rows=4)
            self.assertEqual(adapter.send({"op": "open", "spec": spec}), {"ok": True})
            t = {"layer": 0, "request": 1, "state": 0}

            def step(op, position, n=1, **kw):
                return send_rows_step(adapter, t, op, position, n, **kw)

            def error(answer):
                self.assertFalse(answer["ok"], answer)
                return answer["error"]

            self.assertEqual(error(step("decode", 0)), "state-free")
            self.assertEqual(error(adapter.send({"op": "accept", **t, "accepted": 0})), "state-free")
            self.assertEqual(adapter.send({"op": "begin", **t}), {"ok": True})
            self.assertEqual(error(adapter.send({"op": "begin", **t})), "state-busy")
            self.assertEqual(error(adapter.send({"op": "begin", **t, "state": 9})), "state-out-of-range")
            self.assertEqual(error(adapter.send({"op": "begin", **t, "layer": 1})), "layer-out-of-range")
            self.assertEqual(error(step("decode", 1)), "position-mismatch")
            self.assertEqual(error(step("decode", 0, request=2)), "request-mismatch")
            self.assertEqual(error(step("prefill", 0, n=5, rows=5, order="load_then_store")), "too-many-rows")
            self.assertEqual(error(adapter.send({"op": "accept", **t, "accepted": 0})), "bad-accept")
            self.assertTrue(step("prefill", 0, n=2, rows=2, order="store_then_load")["ok"])
            self.assertTrue(step("verify", 2, n=3, drafts=2)["ok"])
            self.assertEqual(error(step("decode", 5)), "verify-pending")
            self.assertEqual(error(adapter.send({"op": "accept", **t, "accepted": 3})), "bad-accept")
            self.assertEqual(error(adapter.send({"op": "accept", **t, "accepted": -1})), "bad-accept")
            self.assertTrue(adapter.send({"op": "accept", **t, "accepted": 1})["ok"])
            self.assertEqual(error(step("decode", 5)), "position-mismatch")
            self.assertTrue(step("decode", 4)["ok"])
            self.assertTrue(adapter.send({"op": "reset", **t})["ok"])
            self.assertTrue(step("decode", 0)["ok"])
            self.assertTrue(adapter.send({"op": "finish", **t})["ok"])
            self.assertEqual(error(adapter.send({"op": "finish", **t})), "state-free")
            self.assertEqual(adapter.send({"op": "close"}), {"ok": True})
            self.assertEqual(error(adapter.send({"op": "begin", **t})), "not-open")

    def test_ring_trim_rewinds_and_drops_drafts(self):
        # The ring declares trim (the paged cache frees rows a trim could
        # return to, so it does not); trim-keeps-drafts leaves drafts pending.
        for bugs, drafts_dropped in (((), True), (("--bug", "trim-keeps-drafts"), False)):
            adapter = Adapter(RING, *bugs)
            self.addCleanup(adapter.kill)
            hello = adapter.hello()
            self.assertIn("trim", hello["capabilities"]["steps"])
            spec = make_spec(states=1, capacity=8, param=3, max_step_rows=4)
            self.assertEqual(adapter.send({"op": "open", "spec": spec}), {"ok": True})
            t = {"layer": 0, "request": 1, "state": 0}

            def step(op, position, n=1, **kw):
                return send_rows_step(adapter, t, op, position, n, **kw)

            self.assertEqual(adapter.send({"op": "begin", **t}), {"ok": True})
            self.assertTrue(step("prefill", 0, n=4, rows=4, order="load_then_store")["ok"])
            self.assertEqual(adapter.send({"op": "trim", **t, "positions": 5})["error"], "bad-trim")
            self.assertEqual(adapter.send({"op": "trim", **t, "positions": 0})["error"], "bad-trim")
            self.assertEqual(adapter.send({"op": "trim", **t, "positions": 2}), {"ok": True})
            answer = step("decode", 2)
            self.assertTrue(answer["ok"], answer)
            self.assertEqual(answer["written"], [2])  # the trimmed position's slot
            self.assertEqual(answer["read"], [[0, 1, 2]])
            self.assertTrue(step("verify", 3, n=3, drafts=2)["ok"])
            self.assertEqual(adapter.send({"op": "trim", **t, "positions": 1}), {"ok": True})
            answer = step("decode", 2)
            self.assertEqual(answer["ok"], drafts_dropped, answer)
            if not drafts_dropped:
                self.assertEqual(answer["error"], "verify-pending")
            adapter.send({"op": "bye"})
        paged = Adapter(PAGED, "--block-size", "2")
        self.addCleanup(paged.kill)
        hello = paged.hello()
        self.assertNotIn("trim", hello["capabilities"]["steps"])

    def test_paged_declares_its_block_size_and_sizes_its_pool_from_pool_blocks(self):
        adapter = self.start(PAGED, "--block-size", "2")
        hello = adapter.hello()
        self.assertEqual(hello["capabilities"]["addressing"], "paged")
        self.assertEqual(hello["capabilities"]["block_size"], 2)
        # 6 rows stored before 8 keys are read: 3 blocks of 2. capacity alone
        # would give ceil(8 / 2) + 1 = 5; the pool is what pool_blocks says.
        spec = make_spec(states=1, capacity=8, param=8, max_step_rows=8)
        t = {"layer": 0, "request": 0, "state": 0}
        for blocks, ok in ((2, False), (3, True)):
            self.assertEqual(adapter.send({"op": "open", "spec": dict(spec, block_size=2, pool_blocks=blocks)}),
                             {"ok": True})
            self.assertEqual(adapter.send({"op": "begin", **t}), {"ok": True})
            answer = send_rows_step(adapter, t, "prefill", 0, 6, rows=6, order="store_then_load")
            self.assertEqual(answer["ok"], ok, answer)
            if not ok:
                self.assertEqual(answer["error"], "out-of-blocks")
        # A block size other than the one declared, or one without the other, is a bad request.
        for bad in (dict(spec, block_size=4, pool_blocks=3), dict(spec, pool_blocks=3)):
            answer = adapter.send({"op": "open", "spec": bad})
            self.assertFalse(answer["ok"], answer)

    def test_paged_lookahead_and_free_deferral(self):
        plain = self.start(PAGED).hello()["capabilities"]
        self.assertNotIn("lookahead_slots", plain)
        self.assertNotIn("free_deferral_steps", plain)
        t = {"layer": 0, "request": 0, "state": 0}
        # --lookahead 4: a prefill of 2 rows at 0 takes blocks 0 (its rows)
        # and 1, 2 (positions 2..5): 3 blocks of 2, refused with 2.
        adapter = self.start(PAGED, "--block-size", "2", "--lookahead", "4")
        self.assertEqual(adapter.hello()["capabilities"]["lookahead_slots"], 4)
        spec = make_spec(states=1, capacity=4, param=2, max_step_rows=2)
        for blocks, ok in ((2, False), (3, True)):
            self.assertEqual(adapter.send({"op": "open", "spec": dict(spec, block_size=2, pool_blocks=blocks)}),
                             {"ok": True})
            self.assertEqual(adapter.send({"op": "begin", **t}), {"ok": True})
            answer = send_rows_step(adapter, t, "prefill", 0, 2, rows=2, order="store_then_load")
            self.assertEqual(answer["ok"], ok, answer)
            if not ok:
                self.assertEqual(answer["error"], "out-of-blocks")
        # --free-deferral 2, W = 2 keys, blocks of 2: eagerly, block j goes
        # once (j + 1) * 2 <= p (after the decode at p); deferred, only on
        # every third write step (p = 2, 5, 8): blocks 0, then 1, then 2 and 3.
        adapter = self.start(PAGED, "--block-size", "2", "--free-deferral", "2")
        self.assertEqual(adapter.hello()["capabilities"]["free_deferral_steps"], 2)
        self.assertEqual(adapter.send({"op": "open", "spec": dict(spec, block_size=2, pool_blocks=8)}), {"ok": True})
        self.assertEqual(adapter.send({"op": "begin", **t}), {"ok": True})
        freed = {}
        for p in range(9):
            answer = send_rows_step(adapter, t, "decode", p)
            self.assertTrue(answer["ok"], answer)
            if "freed" in answer:
                freed[p] = len(answer["freed"]) // 2
        self.assertEqual(freed, {2: 1, 5: 1, 8: 2})
        # Out-of-range values and the prefix cache or trims are refused at start.
        for args in (["--lookahead", "-1"], ["--free-deferral", "5000"], ["--lookahead", "4", "--prefix-cache"],
                     ["--free-deferral", "1", "--trims"], ["--bug", "lookahead-leak", "--lookahead", "0"]):
            bad = subprocess.run([sys.executable, PAGED, *args], capture_output=True, text=True, input="")
            self.assertNotEqual(bad.returncode, 0, args)
        # The bugs imply their option: hello declares what the correct cache would.
        self.assertEqual(self.start(PAGED, "--bug", "free-late").hello()["capabilities"]["free_deferral_steps"], 2)
        self.assertEqual(self.start(PAGED, "--bug", "lookahead-leak").hello()["capabilities"]["lookahead_slots"], 4)

    def test_paged_shared_pool_one_free_list_for_every_layer(self):
        self.assertNotIn("shared_pool", self.start(PAGED).hello()["capabilities"])
        # Layer 0 slides over 2 keys, layer 1 is global; blocks of 2, one pool.
        spec = make_spec(states=1, capacity=8, param=2, layers=2, max_step_rows=4)
        spec["layer_windows"] = [{"param": 2, "convention": "keys", "keys": 2},
                                 {"param": None, "convention": None, "keys": None}]
        for bugs, blocks, layer1 in (((), 3, [0, 1, 4, 5]), ((), 2, None),
                                     (("--bug", "shared-pool-double"), 3, [2, 3, 0, 1])):
            adapter = self.start(PAGED, "--block-size", "2", "--shared-pool", *bugs)
            self.assertIs(adapter.hello()["capabilities"]["shared_pool"], True)
            self.assertEqual(adapter.send({"op": "open", "spec": dict(spec, block_size=2, pool_blocks=blocks)}),
                             {"ok": True})
            written = []
            for layer in (0, 1):
                t = {"layer": layer, "request": 0, "state": 0}
                self.assertEqual(adapter.send({"op": "begin", **t}), {"ok": True})
                written.append(send_rows_step(adapter, t, "prefill", 0, 4, rows=4, order="store_then_load"))
            # Layer 0 takes blocks 0 and 1 and its window (the next query sees
            # 3..4) lets block 0 go; the global layer 1 takes it, then block 2:
            # three blocks for both, where two pools would need four.
            self.assertEqual(written[0]["written"], [0, 1, 2, 3])
            self.assertEqual(written[0]["freed"], [0, 1])
            if layer1 is None:
                self.assertEqual(written[1]["error"], "out-of-blocks")  # two blocks are one short
            else:
                # shared-pool-double hands layer 1 block 1 too, which layer 0 still reads (slot 3).
                self.assertEqual(written[1]["written"], layer1, written[1])
        # --shared-pool is the plain paged cache's: not with the prefix cache.
        bad = subprocess.run([sys.executable, PAGED, "--shared-pool", "--prefix-cache"], capture_output=True,
                             text=True, input="")
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("--shared-pool goes with the plain paged cache", bad.stderr)

    def test_paged_recompute_in_step_leaves_missed_rows_to_the_first_step(self):
        """--recompute-in-step: hello declares recompute_in_step (and
        prefix_sharing); a begin stores nothing, leaving the missed blocks'
        positions (with no hit at all, the whole prefix) to the request's
        first writing step ("recompute"), which stores them before its own
        rows ("recomputed") and reads them; recompute-drops-last stores all
        but the last."""
        self.assertNotIn("recompute_in_step", self.start(PAGED).hello()["capabilities"])
        spec = {**make_spec(states=2, capacity=8, param=3), "block_size": 2, "pool_blocks": 16}
        r0, r1 = {"layer": 0, "request": 0, "state": 0}, {"layer": 0, "request": 1, "state": 1}
        rows = {"k": [[0.1] * 4] * 5, "v": [[0.2] * 4] * 5}

        def opened(*args):
            adapter = self.start(PAGED, "--block-size", "2", *args)
            caps = adapter.hello()["capabilities"]
            self.assertIs(caps["recompute_in_step"], True)
            self.assertIs(caps["prefix_sharing"], True)
            self.assertEqual(adapter.send({"op": "open", "spec": spec}), {"ok": True})
            return adapter

        # r0 wrote positions 0..4 and finished: blocks 0 and 1 cached, the half block freed.
        # r1 begins from its 5 positions (keys 3: its first query, at 5, sees 3..5): block 1
        # (positions 2, 3) hits, position 4 is left to the first step.
        adapter = opened("--recompute-in-step")
        adapter.send({"op": "begin", **r0})
        source = send_rows_step(adapter, r0, "prefill", 0, 5, rows=5, order="store_then_load")["written"]
        adapter.send({"op": "finish", **r0})
        begun = adapter.send({"op": "begin", **r1, "prefix": {"request": 0, "positions": 5}, **rows})
        self.assertEqual(begun["written"], [-1] * 5)
        self.assertEqual(begun["recompute"], [4])
        step = send_rows_step(adapter, r1, "decode", 5)
        self.assertEqual([p for p, _ in step["recomputed"]], [4])
        slot4 = step["recomputed"][0][1]
        self.assertEqual(sorted(step["read"][0]), sorted([source[3], slot4, step["written"][0]]))
        # A later step stores nothing more.
        self.assertNotIn("recomputed", send_rows_step(adapter, r1, "decode", 6))

        # No hit at all (a prefix no block of which is cached): the whole prefix is left to
        # the step, which stores all five rows, reads 3..5, and lets go of the blocks below.
        for bug, stored in ((None, [0, 1, 2, 3, 4]), ("recompute-drops-last", [0, 1, 2, 3])):
            adapter = opened(*(["--bug", bug] if bug else ["--recompute-in-step"]))
            begun = adapter.send({"op": "begin", **r1, "prefix": {"request": 7, "positions": 5}, **rows})
            self.assertEqual(begun["recompute"], [0, 1, 2, 3, 4])
            step = send_rows_step(adapter, r1, "decode", 5)
            self.assertEqual([p for p, _ in step["recomputed"]], stored, bug)
            at = dict(step["recomputed"])
            read = step["read"][0]
            self.assertIn(at[3], read)
            # The bug leaves position 4's slot empty: read as nothing (-1).
            self.assertEqual(at[4] in read if bug is None else -1 in read, True, read)
            released = set(step.get("freed", []) + step.get("cached", []))
            self.assertTrue({at[0], at[1]} <= released, step)  # block 0 went below the window

    def test_paged_preempt_frees_and_the_resume_stores_again(self):
        """--preempt: hello lists preempt; a preempt frees the request's
        blocks (the prefix cache caches its full ones); the begin from itself
        that resumes it stores again the rows its next query sees (the
        prefix cache takes back the cached block still holding them);
        preempt-stale-table takes the old blocks back without storing."""
        self.assertNotIn("preempt", self.start(PAGED).hello()["capabilities"]["steps"])
        spec = {**make_spec(states=2, capacity=8, param=3), "block_size": 2, "pool_blocks": 8}
        r0, r1 = {"layer": 0, "request": 0, "state": 0}, {"layer": 0, "request": 1, "state": 1}
        rows = {"k": [[0.1] * 4] * 5, "v": [[0.2] * 4] * 5}

        def preempted(*args):
            adapter = self.start(PAGED, "--block-size", "2", *args)
            self.assertIn("preempt", adapter.hello()["capabilities"]["steps"])
            self.assertEqual(adapter.send({"op": "open", "spec": spec}), {"ok": True})
            adapter.send({"op": "begin", **r0})
            source = send_rows_step(adapter, r0, "prefill", 0, 5, rows=5, order="store_then_load")["written"]
            # keys 3: block 0 (positions 0, 1) already left r0's window; its next query (at 5) sees 3..5.
            dropped = adapter.send({"op": "preempt", **r0})
            return adapter, source, dropped

        adapter, source, dropped = preempted("--preempt")
        self.assertEqual(sorted(dropped["freed"]), sorted(source[2:] + [source[4] + 1]))
        # r1 takes the block r0 freed last; r0's resume stores the blocks of positions 3 and 4
        # (positions 2..4: whole blocks, as r0 held them, and as the prefix cache stores them) in free blocks.
        adapter.send({"op": "begin", **r1})
        taken = send_rows_step(adapter, r1, "decode", 0)["written"]
        resumed = adapter.send({"op": "begin", **r0, "prefix": {"request": 0, "positions": 5}, **rows})
        self.assertEqual(resumed["written"][:2], [-1, -1])
        self.assertTrue(all(s >= 0 and s // 2 != taken[0] // 2 for s in resumed["written"][2:]), resumed)
        after = send_rows_step(adapter, r0, "decode", 5)
        self.assertTrue(after["ok"], after)
        self.assertEqual(sorted(after["read"][0]), sorted(resumed["written"][3:5] + after["written"]))

        # With the prefix cache: block 1 (positions 2, 3) is cached, the half block freed;
        # the resume takes block 1 back and stores position 4 only.
        adapter, source, dropped = preempted("--preempt", "--prefix-cache")
        self.assertEqual(sorted(dropped["cached"]), [source[2], source[3]])
        resumed = adapter.send({"op": "begin", **r0, "prefix": {"request": 0, "positions": 5}, **rows})
        self.assertEqual(resumed["written"][:4], [-1, -1, -1, -1])
        self.assertGreaterEqual(resumed["written"][4], 0)

        # preempt-stale-table: the old blocks are taken back, nothing stored.
        adapter, source, _ = preempted("--bug", "preempt-stale-table")
        resumed = adapter.send({"op": "begin", **r0, "prefix": {"request": 0, "positions": 5}, **rows})
        self.assertEqual(resumed["written"], [-1] * 5)
        # preempt-stale-table is the plain paged cache's.
        bad = subprocess.run([sys.executable, PAGED, "--bug", "preempt-stale-table", "--prefix-cache"],
                             capture_output=True, text=True, input="")
        self.assertNotEqual(bad.returncode, 0)

    def test_paged_preempt_with_trims_lookahead_and_deferral(self):
        """--preempt with --trims: the resume stores the last `capacity`
        positions again (a trim may take the request back to them), not only
        those its next query sees; with --lookahead and --free-deferral a
        preempt returns the lookahead blocks and the blocks whose free was
        deferred with the rest."""
        spec = {**make_spec(states=1, capacity=8, param=2), "block_size": 2, "pool_blocks": 10}
        r0 = {"layer": 0, "request": 0, "state": 0}
        rows = {"k": [[0.1] * 4] * 6, "v": [[0.2] * 4] * 6}

        def preempted(*args):
            adapter = self.start(PAGED, "--block-size", "2", "--preempt", *args)
            self.assertEqual(adapter.send({"op": "open", "spec": spec}), {"ok": True})
            adapter.send({"op": "begin", **r0})
            written = send_rows_step(adapter, r0, "prefill", 0, 6, rows=6, order="store_then_load")["written"]
            return adapter, written, adapter.send({"op": "preempt", **r0})

        # keys 2: the next query (at 6) sees 5..6, so the resume stores block 2 (positions 4, 5);
        # --trims keeps positions 0..5 as well (the last capacity 8).
        adapter, _, _ = preempted()
        resumed = adapter.send({"op": "begin", **r0, "prefix": {"request": 0, "positions": 6}, **rows})
        self.assertEqual([s >= 0 for s in resumed["written"]], [False] * 4 + [True] * 2)
        adapter, _, _ = preempted("--trims")
        resumed = adapter.send({"op": "begin", **r0, "prefix": {"request": 0, "positions": 6}, **rows})
        self.assertTrue(all(s >= 0 for s in resumed["written"]), resumed)
        # Taken back by 4 positions: the decode at 2 sees 1..2, position 1 stored again by the resume.
        self.assertTrue(adapter.send({"op": "trim", **r0, "positions": 4})["ok"])
        after = send_rows_step(adapter, r0, "decode", 2)
        self.assertIn("read", after, after)
        self.assertEqual(sorted(after["read"][0]), sorted([resumed["written"][1]] + after["written"]))

        # --lookahead 4: the prefill took two blocks for positions 6..9 past its rows, and its
        # window let blocks 0 and 1 go; the preempt frees block 2 and the lookahead blocks.
        adapter, written, dropped = preempted("--lookahead", "4")
        freed = {s // 2 for s in dropped["freed"]}
        self.assertIn(written[5] // 2, freed)
        self.assertEqual(len(freed - {s // 2 for s in written}), 2, dropped)
        # --free-deferral 2: the prefill's out-of-window blocks wait for a
        # free step; the preempt frees every block of the request.
        adapter, written, dropped = preempted("--free-deferral", "2")
        self.assertEqual({s // 2 for s in dropped["freed"]}, {s // 2 for s in written})

    def test_paged_resume_after_its_cached_block_was_evicted(self):
        """--preempt --prefix-cache: a block the preempt cached and another
        request's write evicted since is stored again by the resume;
        resume-stale-cached takes it back by its old id (now another
        request's rows)."""
        spec = {**make_spec(states=2, capacity=8, param=3), "block_size": 2, "pool_blocks": 4}
        r0, r1 = {"layer": 0, "request": 0, "state": 0}, {"layer": 0, "request": 1, "state": 1}
        rows = {"k": [[0.1] * 4] * 5, "v": [[0.2] * 4] * 5}

        def resumed(*args):
            adapter = self.start(PAGED, "--block-size", "2", *args)
            self.assertEqual(adapter.send({"op": "open", "spec": spec}), {"ok": True})
            adapter.send({"op": "begin", **r0})
            source = send_rows_step(adapter, r0, "prefill", 0, 5, rows=5, order="store_then_load")["written"]
            # keys 3: block 0 (positions 0, 1) left the window (cached); the
            # preempt caches block 1 (2, 3) and frees block 2 (the half block).
            self.assertEqual(sorted(adapter.send({"op": "preempt", **r0})["cached"]), source[2:4])
            # r1 takes the freed block and the unused one, then evicts the
            # cached ones, least recently cached first: block 0, then block 1 (decode at 6).
            adapter.send({"op": "begin", **r1})
            send_rows_step(adapter, r1, "prefill", 0, 4, rows=4, order="store_then_load")
            for p in (4, 5):
                send_rows_step(adapter, r1, "decode", p)
            evicting = send_rows_step(adapter, r1, "decode", 6)["written"][0]
            self.assertEqual(evicting // 2, source[2] // 2)
            return adapter.send({"op": "begin", **r0, "prefix": {"request": 0, "positions": 5}, **rows})

        # Correct: positions 2..4 (blocks 1 and 2; the next query sees 3..5) stored again.
        written = resumed("--preempt", "--prefix-cache")["written"]
        self.assertTrue(all(s >= 0 for s in written[2:]), written)
        # resume-stale-cached: block 1 taken back, as if it still held positions 2 and 3.
        written = resumed("--bug", "resume-stale-cached")["written"]
        self.assertEqual(written[2:4], [-1, -1])

    def test_paged_trims_keep_the_last_capacity_rows(self):
        # Without --trims the paged cache frees by its window and lists no
        # trim; with it a rewind reads rows the window had passed, kept
        # because they are among the last `capacity` written.
        self.assertNotIn("trim", self.start(PAGED).hello()["capabilities"]["steps"])
        adapter = self.start(PAGED, "--block-size", "2", "--trims")
        self.assertIn("trim", adapter.hello()["capabilities"]["steps"])
        # kvcheck's pool: R = max(capacity 8, keys - 1 + C 10) rows, ceil(10 / 2) + 1 blocks.
        spec = make_spec(states=1, capacity=8, param=2, max_step_rows=9)
        self.assertEqual(adapter.send({"op": "open", "spec": dict(spec, block_size=2, pool_blocks=6)}),
                         {"ok": True})
        t = {"layer": 0, "request": 0, "state": 0}
        self.assertEqual(adapter.send({"op": "begin", **t}), {"ok": True})
        first = send_rows_step(adapter, t, "prefill", 0, 8, rows=8, order="load_then_store")
        self.assertTrue(first["ok"], first)
        self.assertEqual(adapter.send({"op": "trim", **t, "positions": 5}), {"ok": True})
        answer = send_rows_step(adapter, t, "decode", 3)
        self.assertTrue(answer["ok"], answer)
        self.assertEqual(answer["read"], [first["written"][2:4]])  # position 2 still held, 3 rewritten in place
        # Past the capacity the oldest blocks go: after positions 4..12, rows
        # below 13 - 8 = 5 are freed (blocks 0 and 1), none a query still sees.
        answer = send_rows_step(adapter, t, "prefill", 4, 9, rows=9, order="store_then_load")
        self.assertTrue(answer["ok"], answer)
        self.assertEqual(sorted(answer.get("freed", [])), sorted(first["written"][0:4]))

    def test_per_layer_windows_and_the_swapped_window_bug(self):
        # Layer 0 slides over 2 keys, layer 1 is global: each reads its own
        # window; with layer-window-swapped layer 1 reads layer 0's 2 keys.
        # (The paged adapter runs the same WindowCache code; kvcheck replays the
        # bundled scenario layer-windows-w2-global-left3 on both adapters.)
        for script, extra in ((RING, ()),):
            for bugs, global_reads in (((), [0, 1, 2, 3, 4]), (("--bug", "layer-window-swapped"), [3, 4])):
                adapter = Adapter(script, *extra, *bugs)
                self.addCleanup(adapter.kill)
                self.assertTrue(adapter.hello()["capabilities"]["per_layer_windows"])
                spec = make_spec(states=1, capacity=8, param=2, layers=2, max_step_rows=5)
                spec["layer_windows"] = [{"param": 2, "convention": "keys", "keys": 2},
                                         {"param": None, "convention": None, "keys": None}]
                self.assertEqual(adapter.send({"op": "open", "spec": spec}), {"ok": True})
                reads = {}
                for layer in (0, 1):
                    t = {"layer": layer, "request": 1, "state": 0}
                    self.assertEqual(adapter.send({"op": "begin", **t}), {"ok": True})
                    answer = send_rows_step(adapter, t, "prefill", 0, n=5, rows=5, order="store_then_load")
                    self.assertTrue(answer["ok"], answer)
                    reads[layer] = answer["read"][-1]  # the query at position 4
                self.assertEqual(len(reads[0]), 2, script)
                self.assertEqual(len(reads[1]), len(global_reads), (script, bugs))
                # One entry for two layers: a bad request naming the field.
                self.assertEqual(adapter.send({"op": "close"}), {"ok": True})
                bad = dict(spec, layer_windows=[{"param": 2, "convention": "keys", "keys": 2}])
                answer = adapter.send({"op": "open", "spec": bad})
                self.assertFalse(answer["ok"])
                self.assertIn("spec.layer_windows", answer.get("detail", ""))
                adapter.send({"op": "bye"})

    def test_schema_rejects_bad_messages(self):
        if REQUEST_SCHEMA is None:
            self.skipTest("jsonschema is not importable")
        target = {"layer": 0, "request": 1, "state": 0}
        bad_requests = [
            {"op": "decode", **target, "position": 0, "k": [[1], [2]], "q": [[1], [2]]},
            {"op": "prefill", **target, "position": 0, "rows": 1, "k": [[1]], "q": [[1]]},
            {"op": "begin", **target, "extra": 1},
            {"op": "accept", **target},
            {"op": "hello", "protocol": "kvcheck-exec", "version": 2},
            {"op": "open", "spec": dict(make_spec(), format="f16")},
            {"op": "nope"},
        ]
        for msg in bad_requests:
            self.assertFalse(REQUEST_SCHEMA.is_valid(msg), msg)
        bad_answers = [
            {"ok": True, "out": [[1.0]], "extra": 1},
            {"ok": True, "out": [[1.0]], "read_view": "sideways"},
            {"ok": False},
            {"ok": True, "written": [-2]},  # (written alone: a begin from a shared prefix)
            {"ok": True, "out": [[1.0]], "read": [[0.5]]},
        ]
        for msg in bad_answers:
            self.assertFalse(ANSWER_SCHEMA.is_valid(msg), msg)


class ProtocolLibraryTest(unittest.TestCase):
    """kvcheck.protocol on its own, as an engine's adapter uses it: a cache
    that writes only through the library's public names."""

    class Cache(kvcheck_protocol.Cache):
        def __init__(self, spec):
            if spec.format != "f64":
                raise kvcheck_protocol.OpenRefused(f"format {spec.format}")
            self.spec = spec
            self.calls = []

        def begin(self, layer, state, request):
            self.calls.append(("begin", layer, state, request))

        def accept(self, layer, state, request, accepted):
            raise kvcheck_protocol.Refusal("bad-accept", "no verify is pending")

        def finish(self, layer, state, request):
            self.calls.append(("finish", layer, state, request))

        def reset(self, layer, state, request):
            self.calls.append(("reset", layer, state, request))

        def write(self, step):
            self.calls.append((step.kind, step.layer, step.state, step.request, step.position, step.rows,
                               step.order, step.drafts, len(step.k), step.v is None, len(step.q)))
            n = step.rows
            return {"ok": True, "out": [[0.0] * self.spec.q_width for _ in range(n)],
                    "written": list(range(step.position, step.position + n)),
                    "read": [[i] for i in range(step.position, step.position + n)], "read_view": "after_writes"}

    class Adapter(kvcheck_protocol.Adapter):
        name = "library-test"

        def capabilities(self):
            return {"steps": ["prefill_store_then_load", "decode", "finish"], "formats": ["f64"],
                    "rope": ["none"], "layouts": ["mha"]}

        def make_cache(self, spec):
            self.cache = ProtocolLibraryTest.Cache(spec)
            return self.cache

    def answer(self, session, msg):
        raw = msg if isinstance(msg, bytes) else json.dumps(msg).encode()
        line = session.handle(raw)
        self.assertNotIn("\n", line)
        return json.loads(line)

    def test_a_cache_on_the_library_alone(self):
        adapter = self.Adapter()
        session = kvcheck_protocol.Session(adapter)
        hello = self.answer(session, {"op": "hello", "protocol": "kvcheck-exec", "version": 1})
        self.assertEqual(hello, {"ok": True, "protocol": "kvcheck-exec", "version": 1, "name": "library-test",
                                 "capabilities": adapter.capabilities()})
        self.assertEqual(self.answer(session, {"op": "begin", "layer": 0, "request": 1, "state": 0}),
                         {"ok": False, "error": "not-open", "detail": "no case is open"})
        spec = make_spec(head_dim=2)
        self.assertEqual(self.answer(session, {"op": "open", "spec": dict(spec, format="bf16")}),
                         {"ok": False, "refused": "format bf16"})
        self.assertEqual(self.answer(session, {"op": "open", "spec": spec}), {"ok": True})
        self.assertEqual(self.answer(session, {"op": "begin", "layer": 0, "request": 1, "state": 0}), {"ok": True})
        rows = [[0.5, 0.25], [1.0, -1.0]]
        got = self.answer(session, {"op": "prefill", "layer": 0, "request": 1, "state": 0, "position": 0,
                                    "rows": 2, "order": "store_then_load", "k": rows, "v": rows, "q": rows})
        self.assertEqual(got["written"], [0, 1])
        self.assertEqual(self.answer(session, {"op": "accept", "layer": 0, "request": 1, "state": 0,
                                               "accepted": 0}),
                         {"ok": False, "error": "bad-accept", "detail": "no verify is pending"})
        # Strict input: the cache never sees a malformed request.
        for bad in ({"op": "decode", "layer": 0, "request": 1, "state": 0, "position": 2, "k": [[1.0]],
                     "v": [[1.0, 2.0]], "q": [[1.0, 2.0]]},
                    {"op": "decode", "layer": 0, "request": 1, "state": 0, "position": 2, "k": [[1.0, 2.0]],
                     "v": [[1.0, 2.0]], "q": [[1.0, 2.0]], "extra": 1},
                    b'{"op":"decode","op":"finish"}', b"[1]", b"not json"):
            self.assertEqual(self.answer(session, bad)["error"], "bad-request", bad)
        self.assertEqual(self.answer(session, {"op": "frobnicate"})["error"], "unknown-op")
        self.assertEqual(self.answer(session, {"op": "finish", "layer": 0, "request": 1, "state": 0}), {"ok": True})
        self.assertEqual(adapter.cache.calls, [
            ("begin", 0, 0, 1), ("prefill", 0, 0, 1, 0, 2, "store_then_load", None, 2, False, 2),
            ("finish", 0, 0, 1)])
        # An answer that would hold Infinity is never sent.
        adapter.cache.write = lambda step: {"ok": True, "out": [[math.inf]]}
        self.assertEqual(self.answer(session, {"op": "decode", "layer": 0, "request": 1, "state": 0,
                                               "position": 2, "k": rows[:1], "v": rows[:1], "q": rows[:1]})["error"],
                         "non-finite")
        self.assertEqual(self.answer(session, {"op": "bye"}), {"ok": True})
        self.assertTrue(session.done)

    def test_the_library_stands_alone(self):
        # Standard library only, and nothing of the bundled caches in it.
        with open(os.path.join(ROOT, "python", "kvcheck", "protocol.py")) as f:
            text = f.read()
        imports = {line.split()[1] for line in text.splitlines() if line.startswith(("import ", "from "))}
        self.assertEqual(imports, {"argparse", "array", "json", "math", "sys"})
        for name in kvcheck_protocol.__all__:
            self.assertTrue(hasattr(kvcheck_protocol, name), name)


class MathTest(unittest.TestCase):
    def test_bf16_rounding(self):
        rng = random.Random(7)
        values = [1.0, -1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -40, 255.5, -256.5,
                  2.0 ** -126, 2.0 ** -133, 2.0 ** -134, 3 * 2.0 ** -135, 2.0 ** -140, 1e-320,
                  3.3895313892515355e38, 3.4e38, 1e300, -0.0, 0.0]
        values += [rng.uniform(-4, 4) * 2.0 ** rng.randint(-140, 130) for _ in range(2000)]
        for x in values:
            got, want = window_cache.bf16(x), ref_bf16(x)
            self.assertTrue(got == want and math.copysign(1, got) == math.copysign(1, want), (x, got, want))

    def test_output_format_rounding_agrees_with_the_adapters_bf16(self):
        # The package's round_output and the adapter's own bf16 rounding are two
        # implementations of one rule: they agree value for value.
        import kvcheck
        rng = random.Random(11)
        values = [1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -40, 2.0 ** -133, 3 * 2.0 ** -135, 3.4e38, -0.0]
        values += [rng.uniform(-4, 4) * 2.0 ** rng.randint(-140, 130) for _ in range(2000)]
        for x in values:
            got, want = kvcheck.round_output([x], "bf16")[0], window_cache.bf16(x)
            self.assertTrue(got == want and math.copysign(1, got) == math.copysign(1, want), (x, got, want))

    def test_f32_rounding(self):
        rng = random.Random(8)
        row = [rng.uniform(-3, 3) for _ in range(1000)]
        self.assertEqual(window_cache.round_f32(row), ref_round(row, "f32"))


class CacheTest(AdapterTest):
    def test_ring_small_case_slots_and_outputs(self):
        adapter = self.start(RING)
        spec = make_spec(states=2, capacity=9, param=5, convention="left", q_heads=2, kv_heads=1,
                         head_dim=4, style="neox", rotary_dims=4, softmax_scale=0.5)
        steps = [prefill(3, 4, "load_then_store"), prefill(3, 3, "store_then_load"), decode(3),
                 verify(3, 2), accept(3, 1), prefill(3, 5, "load_then_store"), decode(3)]
        failures, case = self.run_case(adapter, spec, {3: 1}, steps)
        self.assertEqual(failures, [])
        positions = [range(0, 4), range(4, 7), range(7, 8), range(8, 11), range(10, 15), range(15, 16)]
        keys = 6
        for answer, span in zip(case.answers, positions):
            self.assertEqual(answer["written"], [9 + p % 9 for p in span])
            self.assertEqual(answer["read"], [[9 + x % 9 for x in range(max(0, p - keys + 1), p + 1)]
                                              for p in span])
        views = [a["read_view"] for a in case.answers]
        self.assertEqual(views, ["causal", "after_writes", "after_writes", "after_writes", "causal",
                                 "after_writes"])

    def test_ring_formats_layouts_sink(self):
        adapter = self.start(RING)
        configs = [dict(fmt="f32", q_heads=4, kv_heads=2, style="interleaved", rotary_dims=2),
                   dict(fmt="bf16", q_heads=2, kv_heads=1, shared_row=True, style="neox", rotary_dims=4,
                        sink=0.5),
                   dict(fmt="bf16", q_heads=2, kv_heads=2, sink=-1.0, layers=2, base=100.0,
                        style="neox", rotary_dims=4)]
        steps = [prefill(0, 7, "store_then_load"), verify(0, 3), accept(0, 0), decode(0),
                 prefill(0, 9, "load_then_store"), decode(0)]
        for i, cfg in enumerate(configs):
            spec = make_spec(capacity=12, param=4, convention="off-by-one", **cfg)
            failures, _ = self.run_case(adapter, spec, {0: 0}, steps, seed=i)
            self.assertEqual(failures, [], cfg)

    def test_paged_blocks_lifo_and_rejected_drafts(self):
        adapter = self.start(PAGED, "--block-size", "2")
        spec = make_spec(states=2, capacity=4, param=2, max_step_rows=4)  # 3 blocks per state
        case = Case(adapter, spec, {0: 0, 1: 1}, ring=False)
        case.run([decode(0)] * 7)
        self.assertEqual(case.failures, [])
        # keys 2, B 2: block 0 is freed once position 2 is committed and the
        # next allocation (position 4) reuses it; block 1 comes back for 6.
        self.assertEqual([a["written"][0] for a in case.answers], [0, 1, 2, 3, 0, 1, 2])
        self.assertEqual(case.answers[4]["read"], [[3, 0]])
        case.close()
        # Two blocks freed at once (finish) go back in table order; the one
        # pushed last is handed out first: request 1 gets id 2, then id 1.
        case = Case(adapter, spec, {0: 0, 1: 1}, ring=False)
        case.run([prefill(0, 2), verify(0, 3), accept(0, 0), {"kind": "finish", "request": 0}])
        self.assertEqual([a["written"] for a in case.answers], [[0, 1], [2, 3, 4, 5]])
        case.answers.clear()
        case.run([decode(1)] * 4)
        self.assertEqual(case.failures, [])
        self.assertEqual([a["written"][0] for a in case.answers], [4, 5, 2, 3])
        case.close()
        # A rejected draft's row stays in its block and is overwritten in place.
        case = Case(adapter, spec, {0: 0}, ring=False)
        case.run([prefill(0, 2), verify(0, 2), accept(0, 0), decode(0), decode(0)])
        self.assertEqual(case.failures, [])
        self.assertEqual([a["written"] for a in case.answers], [[0, 1], [2, 3, 4], [3], [4]])
        case.close()

    def test_paged_out_of_blocks_refusal_changes_nothing(self):
        adapter = self.start(PAGED)  # B = 4
        spec = make_spec(states=1, capacity=2, param=8, max_step_rows=16)  # 2 blocks in all
        self.assertEqual(adapter.send({"op": "open", "spec": spec}), {"ok": True})
        t = {"layer": 0, "request": 0, "state": 0}
        self.assertEqual(adapter.send({"op": "begin", **t}), {"ok": True})
        rows = lambda n, w=4: [[0.5] * w] * n  # noqa: E731
        big = {"op": "prefill", **t, "position": 0, "rows": 12, "order": "store_then_load",
               "k": rows(12), "v": rows(12), "q": rows(12)}
        answer = adapter.send(big)
        self.assertEqual(answer["error"], "out-of-blocks")
        ok = adapter.send(dict(big, rows=8, k=rows(8), v=rows(8), q=rows(8)))
        self.assertEqual(ok["written"], list(range(8)))

    def test_paged_load_then_store_chunk_as_long_as_capacity(self):
        # keys 7, chunks of 16 rows and a capacity of 16 (the load_then_store
        # minimum): the old window's blocks must be freed while the chunk is
        # stored, or the pool (5 blocks of 4) runs out.
        adapter = self.start(PAGED)
        spec = make_spec(states=1, capacity=16, param=7, max_step_rows=16)
        failures, _ = self.run_case(adapter, spec, {0: 0}, [prefill(0, 16)] * 4 + [decode(0)], ring=False)
        self.assertEqual(failures, [])

    def test_random_schedules_pass(self):
        # Many lines: each is validated against its own schema definition only.
        ring = self.start(RING, exact_schema=False)
        paged = {b: self.start(PAGED, "--block-size", str(b), exact_schema=False) for b in (1, 2, 3, 4, 8)}
        for seed in range(50):
            spec, requests, steps = random_case(seed)
            failures, _ = self.run_case(ring, spec, requests, steps, seed=seed)
            self.assertEqual(failures, [], f"ring-cache, seed {seed}")
            b = (1, 2, 3, 4, 8)[seed % 5]
            failures, _ = self.run_case(paged[b], spec, requests, steps, seed=seed, ring=False)
            self.assertEqual(failures, [], f"paged-cache --block-size {b}, seed {seed}")


class BugTest(AdapterTest):
    # Crafted cases: (script, bug, extra args, spec, requests, steps); each
    # passes on the default cache and fails with the bug.
    CRAFTED = [
        (RING, "ring-sized-window", (), make_spec(capacity=5, param=3, max_step_rows=3),
         [prefill(0, 3), verify(0, 2), accept(0, 0), decode(0)]),
        (RING, "rope-at-slot", (), make_spec(capacity=3, param=2, style="neox", rotary_dims=4),
         [decode(0)] * 5),
        (RING, "window-plus-one", (), make_spec(capacity=3, param=2), [decode(0)] * 3),
        (PAGED, "free-speculative", ("--block-size", "2"), make_spec(capacity=6, param=3),
         [prefill(0, 5), verify(0, 3), accept(0, 0), decode(0)]),
        (PAGED, "free-early", ("--block-size", "2"), make_spec(capacity=4, param=3), [decode(0)] * 5),
        (PAGED, "left-as-keys", ("--block-size", "2"), make_spec(capacity=4, param=2, convention="left"),
         [decode(0)] * 5),
    ]

    def test_each_bug_fails_a_crafted_case(self):
        for script, bug, extra, spec, steps in self.CRAFTED:
            ring = script == RING
            good = self.start(script, *extra)
            good_failures, good_case = self.run_case(good, spec, {0: 0}, steps, ring=ring)
            self.assertEqual(good_failures, [], bug)
            bad = self.start(script, *extra, "--bug", bug)
            self.assertIn(bug, bad.hello()["name"])
            bad_failures, bad_case = self.run_case(bad, spec, {0: 0}, steps, ring=ring)
            self.assertNotEqual(bad_failures, [], bug)
            self.assertNotEqual(good_case.answers, bad_case.answers, bug)

    def test_each_bug_fails_some_random_schedules(self):
        runs = [(RING, b, ()) for b in ("ring-sized-window", "rope-at-slot", "window-plus-one")]
        runs += [(PAGED, b, ()) for b in ("free-speculative", "free-early", "left-as-keys")]
        for script, bug, extra in runs:
            adapter = self.start(script, *extra, "--bug", bug, exact_schema=False)
            caught = None
            for seed in range(300):
                spec, requests, steps = random_case(1000 + seed)
                failures, _ = self.run_case(adapter, spec, requests, steps, seed=seed, ring=script == RING)
                if failures:
                    caught = seed
                    break
            self.assertIsNotNone(caught, f"{bug}: no generated schedule of 300 failed")


if __name__ == "__main__":
    unittest.main()
