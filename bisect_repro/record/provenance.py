"""How a run was launched, so that ``compare`` can launch it again to replay it.

A run records, in ``run.json`` under ``launch``: the interpreter, ``sys.argv``, the working
directory, and the code that was run with its SHA-256: the recipe file of a TARGET, or the main
script (``python train.py``) or module (``python -m pkg.train``) of a loop recorded with the
:class:`~bisect_repro.record.recorder.Recorder`. ``compare`` replays a run only when that code is
on this machine with the same content hash (:mod:`bisect_repro.replay.launch`), so that what runs is
what was recorded, and never runs anything from inside a run directory. A recipe named by module
(``package.module:function``) records the module's file, so that it too is checked by its hash.

Where the guarantees stop: only the main file (or the recipe file) is hashed, not the modules it
imports; a change there is caught only by its effect (the replay parting from the records).
Interactive sessions, ``python -c`` and test runners record no replayable main.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..capture import env
from ..capture.data import describe_loader
from ..capture.state import model_structure
from .options import RecordOptions, SessionPlan
from .recipe import module_file, recipe_file

__all__ = ["NOT_REPLAYABLE", "file_digest", "launch_info", "now", "run_meta"]

NOT_REPLAYABLE = (
    "pytest",
    "_pytest",
    "ipykernel_launcher",
    "IPython",
    "unittest",
    "pdb",
    "bisect_repro",
)


def file_digest(path: Path) -> str | None:
    """The SHA-256 of a file, or ``None`` when it cannot be read."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _main() -> dict[str, Any] | None:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    path = getattr(main, "__file__", None)
    if path is None:
        return None
    path = str(Path(path).resolve())
    if spec is not None and spec.name and spec.name != "__main__":
        module = spec.name.removesuffix(".__main__")
        if module.split(".")[0] in NOT_REPLAYABLE:
            return None
        return {"kind": "module", "module": module, "path": path, "sha256": file_digest(Path(path))}
    if Path(path).name.split(".")[0] in NOT_REPLAYABLE or "pytest" in Path(path).name:
        return None
    return {"kind": "script", "path": path, "sha256": file_digest(Path(path))}


def launch_info(target: str | None) -> dict[str, Any]:
    """What this process is running, as ``run.json`` records it (see the module docstring)."""
    info: dict[str, Any] = {
        "executable": sys.executable,
        "argv": list(sys.argv),
        "cwd": os.getcwd(),
    }
    if target:
        path = recipe_file(target) or module_file(target.rpartition(":")[0])
        info["code"] = {
            "kind": "recipe",
            "target": target,
            "path": str(path) if path else None,
            "sha256": file_digest(path) if path else None,
        }
    else:
        info["code"] = _main()
    return info


def now() -> str:
    """The time, as ``run.json`` records it (UTC, to the second)."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def run_meta(
    plan: SessionPlan, options: RecordOptions, start_step: int, streams: list[str]
) -> dict[str, Any]:
    """``run.json`` of a new run: what ran (target, config, launch), how it was recorded, and where
    (the environment's fingerprint), the model's structure, the loader's settings and the
    streams."""
    resumed_from = plan.resume_from
    return {
        "target": plan.target,
        "config": dict(plan.config or {}),
        "options": {
            **asdict(options),
            "start_step": start_step,
            "resumed_from": [str(resumed_from[0]), resumed_from[1]] if resumed_from else None,
            "replay": "from_start" if plan.framework else "from_checkpoint",
        },
        "created": now(),
        "environment": {**env.fingerprint(), **dict(plan.environment)},
        "model": model_structure(plan.trainee.model),
        "loader": describe_loader(plan.trainee.loader),
        "streams": streams,
        "launch": {**launch_info(plan.target), **({"hooks": "auto"} if plan.auto else {})},
    }
