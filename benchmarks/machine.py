"""The machine the benchmarks ran on, and how busy it was: the results' header and each section's
load.

Where it stops: the load average and ``/proc/pressure/cpu`` only say that other work shared the
machine, not how much of it fell inside a timed sample; both are ``None`` where the platform lacks
them.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import torch

import bisect_repro

__all__ = ["cpu_pressure", "free_bytes", "load_average", "machine"]


def machine(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_name(),
        "cpu cores": os.cpu_count(),
        "torch threads": torch.get_num_threads(),
        "memory GiB": round(_total_memory() / (1 << 30), 1),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "bisect-repro": bisect_repro.__version__,
        "commit": _git_commit(),
        "device": str(device),
        "load average at start": load_average(),
        "cpu pressure at start": cpu_pressure(),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    for name in ("triton", "xxhash"):
        try:
            module = __import__(name)
            info[name] = getattr(module, "__version__", getattr(module, "VERSION", "?"))
        except ImportError:
            info[name] = None
    return info


def load_average() -> tuple[float, float, float] | None:
    """The 1, 5 and 15-minute load averages, where the platform has them."""
    return os.getloadavg() if hasattr(os, "getloadavg") else None


def cpu_pressure() -> str | None:
    """Linux's share of time that runnable tasks waited for a CPU (other work on a shared
    machine)."""
    try:
        return Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except (OSError, IndexError):
        return None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _meminfo(field: str, default: int) -> int:
    """A ``/proc/meminfo`` field in bytes (``default`` where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return default


def _total_memory() -> int:
    return _meminfo("MemTotal", 0)


def free_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return _meminfo("MemAvailable", 8 << 30)


def _git_commit() -> str | None:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None
