#!/usr/bin/env python3
"""Every report kvcheck writes parses with a real parser, whatever the input.

    wellformed_test.py KVCHECK SOURCE_DIR

Hostile input: a scenario named with U+FFFE, markup characters and quotes,
stored in a directory whose name holds a byte that is not UTF-8 (so the
command line, the report paths and the replay command carry it), replayed
with a fault so failure messages and explanations are written too; and a
property check with a counterexample written into such a directory.
Judged with xmllint (junit.xml as XML, report.html with the HTML parser:
only "Tag ... invalid", its complaint about HTML5 elements it predates, is
tolerated), with the published JSON Schema for report.json
(scenarios/schema/report.schema.json), and every bundled scenario with
scenarios/schema/scenario.schema.json.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import jsonschema

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cli"))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import harness  # noqa: E402 (tests/cli/harness.py)
from harness import fail, finish  # noqa: E402

KVCHECK = sys.argv[1]
SOURCE = sys.argv[2]


def run(args):
    code, out, err = harness.run([os.fsencode(a) if isinstance(a, str) else a for a in args], errors="replace")
    return code, out + err


def xmllint(path, html):
    args = ["xmllint", "--noout"] + (["--html"] if html else []) + [path]
    proc = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    errors = [line for line in proc.stderr.decode("utf-8", "replace").splitlines()
              if re.search(r"(parser )?error", line)]
    if html:
        errors = [e for e in errors if not re.search(r"Tag \S+ invalid", e)]
    return errors


def load_schema(name):
    with open(os.path.join(SOURCE, "scenarios", "schema", name), encoding="utf-8") as f:
        schema = json.load(f)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


report_schema = load_schema("report.schema.json")
scenario_schema = load_schema("scenario.schema.json")

# Every bundled scenario against the scenario schema.
bundled = 0
for folder in ("fast", "regressions"):
    d = os.path.join(SOURCE, "scenarios", folder)
    for name in sorted(os.listdir(d)):
        if not name.endswith(".json"):
            continue
        with open(os.path.join(d, name), encoding="utf-8") as f:
            doc = json.load(f)
        errors = sorted(scenario_schema.iter_errors(doc), key=str)
        if errors:
            fail("scenario %s/%s: %s" % (folder, name, errors[0].message))
        bundled += 1
if bundled < 10:
    fail("only %d bundled scenarios found" % bundled)

work = tempfile.mkdtemp(prefix="kvcheck-wellformed-")
try:
    hostile_dir = os.path.join(os.fsencode(work), b"dir-\xff-<&>")  # not UTF-8
    os.mkdir(hostile_dir)
    with open(os.path.join(SOURCE, "scenarios", "fast", "verify-reject-then-decode.json"), encoding="utf-8") as f:
        scenario = json.load(f)
    hostile_name = "name \ufffe <b>&amp;</b> \"quoted\" 'single'"
    scenario["name"] = hostile_name
    scenario_file = os.path.join(hostile_dir, b"scenario.json")
    with open(scenario_file, "w", encoding="utf-8") as f:
        json.dump(scenario, f, ensure_ascii=False)

    outputs = []
    # replay: a failing run (the fault narrows the window), its three files.
    junit = os.path.join(hostile_dir, b"junit.xml")
    html = os.path.join(hostile_dir, b"report.html")
    report = os.path.join(hostile_dir, b"report.json")
    code, out = run([KVCHECK, "replay", scenario_file, "--fault", "window-too-narrow",
                     "--junit", junit, "--html", html, "--report", report])
    if code != 1:
        fail("replay with a fault exited %d, expected 1:\n%s" % (code, out))
    outputs.append((junit, html, report))
    # check: a failing property with a counterexample in a hostile --out.
    check_out = os.path.join(hostile_dir, b"check-\xfe")
    code, out = run([KVCHECK, "check", "--cases", "60", "--seed", "3", "--fault", "slot-no-state-offset",
                     "--out", check_out])
    if code != 1:
        fail("check with a fault exited %d, expected 1:\n%s" % (code, out))
    outputs.append((os.path.join(check_out, b"junit.xml"), os.path.join(check_out, b"report.html"),
                    os.path.join(check_out, b"report.json")))

    for junit, html, report in outputs:
        for path in (junit, html, report):
            if not os.path.isfile(path):
                fail("missing %r" % path)
        if harness.failures:
            continue
        for e in xmllint(junit, html=False):
            fail("%r: %s" % (junit, e))
        for e in xmllint(html, html=True):
            fail("%r: %s" % (html, e))
        with open(junit, "rb") as f:
            raw = f.read()
        try:
            raw.decode("utf-8")  # strict
        except UnicodeDecodeError as e:
            fail("%r is not UTF-8: %s" % (junit, e))
        if b"\xef\xbf\xbe" in raw:
            fail("%r holds U+FFFE" % junit)
        with open(report, "rb") as f:
            try:
                doc = json.loads(f.read().decode("utf-8"))
            except ValueError as e:
                fail("%r is not UTF-8 JSON: %s" % (report, e))
                continue
        errors = sorted(report_schema.iter_errors(doc), key=str)
        for e in errors[:5]:
            fail("%r: %s at %s" % (report, e.message, "/".join(str(p) for p in e.absolute_path)))
        if doc["verdict"] != "fail":
            fail("%r: verdict %s, expected fail" % (report, doc["verdict"]))
    # The hostile name reached the reports, escaped (U+FFFE replaced by U+FFFD).
    with open(outputs[0][0], encoding="utf-8", errors="replace") as f:
        text = f.read()
    if "name \ufffd &lt;b&gt;&amp;amp;&lt;/b&gt; &quot;quoted&quot; &apos;single&apos;" not in text:
        fail("the scenario name is not in junit.xml escaped as expected")
finally:
    shutil.rmtree(work, ignore_errors=True)

sys.exit(finish())
print("ok: %d bundled scenarios and 2 report sets (replay, check) well-formed" % bundled)
