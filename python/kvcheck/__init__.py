"""kvcheck for Python: check an engine's KV cache from Python and pytest.

* `kvcheck.protocol`: the exec protocol (adapters/PROTOCOL.md): strict
  decoding, the session loop, typed answers. Standard library only; rows as
  numpy arrays when an adapter asks for them.
* `kvcheck.Engine`: the base class an engine's adapter subclasses, one
  method per step, and the helpers that build its answers (`answer`,
  `ring_slot`, `block_slot`, `window`, `stored_rows`); `kvcheck.serve`
  runs it, as does `python3 -m kvcheck MODULE:CLASS`.
* `kvcheck.testing`: run `kvcheck check` / `replay` on an engine from a test;
  `kvcheck.pytest_plugin`: the same as a pytest fixture (`check_engine`).

docs/python.md is the guide.
"""

__version__ = "0.1.0"

from . import protocol  # noqa: F401
from .engine import (Engine, EngineAdapter, answer, block_slot, ring_slot, round_output, serve,  # noqa: F401
                     slot_events, stored_rows, window)
from .protocol import BadRequest, OpenRefused, Refusal, Spec, WriteStep  # noqa: F401

__all__ = ["protocol", "Engine", "EngineAdapter", "answer", "block_slot", "ring_slot", "round_output", "serve",
           "slot_events", "stored_rows", "window", "BadRequest", "OpenRefused", "Refusal", "Spec", "WriteStep"]
