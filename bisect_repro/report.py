"""What the CLI prints: JSON objects and their human (rich) renderings."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from .store import Run

__all__ = ["render_summary", "run_summary"]


def run_summary(run: Run) -> dict[str, Any]:
    """What a run holds, as one JSON-able object (``bisect-repro show --json``)."""
    losses = [loss for loss in run.losses().values() if loss is not None]
    meta = run.meta
    first_snapshot = run.snapshot(min(run.snapshots)) if run.snapshots else None
    return {
        "schema": "bisect-repro/show/1",
        "path": str(run.path),
        "format": meta.get("format"),
        "target": meta.get("target"),
        "config": meta.get("config", {}),
        "options": meta.get("options", {}),
        "complete": run.complete,
        "steps_logged": len(run.steps),
        "last_step": run.last_step,
        "snapshots": sorted(run.snapshots),
        "checkpoints": sorted(run.checkpoints),
        "streams": sorted(first_snapshot["streams"]) if first_snapshot else meta.get("streams", []),
        "tensors_hashed": len(first_snapshot["hashes"]) if first_snapshot else 0,
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "bytes": {
            "snapshots": sum(e.bytes for e in run.snapshots.values()),
            "checkpoints": sum(e.bytes for e in run.checkpoints.values()),
        },
        "model": {kind: len(names) for kind, names in meta.get("model", {}).items()},
        "loader": meta.get("loader", {}),
        "environment": meta.get("environment", {}),
    }


def _short(values: list[int], limit: int = 12) -> str:
    if len(values) <= limit:
        return ", ".join(map(str, values))
    return ", ".join(map(str, values[: limit // 2])) + ", ..., " + ", ".join(map(str, values[-limit // 2 :]))


def render_summary(summary: dict[str, Any], console: Console) -> None:
    status = "[green]complete[/]" if summary["complete"] else f"[yellow]incomplete[/] (last complete step {summary['last_step']})"
    console.print(f"[bold]{summary['path']}[/]  {status}")
    table = Table(show_header=False, box=None, padding=(0, 2))
    table.add_row("target", str(summary["target"]))
    table.add_row("config", ", ".join(f"{k}={v!r}" for k, v in summary["config"].items()) or "-")
    options = summary["options"]
    table.add_row(
        "options", f"steps={options.get('steps')} every={options.get('every')} checkpoint_every={options.get('checkpoint_every')}"
    )
    table.add_row("steps logged", str(summary["steps_logged"]))
    table.add_row("snapshots", f"{len(summary['snapshots'])}: {_short(summary['snapshots'])}  ({summary['bytes']['snapshots']:,} bytes)")
    table.add_row(
        "checkpoints", f"{len(summary['checkpoints'])}: {_short(summary['checkpoints'])}  ({summary['bytes']['checkpoints']:,} bytes)"
    )
    table.add_row("tensors hashed", str(summary["tensors_hashed"]))
    table.add_row("random streams", ", ".join(summary["streams"]))
    table.add_row("loss", f"first {summary['first_loss']}, last {summary['last_loss']}")
    loader = summary["loader"]
    table.add_row("loader", ", ".join(f"{k}={v}" for k, v in loader.items()))
    environment = summary["environment"]
    keys = ("python", "torch", "numpy", "cuda", "cpu", "devices", "torch.get_num_threads", "torch.are_deterministic_algorithms_enabled")
    table.add_row("environment", ", ".join(f"{k}={environment.get(k)}" for k in keys))
    console.print(table)
