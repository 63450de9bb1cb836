"""kvcheck for Python: check an engine's KV cache from Python and pytest.

* `kvcheck.protocol`: the exec protocol (adapters/PROTOCOL.md): strict
  decoding, the session loop, typed answers. Standard library only.

docs/python.md is the guide.
"""

__version__ = "0.1.0"

from . import protocol  # noqa: F401
