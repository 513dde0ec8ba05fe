"""bisect-repro's benchmarks: hash throughput, recording overhead, storage, compare cost.

    python -m benchmarks.run --out benchmarks/results           # CPU: under 10 minutes on 2 cores
    python -m benchmarks.run --out /tmp/bench --device cuda     # the same on a GPU
    python -m benchmarks.run --out /tmp/bench --quick           # tiny sizes, seconds (the smoke test)
    python -m benchmarks.run --out benchmarks/results --only hash small  # re-run some, keep the others

Writes ``results.json`` and ``results.md`` into ``--out``: the machine, device, versions and
date, then one table per benchmark, each with its own date, commit and load. ``--only`` re-runs
the named benchmarks and keeps the others from the results already in ``--out`` (same device and
plan), so that a machine shared with other work can be measured in its quiet moments. Every
figure is the median of repeated runs, and every ratio compares figures measured in the same
run, interleaved, so that a machine shared with other work slows both sides alike.

- Hash throughput (GB/s) by tensor size, next to the read-bandwidth ceiling ``x.sum()`` (hashing
  reads each byte once, so it cannot beat a plain read), the torch-op path that hashes where the
  C kernel was not built (CPU only), ``torch.hash_tensor`` (an XOR reduction) where this torch has
  it, and on the CPU xxhash's xxh3 (``pip install ".[bench]"``; the column is left out without it).
- Many small tensors: 2,000 tensors of 16 KB hashed in one call, against ``torch.hash_tensor``
  called on each, and against one tensor of the same total size.
- Recording overhead: step time under the recorder over step time without it, every=1 and
  every=10 with a checkpoint every 100 steps; a ~10M-parameter MLP and the CNN example
  (``examples/cnn.py``, 5k parameters, two loader workers) on the CPU, a GPT-style
  ~100M-parameter transformer on CUDA.
- Storage: bytes per snapshot and per checkpoint against ``torch.save`` of the same state into
  memory (the baseline only: bisect-repro itself never pickles).
- Compare cost: two recorded 2,000-step runs that part ways at step 1,537, compared; the wall time
  against the time to train the steps the replay re-ran, for both runs.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import bisect_repro
from bisect_repro import Recorder, RecordOptions, Trainee
from bisect_repro.capture import hashing
from bisect_repro.capture.hashing import hash_tensors

MB = 1 << 20


@dataclass(frozen=True)
class Plan:
    """How big and how long: the full run, or the seconds-long smoke run."""

    sizes_mb: tuple[float, ...]
    small: tuple[int, int]  # many small tensors: how many, and bytes each
    repeats: int
    min_seconds: float  # each timed sample repeats the call until it has run this long
    mlp_widths: tuple[int, ...]
    gpt: dict[str, int]
    batch: int
    window: int  # steps timed per recording run
    runs: int  # recording runs per configuration


FULL = Plan(
    sizes_mb=(1, 4, 16, 64, 256, 1024),
    small=(2000, 16 << 10),
    repeats=7,
    min_seconds=0.05,
    mlp_widths=(1024, 2048, 2048, 1024, 1024),  # 9.4M parameters
    gpt={"vocab": 32000, "width": 768, "layers": 12, "heads": 12, "context": 512, "batch": 8},  # 110M parameters
    batch=64,
    window=100,  # one checkpoint and ten snapshots at every=10
    runs=5,
)
QUICK = Plan(
    sizes_mb=(0.25, 1),
    small=(50, 16 << 10),
    repeats=3,
    min_seconds=0.005,
    mlp_widths=(64, 64, 32),
    gpt={"vocab": 256, "width": 64, "layers": 2, "heads": 2, "context": 32, "batch": 2},
    batch=8,
    window=20,
    runs=1,
)


# -- timing ------------------------------------------------------------------------------------
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _sample(fn: Callable[[], object], device: torch.device, min_seconds: float) -> float:
    """Seconds per call: the call repeated until ``min_seconds`` have passed, then averaged."""
    calls = 0
    _sync(device)
    start = time.perf_counter()
    while True:
        fn()
        calls += 1
        _sync(device)
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return elapsed / calls


def interleaved_medians(fns: dict[str, Callable[[], object]], device: torch.device, plan: Plan) -> dict[str, float]:
    """Median seconds per call of each function, sampled in turn so that they share the machine's moods."""
    for fn in fns.values():  # warm up: caches, lazily built tables, compiled kernels
        fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(plan.repeats):
        for name, fn in fns.items():
            samples[name].append(_sample(fn, device, plan.min_seconds))
    return {name: statistics.median(values) for name, values in samples.items()}


