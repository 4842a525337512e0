"""A step's process dies with the job that owns it.

Snakemake runs each rule's command through a shell wrapper. A cluster's ``scancel`` of the job
step (or anything else that sends SIGTERM to that wrapper) ends the wrapper, and without this
the Python process below it is re-parented and goes on to write its outputs after the run that
owned it has ended. :func:`die_with_parent` asks the kernel to send the step SIGTERM the moment
its parent exits (Linux ``PR_SET_PDEATHSIG``); the training steps catch SIGTERM as a stop
signal, save their resumable state and exit 75, the others end at once, before any meta.json.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(sig: int = signal.SIGTERM) -> bool:
    """Have ``sig`` sent to this process when its parent exits; True where the system supports
    it (Linux). A parent gone while asking ends the process now."""
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:  # orphaned while asking: no one owns this step any more
        os.kill(os.getpid(), sig)
    return True
