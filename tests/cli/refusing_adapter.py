#!/usr/bin/env python3
"""The bundled ring adapter, refusing some configurations at open (tests only).

Usage: refusing_adapter.py [--head-dim-multiple N] [--refuse-share F]
  --head-dim-multiple N  refuses every open whose head_dim is not a multiple
                         of N (as kernels that need head_dim % 8 == 0 do)
  --refuse-share F       refuses a share F of the opens, chosen by a hash of
                         the open's spec (deterministic, whatever the order)
Everything it does not refuse it runs as adapters/ring_cache.py does, so
every case that runs passes; what it refuses is refused, not failed.
"""
import hashlib
import json
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "adapters"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))  # the kvcheck package

from kvcheck import protocol as kp  # noqa: E402
import ring_cache  # noqa: E402


class RefusingAdapter(ring_cache.RingAdapter):
    """Ring cache that refuses some opens (kvcheck exec protocol v1)."""

    name = "refusing-ring-cache"

    def add_arguments(self, parser):
        parser.add_argument("--head-dim-multiple", type=int, default=1)
        parser.add_argument("--refuse-share", type=float, default=0.0)

    def configure(self, args):
        self.multiple = args.head_dim_multiple
        self.share = args.refuse_share

    def make_cache(self, spec):
        if spec.head_dim % self.multiple != 0:
            raise kp.OpenRefused(f"head_dim {spec.head_dim} is not a multiple of {self.multiple}")
        if self.share > 0:
            fields = (spec.states, spec.capacity, spec.keys, spec.q_heads, spec.kv_heads, spec.head_dim,
                      spec.shared_row, spec.format, spec.layers, spec.max_step_rows, spec.rope_style,
                      spec.rotary_dims, spec.rope_base, spec.softmax_scale, spec.sink)
            digest = hashlib.sha256(json.dumps(fields).encode()).digest()
            if int.from_bytes(digest[:8], "big") / 2.0**64 < self.share:
                raise kp.OpenRefused("this configuration is refused (--refuse-share)")
        return super().make_cache(spec)


if __name__ == "__main__":
    sys.exit(RefusingAdapter().main())
