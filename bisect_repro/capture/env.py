"""The environment fingerprint: everything outside the recipe that changes numerics or order.

The fingerprint is a flat ``{key: value}`` mapping, so that two runs diff key by key and the diff
reads as it is (``{"torch.get_num_threads": [1, 2]}``). Keys starting with ``env.`` are
environment variables (``None`` when unset).

:func:`apply` sets, in this process, what can be set after start-up: the thread count, the
determinism switches, the TF32 switches and the float32 matmul precision. Environment variables
such as ``OMP_NUM_THREADS`` or ``CUBLAS_WORKSPACE_CONFIG`` take effect only at process or library
start, so they are recorded and compared but never applied.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ..version import __version__

__all__ = ["APPLICABLE", "NUMERIC_ENV_VARS", "SWITCHES", "apply", "diff", "fingerprint"]

NUMERIC_ENV_VARS = (
    "PYTHONHASHSEED",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "CUBLAS_WORKSPACE_CONFIG",
    "CUDA_LAUNCH_BLOCKING",
    "CUDA_VISIBLE_DEVICES",
    "TORCH_DETERMINISTIC",
    "NVIDIA_TF32_OVERRIDE",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "KMP_DETERMINISTIC_REDUCTION",
    "MKL_CBWR",
)
_ENV_PREFIXES = ("NCCL_",)

# The on/off switches among them: a recorded value must be true or false.
SWITCHES = (
    "torch.are_deterministic_algorithms_enabled",
    "torch.is_deterministic_algorithms_warn_only_enabled",
    "torch.backends.cudnn.benchmark",
    "torch.backends.cudnn.deterministic",
    "torch.backends.cuda.matmul.allow_tf32",
    "torch.backends.cudnn.allow_tf32",
)
# Keys that apply() can set in-process, in the order it sets them.
APPLICABLE = ("torch.get_num_threads", *SWITCHES, "torch.get_float32_matmul_precision")

# Keys that differ between machines without changing what a run computes.
INFORMATIONAL = ("platform", "hostname", "bisect_repro")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def fingerprint() -> dict[str, Any]:
    """The current process's environment, as a flat JSON-able mapping."""
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    found: dict[str, Any] = {
        "bisect_repro": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version()
        if cuda and torch.backends.cudnn.is_available()
        else None,
        "platform": platform.platform(),
        "hostname": platform.node(),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        # The GPUs and cuDNN of a process that uses CUDA: asking for either initialises CUDA, which
        # a CPU-only run on a machine with a GPU must not pay for (nor get a CUDA generator among
        # its streams, reseeded by every torch.seed()).
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if cuda
        else [],
        "torch.get_num_threads": torch.get_num_threads(),
        "torch.get_num_interop_threads": torch.get_num_interop_threads(),
        "torch.are_deterministic_algorithms_enabled": torch.are_deterministic_algorithms_enabled(),
        "torch.is_deterministic_algorithms_warn_only_enabled": (
            torch.is_deterministic_algorithms_warn_only_enabled()
        ),
        "torch.backends.cudnn.benchmark": bool(torch.backends.cudnn.benchmark),
        "torch.backends.cudnn.deterministic": bool(torch.backends.cudnn.deterministic),
        "torch.backends.cuda.matmul.allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "torch.backends.cudnn.allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "torch.get_float32_matmul_precision": torch.get_float32_matmul_precision(),
    }
    names = set(NUMERIC_ENV_VARS) | {k for k in os.environ if k.startswith(_ENV_PREFIXES)}
    for name in sorted(names):
        found[f"env.{name}"] = os.environ.get(name)
    return found


def diff(
    a: Mapping[str, Any], b: Mapping[str, Any], *, informational: bool = False
) -> dict[str, list[Any]]:
    """Keys whose values differ, as ``{key: [a, b]}``; machine names are left out by default."""
    keys = [k for k in dict.fromkeys([*a, *b]) if informational or k not in INFORMATIONAL]
    return {k: [a.get(k), b.get(k)] for k in keys if a.get(k) != b.get(k)}


def apply(recorded: Mapping[str, Any]) -> dict[str, Any]:
    """Set in this process what can be set of a recorded fingerprint; returns what was there."""
    before = {k: v for k, v in fingerprint().items() if k in APPLICABLE}
    if (threads := recorded.get("torch.get_num_threads")) is not None:
        torch.set_num_threads(int(threads))
    if (enabled := recorded.get("torch.are_deterministic_algorithms_enabled")) is not None:
        warn_only = bool(recorded.get("torch.is_deterministic_algorithms_warn_only_enabled", False))
        current = (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        )
        # the first call costs an import of a second or so
        if current != (bool(enabled), warn_only):
            torch.use_deterministic_algorithms(bool(enabled), warn_only=warn_only)
    if (value := recorded.get("torch.backends.cudnn.benchmark")) is not None:
        torch.backends.cudnn.benchmark = bool(value)
    if (value := recorded.get("torch.backends.cudnn.deterministic")) is not None:
        torch.backends.cudnn.deterministic = bool(value)
    if (value := recorded.get("torch.backends.cuda.matmul.allow_tf32")) is not None:
        torch.backends.cuda.matmul.allow_tf32 = bool(value)
    if (value := recorded.get("torch.backends.cudnn.allow_tf32")) is not None:
        torch.backends.cudnn.allow_tf32 = bool(value)
    if (value := recorded.get("torch.get_float32_matmul_precision")) is not None:
        torch.set_float32_matmul_precision(str(value))
    return before
