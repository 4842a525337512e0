"""The float path: pin it so that CPU weights are bit-identical across x86-64 machines, and
record it so that ``verify`` compares float hashes only where the path matches.

Two things pick the kernels a CPU float computation runs, and so its rounding:

* ATen's instruction-set dispatch (``ATEN_CPU_CAPABILITY``: ``default``, ``avx2``, ``avx512``):
  vectorized softmax, norms, reductions and elementwise kernels accumulate in a different order
  at each width;
* the BLAS's code branch (oneMKL's ``MKL_CBWR``): without it MKL picks a GEMM kernel per
  processor (AVX2, AVX-512, ...) and per cache size.

:func:`pin` sets both, before torch runs its first kernel (``plantbench/__init__.py`` calls it
on import), to the AVX2 branch where the CPU has AVX2 and FMA (every x86-64 server of the last
decade) and to the baseline otherwise, together with oneDNN's instruction-set cap. It overrides
values already in the environment: the point is that the machine does not choose.
``PLANTBENCH_FLOAT_PIN=off`` leaves the environment as it is (the speed benchmark's other arm,
and the test that shows the pin matters).

What the pin cannot cover: thread count (ATen's parallel reductions split work by thread; each
artifact records the count it ran with), library versions (``constraints.txt`` pins them; the
record names torch and MKL) and GPUs (CUDA kernels are not bitwise portable across GPU models;
the record names the device). :func:`record` is what every artifact's ``meta.json`` stores as
``platform``.
"""

from __future__ import annotations

import os
import platform as _platform
import re
import sys
from pathlib import Path
from typing import Any

OFF_ENV = "PLANTBENCH_FLOAT_PIN"
BRANCHES = {  # pin -> the environment that selects it
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "default": {
        "ATEN_CPU_CAPABILITY": "default",
        "MKL_CBWR": "COMPATIBLE",
        "ONEDNN_MAX_CPU_ISA": "SSE41",
    },
}
PIN_KEYS = tuple(BRANCHES["avx2"])
_before: dict[str, str | None] = {}  # the environment as it was before pin() changed it
_state: dict[str, str] = {}


def _cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    try:
        text = cpuinfo.read_text()
    except OSError:
        return set()
    m = re.search(r"^flags\s*:(.*)$", text, re.MULTILINE)
    return set(m.group(1).split()) if m else set()


# instruction sets past the pin that a library may still reach on its own (oneDNN's AMX and
# AVX-512 FP16 kernels, MKL's per-processor paths): recorded, so two machines' paths can be told
_ISA_FLAGS = ("avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile")


