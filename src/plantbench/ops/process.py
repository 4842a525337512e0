"""A step's process dies with the job that owns it, and says how much memory it took.

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
import re
import resource
import signal
import sys
from pathlib import Path
from typing import TextIO

PR_SET_PDEATHSIG = 1  # linux/prctl.h
PEAK_LINE = "plantbench: peak resident memory"
_PEAK = re.compile(rf"^{re.escape(PEAK_LINE)} ([0-9.]+) MB$", re.MULTILINE)


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


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, MB (MiB, as Snakemake's ``max_rss``)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def report_peak(stream: TextIO) -> None:
    """Write :data:`PEAK_LINE` with :func:`peak_rss_mb` to ``stream`` (a step's log)."""
    print(f"{PEAK_LINE} {peak_rss_mb():.1f} MB", file=stream, flush=True)


def logged_peak_mb(log: Path) -> float | None:
    """The peak memory a step's log reports: the sum over its processes' lines (each rank of a
    data-parallel step writes one); None when the log has none (a failed or older step)."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    values = [float(v) for v in _PEAK.findall(text)]
    return sum(values) if values else None
