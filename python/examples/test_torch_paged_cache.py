import importlib.util
import os
import sys

import pytest

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_paged_cache.py")


@pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                    reason="PyTorch is not installed (Debian: python3-torch): the torch example is not checked")
def test_torch_paged_cache(check_engine):
    # The adapter as a command: torch is imported in the adapter's process only.
    # Importing torch takes seconds (tens on a loaded machine) before the hello
    # is answered: a step timeout past kvcheck's default 10 s.
    check_engine(f"{sys.executable} {EXAMPLE}", cases=50, args=["--step-timeout", "120"])
