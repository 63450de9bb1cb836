"""Run `kvcheck check` or `kvcheck replay` on an engine from a test.

    from kvcheck import testing
    testing.check(MyCache, cases=200, seed=1)       # raises CheckFailed
    testing.replay("counterexample.json", MyCache)

`engine` is an Engine or protocol.Adapter subclass defined at the top level
of a module (kvcheck starts it in a child process through a small generated
script, `python3 -m kvcheck MODULE:CLASS` inside), or an adapter command
line (a str). A failure raises CheckFailed, an AssertionError whose message
holds the first-failure line, the shrunk counterexample and the exact replay
command; a run kvcheck could not complete (exit 2 or 3: bad flags, an
adapter that broke the protocol) raises it too, with kvcheck's output.
The pytest plugin (`kvcheck.pytest_plugin`) wraps this as a fixture.

Hypothesis: kvcheck draws and shrinks its own cases, so a Hypothesis test
only chooses seeds, e.g. `@given(st.integers(0, 2**63 - 1))` then
`check(MyCache, seed=seed, cases=20)`; the failure names the seed and the
replay command, which reproduce it without Hypothesis.
"""

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

__all__ = ["CheckFailed", "CheckResult", "check", "replay", "find_binary", "adapter_command"]

# Lines of the counterexample shown in a failure message (the file has all).
_SHOWN_LINES = 80


class CheckFailed(AssertionError):
    """kvcheck found a failing case, or could not complete the run. Fields:
    result (the CheckResult), first_failure, counterexample_path,
    counterexample (its text), replay (the command that reruns it)."""

    def __init__(self, message, result):
        super().__init__(message)
        self.result = result
        self.first_failure = result.first_failure
        self.counterexample_path = result.counterexample_path
        self.counterexample = result.counterexample
        self.replay = result.replay


class CheckResult:
    """One kvcheck run: command (argv), exit_code, stdout, stderr, out (the
    report folder), and from the output: summary (its first line),
    first_failure, counterexample_path, counterexample (text), replay."""

    def __init__(self, command, completed, out):
        self.command = command
        self.exit_code = completed.returncode
        self.stdout = completed.stdout
        self.stderr = completed.stderr
        self.out = out
        lines = self.stdout.splitlines()
        self.summary = lines[0] if lines else ""
        self.first_failure = _field(lines, "first failure:")
        if self.first_failure is None:
            # Two caches side by side (against=, repeat_bitwise=): the first difference.
            self.first_failure = _first_difference(lines)
        self.counterexample_path = _field(lines, "written to ")
        self.replay = _field(lines, "replay: ")
        if self.replay is not None and self.replay.startswith("kvcheck "):
            # kvcheck names itself "kvcheck"; the command must run the binary this run used.
            self.replay = shlex.quote(command[0]) + self.replay[len("kvcheck"):]
        self.counterexample = None
        if self.counterexample_path and os.path.isfile(self.counterexample_path):
            with open(self.counterexample_path, encoding="utf-8") as f:
                self.counterexample = f.read()

    @property
    def passed(self):
        return self.exit_code == 0

    def failure_message(self, rerun=None):
        """What a test failure shows: the summary, the first failure, the
        counterexample, the replay command (and `rerun`, how to rerun the check)."""
        parts = []
        if self.exit_code == 1:
            parts.append("kvcheck found a failing case: " + self.summary)
            lines = self.stdout.splitlines()[1:]
            for i, line in enumerate(lines):
                if line.startswith(("agreement of ", "counterexample:", "  first failure:",
                                    "  A against ", "  B against ")):
                    parts.append(line)
                elif line.startswith("  first difference"):
                    parts.append(line)
                    parts.extend(d for d in _indented(lines[i + 1:]))
            if self.counterexample is not None:
                text = self.counterexample.splitlines()
                shown = "\n".join(text[:_SHOWN_LINES])
                if len(text) > _SHOWN_LINES:
                    shown += f"\n... ({len(text) - _SHOWN_LINES} more lines in the file)"
                parts.append(f"shrunk counterexample ({self.counterexample_path}):\n{shown}")
            elif self.first_failure is None:
                parts.append(self.stdout.rstrip())
        else:
            parts.append(f"kvcheck exited with {self.exit_code} (2: bad usage or input, an adapter that broke "
                         f"the protocol; 3: an internal error): {shlex.join(self.command)}")
            parts.append((self.stdout + self.stderr).rstrip())
        if self.replay is not None:
            parts.append("replay: " + self.replay)
        if rerun:
            parts.append("rerun: " + rerun)
        return "\n".join(parts)


def _field(lines, marker):
    for line in lines:
        at = line.find(marker)
        if at >= 0:
            return line[at + len(marker):].strip() if marker != "first failure:" else line.strip()
    return None


def _indented(lines):
    # The lines under a "first difference" header (indented deeper than it).
    for line in lines:
        if not line.startswith("    "):
            break
        yield line


def _first_difference(lines):
    for i, line in enumerate(lines):
        if line.startswith("  first difference"):
            shown = list(_indented(lines[i + 1:]))
            return "first difference: " + shown[0].strip() if shown else line.strip()
        if line.lstrip().startswith("differs: "):  # replay --against
            return "first difference: " + line.strip()[len("differs: "):]
    return None


