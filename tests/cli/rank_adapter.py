#!/usr/bin/env python3
"""An exec adapter that misbehaves on MPI rank 1 only (mpi_test.py).

`fail`: on rank 1 it exits before answering hello, so that rank's kvcheck
gets an adapter error. `kill`: on rank 1 it SIGKILLs the kvcheck process
that started it (a rank that dies). Every other rank gets the bundled ring
adapter.
"""
import os
import signal
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

if os.environ.get("OMPI_COMM_WORLD_RANK") == "1":
    if sys.argv[1] == "kill":
        pid = os.getppid()  # /bin/sh -c, or kvcheck itself
        while pid > 1:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "kvcheck":
                    os.kill(pid, signal.SIGKILL)
                    break
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
    sys.exit(3)
adapter = os.path.join(HERE, "..", "..", "adapters", "ring_cache.py")
os.execvp(sys.executable, [sys.executable, adapter])
