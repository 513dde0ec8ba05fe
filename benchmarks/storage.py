"""Storage: bytes per snapshot and per checkpoint, against ``torch.save`` of the same state.

``torch.save`` into memory is the baseline only: bisect-repro itself never pickles.
"""

from __future__ import annotations

import io
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch

from bisect_repro import Recorder, RecordOptions

from .timing import Plan
from .trainees import mlp_trainee

__all__ = ["bench_storage"]


def bench_storage(device: torch.device, plan: Plan) -> dict[str, Any]:
    trainee = mlp_trainee(plan, device)
    with tempfile.TemporaryDirectory(prefix="bisect-repro-bench-") as tmp:
        out = Path(tmp) / "run"
        with Recorder(
            out, trainee, RecordOptions(steps=21, every=10, checkpoint_every=20)
        ) as recorder:
            for batch in recorder.batches():
                assert trainee.step is not None
                recorder.log(trainee.step(batch))
        entries = [
            json.loads(line)
            for line in (out / "rank0" / "index.jsonl").read_text().splitlines()
            if line.strip()
        ]
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
    rows.append(
        {
            "file": "steps.jsonl per step",
            "bytes": steps_bytes / 21,
            "uncompressed bytes": steps_bytes / 21,
        }
    )
    params = sum(p.numel() for p in trainee.model.parameters())
    return {"model": "mlp", "parameters": params, "rows": rows}