def _side_by_side_args(against, bitwise, repeat_bitwise, workdir, python):
    # kvcheck's --against/--bitwise/--repeat-bitwise from check()'s keywords.
    args = []
    if against is not None:
        if isinstance(against, str) and (against.startswith("exec:") or
                                         (against and not any(c.isspace() or c == "/" for c in against))):
            impl = against  # "exec:COMMAND" as it is, or an in-process cache's name (cpu, layer, paged)
        else:
            impl = "exec:" + adapter_command(against, workdir, python)
        args += ["--against", impl]
    if bitwise:
        args.append("--bitwise")
    if repeat_bitwise:
        args.append("--repeat-bitwise")
    return args


def find_binary(binary=None):
    """The kvcheck executable: `binary`, else $KVCHECK, else `kvcheck` on PATH."""
    candidate = binary or os.environ.get("KVCHECK") or shutil.which("kvcheck")
    if not candidate:
        raise FileNotFoundError("no kvcheck executable: pass --kvcheck-binary PATH (pytest), binary=PATH, "
                                "set KVCHECK, or put kvcheck on PATH")
    path = shutil.which(candidate) or candidate
    if not os.path.isfile(path):
        raise FileNotFoundError(f"kvcheck executable not found: {candidate}")
    return os.path.abspath(path)


def _target(engine_class):
    # How the child finds the class: by module name when the module is
    # importable as such, else by its file.
    module = sys.modules.get(engine_class.__module__)
    name = engine_class.__qualname__
    if "." in name or "<" in name:
        raise TypeError(f"{name}: kvcheck runs an engine class in another process; define it at the top "
                        "level of a module")
    path = getattr(module, "__file__", None)
    if engine_class.__module__ != "__main__":
        try:
            spec = importlib.util.find_spec(engine_class.__module__)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and path and spec.origin and os.path.samefile(spec.origin, path):
            return f"{engine_class.__module__}:{name}"
    if not path:
        raise TypeError(f"{name}: its module {engine_class.__module__} has no file to load it from")
    return f"{os.path.abspath(path)}:{name}"


def adapter_command(engine, workdir, python=None):
    """The exec command line for `engine`: a str is used as it is; a class
    gets a script in `workdir` that serves it (the replay command runs it
    from any shell)."""
    if isinstance(engine, str):
        return engine
    target = _target(engine)
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = [package_parent] + [os.path.abspath(p) for p in sys.path if p and os.path.isdir(p)]
    script = os.path.join(workdir, f"kvcheck-adapter-{engine.__name__}.py")
    with open(script, "w", encoding="utf-8") as f:
        f.write("# Generated by kvcheck.testing: serves " + target + " to kvcheck.\n"
                "import sys\n"
                f"sys.path[:0] = {paths!r}\n"
                "from kvcheck.__main__ import main\n"
                f"main([{target!r}] + sys.argv[1:])\n")
    return f"{shlex.quote(python or sys.executable)} {shlex.quote(script)}"


def _run(argv, out, timeout):
    completed = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    return CheckResult(argv, completed, out)


def check(engine, cases=200, seed=1, args=(), binary=None, out=None, python=None, timeout=None, rerun=None,
          against=None, bitwise=False, repeat_bitwise=False):
    """Runs `kvcheck check` on `engine` with `cases` and `seed` (and extra
    kvcheck flags `args`), writing its reports and counterexample under
    `out` (default: a new temporary folder). Returns the CheckResult when
    every case passed; raises CheckFailed otherwise.

    Two caches side by side: `against` (an Engine class, an adapter command
    line, "exec:COMMAND", or the name of a cache built into kvcheck such as
    "cpu" - a str without spaces or "/") runs every case beside `engine`
    (`--against`); any step where what they hold, read or output differs
    fails, shrunk like a failure. `bitwise=True` asks for bit-equal outputs
    then (`--bitwise`). `repeat_bitwise=True` runs every case twice on
    `engine` and fails unless the two runs agree bit for bit
    (`--repeat-bitwise`)."""
    binary = find_binary(binary)
    out = out or tempfile.mkdtemp(prefix="kvcheck-")
    os.makedirs(out, exist_ok=True)
    impl = "exec:" + adapter_command(engine, out, python)
    argv = [binary, "check", "--impl", impl, "--cases", str(cases), "--seed", str(seed), "--out", str(out)]
    argv += _side_by_side_args(against, bitwise, repeat_bitwise, out, python)
    result = _run(argv + list(args), out, timeout)
    if not result.passed:
        raise CheckFailed(result.failure_message(rerun), result)
    return result


def replay(path, engine, args=(), binary=None, out=None, python=None, timeout=None, against=None, bitwise=False,
           repeat_bitwise=False):
    """Runs `kvcheck replay PATH` (a scenario, trace or counterexample file,
    or a folder of them) on `engine`; raises CheckFailed unless it passes.
    `against`, `bitwise` and `repeat_bitwise` as for check()."""
    binary = find_binary(binary)
    out = out or tempfile.mkdtemp(prefix="kvcheck-")
    os.makedirs(out, exist_ok=True)
    impl = "exec:" + adapter_command(engine, out, python)
    argv = [binary, "replay", str(path), "--impl", impl, "--report", os.path.join(out, "report.json"),
            "--junit", os.path.join(out, "junit.xml")]
    argv += _side_by_side_args(against, bitwise, repeat_bitwise, out, python)
    result = _run(argv + list(args), out, timeout)
    if not result.passed:
        raise CheckFailed(result.failure_message(), result)
    return result
