"""Hash throughput by tensor size, and the cost of many small tensors hashed at once.

Each figure sits beside a ceiling measured in the same run: ``x.sum()``, which reads every byte
once as a hash must, and where available ``torch.hash_tensor`` and xxhash's xxh3. On the CPU with
the C kernel built, the torch-op path that hashes without it is measured too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from bisect_repro.capture import hashing
from bisect_repro.capture.hashing import PendingHashes, hash_tensors

from .machine import free_bytes
from .timing import Plan, interleaved_medians

__all__ = ["bench_hash", "bench_small_hash"]


MB = 1 << 20


@contextlib.contextmanager
def _backend(name: str) -> Iterator[None]:
    """Hash through one path (``torch``: the torch-op fallback) for the duration."""
    kept = hashing._BACKEND
    hashing._BACKEND = name
    try:
        yield
    finally:
        hashing._BACKEND = kept


def _torch_ops_hash(tensors: dict[str, torch.Tensor]) -> dict[str, str]:
    with _backend("torch"):
        return hash_tensors(tensors)


def _hash_path(device: torch.device) -> str:
    if device.type == "cpu":
        kernel = hashing._native_kernel()
        if kernel is None:
            return "torch ops (the C kernel is not built)"
        from bisect_repro.capture._hash_cpu import LEVELS

        return f"C kernel, {LEVELS[kernel.best_level]}, up to {torch.get_num_threads()} threads"
    return "Triton kernel" if hashing._uses_kernel(device) else "torch ops"


def _device_seconds(fn: Callable[[], object], replays: int = 20) -> float | None:
    """Device time per call of ``fn`` on CUDA: its kernels captured once in a CUDA graph, then the
    graph replayed ``replays`` times between two events, so that no host work (Python, the launch
    of each kernel) is counted. ``None`` where ``fn`` cannot be captured."""
    try:
        fn()  # built and cached outside the capture: tables, compiled kernels
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        samples = []
        for _ in range(5):
            start.record()
            for _ in range(replays):
                graph.replay()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3 / replays)
        return sorted(samples)[len(samples) // 2]
    except Exception:  # a capture refused by this build: the column says so
        return None


def _device_columns(x: torch.Tensor, nbytes: int) -> dict[str, Any]:
    """The hash kernel's and ``x.sum()``'s device time alone (GB/s) and their ratio: what the
    kernel reaches against the read ceiling once the host's launch costs are set aside."""
    kernel = _device_seconds(lambda: PendingHashes().add({"x": x}))
    ceiling = _device_seconds(lambda: x.sum())
    if kernel is None or ceiling is None:
        return {"device time": "not captured"}
    return {
        "x.sum() device GB/s": nbytes / ceiling / 1e9,
        "hash kernels device GB/s": nbytes / kernel / 1e9,
        "device hash / ceiling": ceiling / kernel,
    }


def bench_hash(device: torch.device, plan: Plan) -> dict[str, Any]:
    try:
        import xxhash  # the optional "bench" extra
    except ImportError:
        xxhash = None
    rows = []
    free = free_bytes(device)
    # compare with the path used without a compiler
    fallback = device.type == "cpu" and hashing._native_kernel() is not None
    # 4 GB on a GPU
    sizes = (
        (*plan.sizes_mb, 4096)
        if device.type == "cuda" and plan.sizes_mb[-1] == 1024
        else plan.sizes_mb
    )
    for size_mb in sizes:
        nbytes = int(size_mb * MB)
        if nbytes * 3 > free:  # the tensor, plus room for the others' temporaries
            rows.append({"size_mb": size_mb, "skipped": "not enough free memory"})
            continue
        x = torch.randn(nbytes // 4, device=device)
        fns: dict[str, Callable[[], object]] = {
            "read ceiling x.sum()": lambda x=x: x.sum(),
            "bisect-repro hash": lambda x=x: hash_tensors({"x": x}),
        }
        # as the recorder hashes: queued on the device, fetched at the snapshot
        if device.type == "cuda":
            fns["bisect-repro hash, queued"] = lambda x=x: PendingHashes().add({"x": x})
        if fallback:
            fns["torch-op fallback"] = lambda x=x: _torch_ops_hash({"x": x})
        if hasattr(torch, "hash_tensor"):
            fns["torch.hash_tensor"] = lambda x=x: torch.hash_tensor(x)
        if xxhash is not None and device.type == "cpu":
            array = x.numpy()
            fns["xxh3_64"] = lambda array=array: xxhash.xxh3_64_intdigest(array)
        seconds = interleaved_medians(fns, device, plan)
        row: dict[str, Any] = {"size_mb": size_mb}
        row.update({f"{name} GB/s": nbytes / s / 1e9 for name, s in seconds.items()})
        row["hash / ceiling"] = seconds["read ceiling x.sum()"] / seconds["bisect-repro hash"]
        if "bisect-repro hash, queued" in seconds:
            row["queued / ceiling"] = (
                seconds["read ceiling x.sum()"] / seconds["bisect-repro hash, queued"]
            )
        if device.type == "cuda" and hashing._uses_kernel(device):
            row.update(_device_columns(x, nbytes))
        rows.append(row)
        del x, fns
    return {"path": _hash_path(device), "rows": rows}


def bench_small_hash(device: torch.device, plan: Plan) -> dict[str, Any]:
    """Many small tensors (a model's biases, norms and small layers): one call for all of them
    against ``torch.hash_tensor`` on each, and against one tensor of the same total size."""
    count, nbytes = plan.small
    generator = torch.Generator().manual_seed(0)
    tensors = [torch.randn(nbytes // 4, generator=generator).to(device) for _ in range(count)]
    named = {f"layer{i}.weight": t for i, t in enumerate(tensors)}
    whole = torch.cat(tensors)
    fns: dict[str, Callable[[], object]] = {
        "bisect-repro hash_tensors, one call": lambda: hash_tensors(named)
    }
    if device.type == "cuda":
        fns["bisect-repro, queued in one call"] = lambda: PendingHashes().add(named)
    if device.type == "cpu" and hashing._native_kernel() is not None:
        fns["torch-op fallback, one call"] = lambda: _torch_ops_hash(named)
    if hasattr(torch, "hash_tensor"):
        fns["torch.hash_tensor, a call per tensor"] = lambda: [
            torch.hash_tensor(t) for t in tensors
        ]
    fns["x.sum(), a call per tensor"] = lambda: [t.sum() for t in tensors]
    fns["bisect-repro hash, one tensor of the same bytes"] = lambda: hash_tensors({"x": whole})
    seconds = interleaved_medians(fns, device, plan)
    reference = seconds.get("torch.hash_tensor, a call per tensor")
    rows = []
    for name, s in seconds.items():
        row: dict[str, Any] = {"method": name, "ms": s * 1e3, "GB/s": count * nbytes / s / 1e9}
        if reference is not None:
            row["time / torch.hash_tensor's"] = s / reference
        rows.append(row)
    return {"tensors": count, "bytes each": nbytes, "path": _hash_path(device), "rows": rows}