# -- hash throughput ---------------------------------------------------------------------------
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


def bench_hash(device: torch.device, plan: Plan) -> dict[str, Any]:
    try:
        import xxhash  # the optional "bench" extra
    except ImportError:
        xxhash = None
    rows = []
    free = _free_bytes(device)
    fallback = device.type == "cpu" and hashing._native_kernel() is not None  # compare with the path used without a compiler
    for size_mb in plan.sizes_mb:
        nbytes = int(size_mb * MB)
        if nbytes * 3 > free:  # the tensor, plus room for the others' temporaries
            rows.append({"size_mb": size_mb, "skipped": "not enough free memory"})
            continue
        x = torch.randn(nbytes // 4, device=device)
        fns: dict[str, Callable[[], object]] = {
            "read ceiling x.sum()": lambda x=x: x.sum(),
            "bisect-repro hash": lambda x=x: hash_tensors({"x": x}),
        }
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
    fns: dict[str, Callable[[], object]] = {"bisect-repro hash_tensors, one call": lambda: hash_tensors(named)}
    if device.type == "cpu" and hashing._native_kernel() is not None:
        fns["torch-op fallback, one call"] = lambda: _torch_ops_hash(named)
    if hasattr(torch, "hash_tensor"):
        fns["torch.hash_tensor, a call per tensor"] = lambda: [torch.hash_tensor(t) for t in tensors]
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


def _meminfo(field: str, default: int) -> int:
    """A ``/proc/meminfo`` field in bytes (``default`` where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return default


def _free_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return _meminfo("MemAvailable", 8 << 30)


# -- recording overhead ------------------------------------------------------------------------
def mlp_trainee(plan: Plan, device: torch.device, seed: int = 0) -> Trainee:
    torch.manual_seed(seed)
    widths = plan.mlp_widths
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(widths):
        layers += [nn.Linear(a, b), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(widths[-1], 10)).to(device)
    data = torch.Generator().manual_seed(1234)
    inputs = torch.randn(plan.batch * 32, widths[0], generator=data)
    targets = torch.randint(0, 10, (inputs.shape[0],), generator=data)
    loader = DataLoader(TensorDataset(inputs, targets), batch_size=plan.batch, shuffle=True, generator=torch.Generator().manual_seed(seed))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = (t.to(device, non_blocking=True) for t in batch)
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    return Trainee(model, optimizer, loader, step)


class TinyGPT(nn.Module):
    """GPT-style decoder: token and position embeddings, pre-norm causal blocks, tied output."""

    def __init__(self, vocab: int, width: int, layers: int, heads: int, context: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)
        block = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, activation="gelu", batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        length = ids.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(length, device=ids.device)
        h = self.tokens(ids) + self.positions(torch.arange(length, device=ids.device))
        h = self.blocks(h, mask=mask, is_causal=True)
        return self.norm(h) @ self.tokens.weight.t()


def gpt_trainee(plan: Plan, device: torch.device, seed: int = 0) -> Trainee:
    torch.manual_seed(seed)
    g = plan.gpt
    model = TinyGPT(g["vocab"], g["width"], g["layers"], g["heads"], g["context"]).to(device)
    data = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, g["vocab"], (g["batch"] * 16, g["context"] + 1), generator=data)
    loader = DataLoader(TensorDataset(ids), batch_size=g["batch"], shuffle=True, generator=torch.Generator().manual_seed(seed))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(batch: tuple[torch.Tensor]) -> torch.Tensor:
        tokens = batch[0].to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        return loss

    return Trainee(model, optimizer, loader, step)


def _timed_window(trainee: Trainee, device: torch.device, plan: Plan, options: RecordOptions | None, out: Path) -> float:
    """Mean seconds per step over steps 1 .. window (after step 0's checkpoint and warm-up).

    The window holds ``window / every`` snapshots and ``window / 100`` checkpoints, the same
    share as a long run; step 0 (the first checkpoint) and the final close are outside it.
    """
    assert trainee.step is not None
    marks: list[float] = []
    total = plan.window + 2
    if options is None:
        batches = _cycle(trainee.loader, total)
        for batch in batches:
            _sync(device)
            marks.append(time.perf_counter())
            trainee.step(batch)
    else:
        with Recorder(out, trainee, options) as recorder:
            for batch in recorder.batches():
                _sync(device)
                marks.append(time.perf_counter())
                recorder.log(trainee.step(batch))
    return (marks[1 + plan.window] - marks[1]) / plan.window


def _cycle(loader: Any, count: int) -> Any:
    done = 0
    while True:
        for batch in loader:
            if done == count:
                return
            yield batch
            done += 1


def cnn_trainee(plan: Plan, device: torch.device, seed: int = 0) -> Trainee:
    """The CNN example as it is (``examples/cnn.py``), on the CPU."""
    from bisect_repro.record.recipe import build

    return build(f"{Path(__file__).resolve().parent.parent / 'examples' / 'cnn.py'}:build", {"seed": seed})


def bench_overhead(device: torch.device, plan: Plan, model: str) -> dict[str, Any]:
    make = {"mlp": mlp_trainee, "gpt": gpt_trainee, "cnn": cnn_trainee}[model]
    configs: dict[str, RecordOptions | None] = {
        "no recorder": None,
        "every=10": RecordOptions(steps=plan.window + 2, every=10, checkpoint_every=100),
        "every=1": RecordOptions(steps=plan.window + 2, every=1, checkpoint_every=100),
    }
    samples: dict[str, list[float]] = {name: [] for name in configs}
    with tempfile.TemporaryDirectory(prefix="bisect-repro-bench-") as tmp:
        for run in range(plan.runs):
            for name, options in configs.items():  # interleaved: the machine's moods hit all alike
                trainee = make(plan, device)
                samples[name].append(_timed_window(trainee, device, plan, options, Path(tmp) / f"{name}-{run}"))
    base = statistics.median(samples["no recorder"])
    params = sum(p.numel() for p in make(plan, torch.device("cpu") if device.type != "cuda" else device).model.parameters())
    rows = [
        {
            "configuration": name,
            "step ms": statistics.median(values) * 1e3,
            "overhead": statistics.median(values) / base,
            "runs": len(values),
        }
        for name, values in samples.items()
    ]
    return {"model": model, "parameters": params, "steps timed per run": plan.window, "checkpoint_every": 100, "rows": rows}


# -- storage -----------------------------------------------------------------------------------
def bench_storage(device: torch.device, plan: Plan) -> dict[str, Any]:
    trainee = mlp_trainee(plan, device)
    with tempfile.TemporaryDirectory(prefix="bisect-repro-bench-") as tmp:
        out = Path(tmp) / "run"
        with Recorder(out, trainee, RecordOptions(steps=21, every=10, checkpoint_every=20)) as recorder:
            for batch in recorder.batches():
                assert trainee.step is not None
                recorder.log(trainee.step(batch))
        entries = [json.loads(line) for line in (out / "rank0" / "index.jsonl").read_text().splitlines() if line.strip()]
        steps_bytes = (out / "rank0" / "steps.jsonl").stat().st_size
    buffer = io.BytesIO()
    state = {"model": trainee.model.state_dict(), "optimizer": trainee.optimizer.state_dict()}
    torch.save(state, buffer)  # the comparison baseline only
    saved = buffer.getbuffer().nbytes
    rows = []
    for kind in ("snapshot", "checkpoint"):
        sizes = [e["bytes"] for e in entries if e.get("kind") == kind and e["step"] > 0]
        raw = [e["raw_bytes"] for e in entries if e.get("kind") == kind and e["step"] > 0]
        rows.append(
            {
                "file": kind,
                "bytes": statistics.median(sizes),
                "uncompressed bytes": statistics.median(raw),
                "torch.save bytes": saved,
                "bytes / torch.save": statistics.median(sizes) / saved,
            }
        )
    rows.append({"file": "steps.jsonl per step", "bytes": steps_bytes / 21, "uncompressed bytes": steps_bytes / 21})
    params = sum(p.numel() for p in trainee.model.parameters())
    return {"model": "mlp", "parameters": params, "rows": rows}


# -- compare cost ------------------------------------------------------------------------------
def bench_compare(device: torch.device, plan: Plan) -> dict[str, Any]:
    """``compare`` on two recorded runs that part ways near step 1,500 of 2,000 (quick: 37 of 60).

    Its wall time is set against the time to train the steps it replays, for both runs, measured
    in this process with the same recipe and no recorder.
    """
    from bisect_repro import compare, record
    from bisect_repro.record.recipe import build

    full = plan is FULL
    steps, diverge_at, every, checkpoint_every = (2000, 1537, 10, 100) if full else (60, 37, 10, 20)
    target = f"{Path(__file__).with_name('compare_recipe.py')}:build"
    config = {"diverge_at": diverge_at, "width": 512 if full else 64}
    options = RecordOptions(steps=steps, every=every, checkpoint_every=checkpoint_every, force=True)
    with tempfile.TemporaryDirectory(prefix="bisect-repro-bench-") as tmp:
        runs = [record(build(target, config), Path(tmp) / name, options, target=target, config=config) for name in "ab"]
        walls, results = [], []
        for _ in range(3 if full else 1):
            started = time.perf_counter()
            results.append(compare(runs[0], runs[1]))
            walls.append(time.perf_counter() - started)
    result = results[-1]
    replayed = result.replay.replayed_steps
    trainee = build(target, config)
    assert trainee.step is not None
    batches = list(_cycle(trainee.loader, replayed + 5))
    for batch in batches[:5]:  # warm-up
        trainee.step(batch)
    train_times = []
    for _ in range(3):
        started = time.perf_counter()
        for batch in batches[5:]:
            trainee.step(batch)
        train_times.append(time.perf_counter() - started)
    train = statistics.median(train_times)
    wall = statistics.median(walls)
    return {
        "steps": steps,
        "diverges_at": diverge_at,
        "found": [result.verdict.step, result.verdict.phase, result.verdict.layer, result.verdict.cause.value] if result.verdict else None,
        "replayed steps": replayed,
        "compare s": wall,
        "train replayed steps s (one run)": train,
        "ratio to both runs' steps": wall / (2 * train),
        "ratio to one run's steps": wall / train,
        "note": f"compare of two {steps}-step runs diverging at step {diverge_at}, every={every}, checkpoint every {checkpoint_every}",
    }


# -- report ------------------------------------------------------------------------------------
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
        "load average at start": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "cpu pressure at start": _cpu_pressure(),
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


def _cpu_pressure() -> str | None:
    """Linux's share of time that runnable tasks waited for a CPU (other work on a shared machine)."""
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


def _total_memory() -> int:
    return _meminfo("MemTotal", 0)


def _git_commit() -> str | None:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def _format(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _table(rows: list[dict[str, Any]]) -> list[str]:
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_format(row.get(c, "")) for c in columns) + " |" for row in rows]
    return lines


def _loads(values: Any) -> str:
    return "n/a" if values is None else ", ".join(f"{v:.2f}" for v in values)


def _measured(section: dict[str, Any]) -> list[str]:
    """One line on when a section was measured and the load around it."""
    m = section.get("measured")
    if m is None:
        return []
    return [
        "",
        f"Measured {m['date']} at {m['commit']} in {m['seconds']:.0f} s; load average {_loads(m['load average at start'])}"
        f" at start, {_loads(m['load average at end'])} at end; CPU pressure at start `{m['cpu pressure at start']}`.",
    ]


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        "# bisect-repro benchmarks",
        "",
        f"Last run {m['date']} on {m['cpu']} ({m['cpu cores']} cores, {m['memory GiB']} GiB), device `{m['device']}`"
        + (f" ({m['gpu']}, CUDA {m['cuda']})" if "gpu" in m else "")
        + f"; Python {m['python']}, torch {m['torch']}, NumPy {m['numpy']}, bisect-repro {m['bisect-repro']}"
        + (f" at {m['commit']}" if m["commit"] else "")
        + f", triton {m['triton']}, xxhash {m['xxhash']}; {m['torch threads']} torch threads;"
        + f" load average at start {_loads(m['load average at start'])}, at end {_loads(m.get('load average at end'))};"
        + f" CPU pressure (`/proc/pressure/cpu`) at start `{m['cpu pressure at start']}`, at end `{m.get('cpu pressure at end')}`."
        + " A load above the core count means other work shared the machine and slowed both sides of each ratio.",
        "",
        "Every figure is the median of repeated runs; each ratio compares figures from the same run.",
        "Each section says when it was measured and the load around it (sections may come from separate runs).",
    ]
    hashed = results.get("hash")
    if hashed is not None:
        lines += [
            "",
            "## Hash throughput (GB/s)",
            "",
            "`read ceiling x.sum()` reads each byte once, which a hash must also do: the physical limit."
            + (f" The hash ran on: {hashed['path']}." if "path" in hashed else ""),
            *_measured(hashed),
            "",
            *_table(hashed["rows"]),
        ]
    small = results.get("small")
    if small is not None:
        lines += [
            "",
            "## Many small tensors",
            "",
            f"{small['tensors']:,} tensors of {small['bytes each'] // 1024} KiB ({small['tensors'] * small['bytes each'] / 1e6:.1f} MB);"
            f" the hash ran on: {small['path']}.",
            *_measured(small),
            "",
            *_table(small["rows"]),
        ]
    sections = (
        ("overhead_mlp", "Recording overhead, MLP"),
        ("overhead_cnn", "Recording overhead, CNN example"),
        ("overhead_gpt", "Recording overhead, GPT-style transformer"),
    )
    for key, title in sections:
        section = results.get(key)
        if section is None:
            continue
        lines += ["", f"## {title}", ""]
        if "skipped" in section:
            lines.append(f"Skipped: {section['skipped']}.")
            continue
        lines += [
            f"{section['parameters']:,} parameters; a checkpoint every {section['checkpoint_every']} steps;"
            f" mean step time over {section['steps timed per run']} steps, median of {section['rows'][0]['runs']} runs.",
            *_measured(section),
            "",
            *_table(section["rows"]),
        ]
    storage = results.get("storage")
    if storage is not None:
        lines += ["", "## Storage", "", f"MLP, {storage['parameters']:,} parameters, Adam.", *_measured(storage)]
        lines += ["", *_table(storage["rows"])]
    compare = results.get("compare")
    if compare is not None:
        shown = {k: v for k, v in compare.items() if k not in ("note", "measured")}
        lines += ["", "## Compare cost", "", f"{compare['note']}.", *_measured(compare), "", *_table([shown])]
    lines.append("")
    return "\n".join(lines)


