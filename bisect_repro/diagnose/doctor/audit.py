"""Findings about the settings a process runs with, read from its environment fingerprint.

:func:`environment_findings` turns an :func:`bisect_repro.capture.env.fingerprint` into ``doctor``
findings. For a recipe (``audit=False``) it names what is fine on this machine but will bite
elsewhere: cuDNN autotuning (``cudnn-benchmark``), TF32 and lowered matmul precision (``tf32``),
a thread count left to the machine's core count (``threads-unpinned``). Without a TARGET
(``audit=True``) it also explains this process: determinism switches, cuBLAS workspace,
``PYTHONHASHSEED``, the environment variables that change numerics, versions and devices.

Nothing here runs anything, so nothing here is an ``error``: a setting is only a risk until a run
shows its effect. ``doctor`` proves or weakens ``threads-unpinned`` by running step 0 on another
thread count; the other findings stay as read. Where guarantees stop: only the settings the
fingerprint holds are judged, and for a recipe, TF32 in convolutions is reported only when its
model has a convolution.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import advice
from .findings import Finding, Severity

__all__ = ["environment_findings"]


def environment_findings(
    fingerprint: Mapping[str, Any], *, threads_pinned: bool, audit: bool, convolutions: bool = True
) -> list[Finding]:
    """Findings about settings: those that bite elsewhere, and (``audit``) what the process is."""
    found = []
    cuda = bool(fingerprint.get("devices"))
    here = "" if cuda else "; there is no GPU here, so it changes nothing on this machine"
    if fingerprint.get("torch.backends.cudnn.benchmark"):
        evidence = (
            "torch.backends.cudnn.benchmark is True: cuDNN times several convolution kernels for "
            "each new shape and keeps "
            f"the fastest, which can differ from run to run{here}"
        )
        found.append(
            Finding(
                "cudnn-benchmark",
                Severity.WARNING,
                evidence,
                advice.environment_fix(["torch.backends.cudnn.benchmark"]),
            )
        )
    matmul, precision = (
        fingerprint.get("torch.backends.cuda.matmul.allow_tf32"),
        fingerprint.get("torch.get_float32_matmul_precision"),
    )
    lowered = [k for k, v in (("torch.backends.cuda.matmul.allow_tf32", matmul),) if v] + (
        ["torch.get_float32_matmul_precision"] if precision not in (None, "highest") else []
    )
    conv = bool(fingerprint.get("torch.backends.cudnn.allow_tf32")) and convolutions
    if lowered or conv:
        parts = []
        if lowered:
            parts.append(
                f"float32 matmuls may run in reduced precision (allow_tf32={matmul}, float32 "
                f"matmul precision {precision!r}): "
                "on Ampere and later GPUs they keep 10 mantissa bits"
            )
        if conv:
            parts.append(
                "torch.backends.cudnn.allow_tf32 is True (PyTorch's default): convolutions on "
                "Ampere and later GPUs use TF32"
            )
        evidence = (
            "; ".join(parts) + f", so results differ across GPU generations and from CPUs{here}"
        )
        keys = [*lowered, *(["torch.backends.cudnn.allow_tf32"] if conv else [])]
        found.append(
            Finding(
                "tf32",
                Severity.WARNING if lowered else Severity.INFO,
                evidence,
                advice.environment_fix(keys),
            )
        )
    if not threads_pinned:
        threads = fingerprint.get("torch.get_num_threads")
        evidence = (
            f"torch runs on {threads} threads, chosen from this machine's "
            f"{fingerprint.get('cpu_count')} cores (OMP_NUM_THREADS unset and "
            "no torch.set_num_threads): on a machine with another core count, reductions split "
            "differently and round differently"
        )
        found.append(
            Finding(
                "threads-unpinned",
                Severity.WARNING,
                evidence,
                advice.environment_fix(["torch.get_num_threads"]),
            )
        )
    if audit:
        found += _process_audit(fingerprint, cuda)
    return found


def _process_audit(fingerprint: Mapping[str, Any], cuda: bool) -> list[Finding]:
    found = []
    if not fingerprint.get("torch.are_deterministic_algorithms_enabled"):
        evidence = (
            "torch.use_deterministic_algorithms is off: ops without a deterministic kernel run as "
            "they are (index_put_ with "
            "accumulate=True on several CPU threads, scatter_add_/index_add_ on CUDA, ...); "
            "`bisect-repro doctor TARGET` "
            "shows whether a recipe runs any"
        )
        found.append(
            Finding("deterministic-algorithms", Severity.INFO, evidence, advice.op_fix(None))
        )
    if cuda and not fingerprint.get("torch.backends.cudnn.deterministic"):
        evidence = (
            "torch.backends.cudnn.deterministic is False: cuDNN may pick nondeterministic "
            "convolution algorithms"
        )
        found.append(
            Finding(
                "cudnn-deterministic",
                Severity.INFO,
                evidence,
                advice.environment_fix(["torch.backends.cudnn.deterministic"]),
            )
        )
    if cuda and fingerprint.get("env.CUBLAS_WORKSPACE_CONFIG") is None:
        evidence = (
            "CUBLAS_WORKSPACE_CONFIG is unset: with deterministic algorithms on, cuBLAS "
            "matmuls raise (or are nondeterministic)"
        )
        found.append(
            Finding(
                "cublas-workspace",
                Severity.INFO,
                evidence,
                advice.environment_fix(["env.CUBLAS_WORKSPACE_CONFIG"]),
            )
        )
    if fingerprint.get("env.PYTHONHASHSEED") in (None, "random"):
        evidence = (
            "PYTHONHASHSEED is unset: str hashes are salted anew in every process, so anything "
            "ordered by a set of strings or "
            "by hash() changes between runs; `bisect-repro doctor TARGET` tests whether a recipe "
            "depends on it"
        )
        found.append(
            Finding(
                "pythonhashseed",
                Severity.INFO,
                evidence,
                advice.environment_fix(["env.PYTHONHASHSEED"]),
            )
        )
    numeric = {
        k: v
        for k, v in fingerprint.items()
        if k.startswith("env.") and v is not None and k != "env.PYTHONHASHSEED"
    }
    if numeric:
        evidence = "set in this environment, and read by the libraries that compute: " + ", ".join(
            f"{k.removeprefix('env.')}={v}" for k, v in numeric.items()
        )
        found.append(
            Finding(
                "environment-variables",
                Severity.INFO,
                evidence,
                "set them the same way wherever runs must match",
            )
        )
    versions = ", ".join(
        f"{k} {fingerprint.get(k)}" for k in ("python", "torch", "numpy", "cuda", "cudnn")
    )
    devices = ", ".join(fingerprint.get("devices") or []) or "none"
    evidence = (
        f"{versions}; GPUs: {devices}; CPU: {fingerprint.get('cpu')}: results may differ "
        "when any of these changes"
    )
    fix = (
        "compare runs made with the same versions and hardware (bisect-repro record stores all "
        "of these in each run)"
    )
    found.append(Finding("versions", Severity.INFO, evidence, fix))
    return found
