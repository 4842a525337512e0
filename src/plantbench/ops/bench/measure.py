"""The measuring kit every ``plantbench bench`` group shares: a result row, a process's peak
memory, the best of repeated timings, and a job run in a fresh process.

:mod:`plantbench.ops.bench.groups` (the groups and the CSV), :mod:`plantbench.ops.bench.gradients` (the
``features`` group) and :mod:`plantbench.ops.bench.peers` (the ``peers`` group) import it; it imports
none of them.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
from pathlib import Path
from typing import Any

COLUMNS = ["stage", "what", "value", "unit", "reference", "ratio"]


def row(
    stage: str, what: str, value: float, unit: str, reference: float | None = None
) -> dict[str, Any]:
    ratio = None if reference in (None, 0) else float(value) / float(reference)  # type: ignore[arg-type]
    return {
        "stage": stage,
        "what": what,
        "value": float(value),
        "unit": unit,
        "reference": reference,
        "ratio": ratio,
    }


def _status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


class PeakMem:
    """Peak anonymous (RssAnon) and total resident (VmRSS) memory above the level at entry,
    sampled every 2 ms."""

    def __init__(self) -> None:
        self.base_anon, self.base_rss = _status_kb("RssAnon"), _status_kb("VmRSS")
        self.anon, self.rss = self.base_anon, self.base_rss
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        self.anon = max(self.anon, _status_kb("RssAnon"))
        self.rss = max(self.rss, _status_kb("VmRSS"))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            time.sleep(0.002)

    def __enter__(self) -> PeakMem:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self._sample()

    @property
    def anon_mb(self) -> float:
        return (self.anon - self.base_anon) / 1024

    @property
    def rss_mb(self) -> float:
        return (self.rss - self.base_rss) / 1024


def spawn(fn: Any, job: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, Any]:
    """``fn(job)`` in a fresh process; ``env``: that process's environment instead of this one's
    (the child imports the package anew, so the float pin follows ``env``)."""
    saved = dict(os.environ)
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        pool = mp.get_context("spawn").Pool(1)  # the workers start here, with os.environ
    finally:
        os.environ.clear()
        os.environ.update(saved)
    with pool:
        return pool.apply(fn, (job,))


def best_time(f: Any, reps: int) -> tuple[float, Any]:
    """Best wall time of ``reps`` calls of ``f()``, and the last result."""
    times, res = [], None
    for _ in range(reps):
        t0 = time.perf_counter()
        res = f()
        times.append(time.perf_counter() - t0)
    return min(times), res