def cpu_identity(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, str]:
    """The CPU's vendor, family and model (``/proc/cpuinfo``'s first processor) and the
    instruction sets beyond the pin it offers: what tells an Intel float path from an AMD one."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return {}
    first = text.split("\n\n", 1)[0]
    fields = dict(
        (k.strip(), v.strip()) for k, _, v in (ln.partition(":") for ln in first.splitlines())
    )
    flags = set(fields.get("flags", "").split())
    return {
        "cpu_vendor": fields.get("vendor_id", "unknown"),
        "cpu_family": f"{fields.get('cpu family', '?')}/{fields.get('model', '?')}",
        "cpu_isa": ",".join(f for f in _ISA_FLAGS if f in flags) or "none",
    }


def branch_for(machine: str, flags: set[str]) -> str | None:
    """The pin for this CPU: ``avx2`` with AVX2 and FMA, ``default`` on other x86-64 CPUs, None
    (nothing to pin) off x86-64."""
    if machine not in ("x86_64", "AMD64"):
        return None
    return "avx2" if {"avx2", "fma"} <= flags else "default"


def pin() -> str:
    """Set the float-path environment (once per process); returns what was pinned: a branch
    name, ``off`` (``PLANTBENCH_FLOAT_PIN=off``) or ``none`` (not x86-64)."""
    if _state:
        return _state["pin"]
    if os.environ.get(OFF_ENV, "").lower() in ("off", "0", "false", "no"):
        _state["pin"] = "off"
        return "off"
    branch = branch_for(_platform.machine(), _cpu_flags())
    if branch is None:
        _state["pin"] = "none"
        return "none"
    for key, value in BRANCHES[branch].items():
        _before[key] = os.environ.get(key)
        os.environ[key] = value
    _state["pin"] = branch
    return branch


def unpinned_env() -> dict[str, str]:
    """The environment of a child process that runs without the pin: what this process's
    environment was before :func:`pin`, with ``PLANTBENCH_FLOAT_PIN=off``."""
    env = dict(os.environ)
    for key, value in _before.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    env[OFF_ENV] = "off"
    return env


def _mkl_version(config: str) -> str:
    m = re.search(r"Math Kernel Library Version ([0-9.]+)", config)
    return f"mkl {m.group(1)}" if m else "none"


def _device(torch: Any) -> str:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return f"cuda {torch.cuda.get_device_name()}"
    return "cpu"


BF16_ONEDNN_ISA = "ALL"  # oneDNN's own choice: its bf16 GEMMs where the CPU has them


def lift_for_bf16() -> None:
    """bf16 autocast on the CPU: the pin's oneDNN cap (AVX2, SSE4.1) leaves oneDNN no bf16
    GEMM, and ATen's fallback is a scalar loop (about 250x slower at width 768 and vocabulary
    32,768). Lift the cap before oneDNN's first use (it reads the variable lazily); bf16 CPU
    results are then as machine-specific as a GPU's, and :func:`record` says so."""
    if _state.get("pin") in BRANCHES and "onednn" not in _state:
        os.environ["ONEDNN_MAX_CPU_ISA"] = BF16_ONEDNN_ISA
        _state["onednn"] = BF16_ONEDNN_ISA


def record() -> dict[str, Any]:
    """What this process's float results depend on. Without torch loaded (a token step) only
    the interpreter and machine; with it, also the CPU capability ATen dispatches to, the BLAS
    and its branch, the thread count, the device and the pin."""
    rec: dict[str, Any] = {
        "machine": _platform.machine(),
        "python": ".".join(str(v) for v in sys.version_info[:3]),
    }
    torch = sys.modules.get("torch")
    if torch is None:
        return rec
    rec.update(cpu_identity())
    rec.update(
        torch=torch.__version__,
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
        blas=_mkl_version(torch.__config__.show()),
        mkl_cbwr=os.environ.get("MKL_CBWR", "unset"),
        threads=torch.get_num_threads(),
        device=_device(torch),
        pin=_state.get("pin", "not applied"),
    )
    if "onednn" in _state:  # lifted for bf16 (only then: fp32 records stay as they were)
        rec["onednn_max_cpu_isa"] = _state["onednn"]
    return rec


# a float hash is compared only where these agree (an Intel and an AMD CPU under the same pin
# part: docs/reproducibility.md)
FLOAT_KEYS = ("torch", "cpu_vendor", "cpu_capability", "blas", "mkl_cbwr", "threads", "device")


def differences(made: dict[str, Any], reference: dict[str, Any]) -> list[str]:
    """The float-path keys on which ``made`` differs from ``reference``, as ``key X (reference
    Y)`` phrases; empty when a float hash is comparable."""
    keys = ("machine", *FLOAT_KEYS)
    return [
        f"{k} {made.get(k, 'unrecorded')} (reference {reference.get(k, 'unrecorded')})"
        for k in keys
        if made.get(k) != reference.get(k)
    ]


def pinned_summary() -> dict[str, Any]:
    """What :func:`pin` set in this process, for a reference file."""
    return {
        "pin": _state.get("pin", "not applied"),
        "environment": {k: os.environ.get(k, "unset") for k in PIN_KEYS},
        "by": "src/plantbench/floats.py, on import of the package, before torch runs a kernel",
    }


def set_threads(threads: int | None) -> None:
    """Run torch's CPU kernels on ``threads`` threads (at least one): a float's bytes depend on
    the count (each artifact's ``platform`` record names it)."""
    import torch

    torch.set_num_threads(max(1, int(threads or 1)))