STAGES = ("hash", "small", "mlp", "cnn", "gpt", "storage", "compare")
SECTIONS = ("hash", "small", "overhead_mlp", "overhead_cnn", "overhead_gpt", "storage", "compare")


def _kept_sections(path: Path, device: torch.device, quick: bool) -> dict[str, Any]:
    """The sections of earlier results that a partial run keeps: same device and plan only."""
    try:
        earlier = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if earlier.get("quick") != quick or earlier.get("machine", {}).get("device") != str(device):
        return {}
    return {name: earlier[name] for name in SECTIONS if name in earlier}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="folder for results.json and results.md")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda (default: cuda when present)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, a few seconds: checks that the benchmarks run")
    parser.add_argument("--only", nargs="+", choices=STAGES, metavar="NAME", help=f"run only these benchmarks: {', '.join(STAGES)}")
    args = parser.parse_args(argv)
    chosen = set(args.only or STAGES)
    device = torch.device(args.device)
    plan = QUICK if args.quick else FULL
    started = time.perf_counter()
    results: dict[str, Any] = {"machine": machine(device), "quick": args.quick}
    kept = _kept_sections(args.out / "results.json", device, args.quick) if args.only else {}

    def stage(name: str, fn: Callable[[], dict[str, Any]]) -> None:
        if name.removeprefix("overhead_") not in chosen:
            if name in kept:
                results[name] = kept[name]
            return
        t = time.perf_counter()
        load, pressure = os.getloadavg() if hasattr(os, "getloadavg") else None, _cpu_pressure()
        date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        results[name] = fn()
        results[name]["measured"] = {
            "date": date,
            "commit": results["machine"]["commit"],
            "seconds": time.perf_counter() - t,
            "load average at start": load,
            "load average at end": os.getloadavg() if hasattr(os, "getloadavg") else None,
            "cpu pressure at start": pressure,
            "cpu pressure at end": _cpu_pressure(),
        }
        print(f"{name}: {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)

    stage("hash", lambda: bench_hash(device, plan))
    stage("small", lambda: bench_small_hash(device, plan))
    stage("overhead_mlp", lambda: bench_overhead(device, plan, "mlp"))
    if device.type == "cpu":
        stage("overhead_cnn", lambda: bench_overhead(device, plan, "cnn"))
    if device.type == "cuda" or args.quick:  # the quick run exercises the GPT code on the CPU
        stage("overhead_gpt", lambda: bench_overhead(device, plan, "gpt"))
    elif "gpt" in chosen:
        results["overhead_gpt"] = {"skipped": "needs a CUDA GPU (run with --device cuda)"}
    stage("storage", lambda: bench_storage(device, plan))
    stage("compare", lambda: bench_compare(device, plan))
    results["machine"]["load average at end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    results["machine"]["cpu pressure at end"] = _cpu_pressure()
    results["seconds"] = time.perf_counter() - started
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "results.md").write_text(markdown(results) + f"\nWhole run: {results['seconds']:.0f} s.\n")
    print(f"wrote {args.out / 'results.md'} and results.json in {results['seconds']:.0f} s", file=sys.stderr)
    return results


if __name__ == "__main__":
    main()
