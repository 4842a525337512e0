"""How a pretraining run is interrupted: the stop signals a cluster sends before a time limit or
preemption (the loop, :mod:`plantbench.model.train_loop`, saves the resumable state after the
current step and raises :class:`~plantbench.errors.Preempted`: exit code 75, retried), and the
test hook that kills a run right after a given step, as a crash would."""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Any

log = logging.getLogger("plantbench.model.pretrain")  # the pretrain step's log (one name)

# SIGTERM: scancel / preemption; SIGUSR1: `--signal=USR1@T`; SIGURG: `--signal=URG@T`, the one
# the Slurm profile uses because the executor's job wrapper survives it (see profiles/slurm).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGURG)


class StopFlag:
    """The handler of :data:`STOP_SIGNALS` while the loop runs: it records the signal."""

    def __init__(self) -> None:
        self.signal: int | None = None

    def __call__(self, signum: int, _frame: Any) -> None:
        self.signal = signum
        log.warning("received signal %d: will save state after this step and exit", signum)


def fault_injection(model_name: str, step: int) -> None:
    """Test hook: ``PLANTBENCH_FAULT=pretrain:<model>:<step>`` kills this process (SIGKILL)
    right after that step completes, as a crash would."""
    spec = os.environ.get("PLANTBENCH_FAULT", "")
    for item in filter(None, spec.split(",")):
        parts = item.split(":")
        if (
            len(parts) == 3
            and parts[0] == "pretrain"
            and parts[1] in (model_name, "*")
            and int(parts[2]) == step
        ):
            marker = os.environ.get("PLANTBENCH_FAULT_ONCE")
            if marker:
                m = Path(marker)
                if m.exists():
                    return
                m.write_text(item)
            log.error("fault injection: killing pretraining of %s after step %d", model_name, step)
            os.kill(os.getpid(), signal.SIGKILL)
