"""Recording a recipe on several ranks: ``bisect-repro record TARGET --nproc-per-node N``.

:func:`record_ranks` launches N processes through PyTorch's own launcher, ``python -m
torch.distributed.run --standalone --nproc-per-node N``, each running :func:`main` of this module:
it initialises the default process group when the recipe has not (``nccl`` with CUDA, on the
device ``LOCAL_RANK`` names; ``gloo`` otherwise), builds the recipe (which may initialise the
group itself: ``if not dist.is_initialized(): dist.init_process_group(...)``), and records it
under the :class:`~bisect_repro.record.recorder.Recorder`, which writes the rank's own folder.

The launcher's own output and the ranks' output go to a log, removed when every rank succeeds;
each rank reports its error (one line) or its warnings to a file of its own, which the caller
turns into the one line the CLI prints: the error of the first rank that failed on its own, rather
than the others' "another rank failed". Progress is read from ``rank0/steps.jsonl`` as it
grows (one update per snapshot).

On several nodes each node runs the same command with ``--torchrun`` options (``--nnodes``,
``--node-rank``, ``--rdzv-backend``, ``--rdzv-endpoint``), passed to the launcher in place of
``--standalone``; the reports folder is each node's own, its files named by global rank.

Where the guarantees stop: progress is read from ``rank0/``, so a node without global rank 0
shows it as the shared file system makes it visible. ``torchrun`` sets ``OMP_NUM_THREADS=1`` in
each rank when it is unset, as it always does; the fingerprint records it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..errors import BisectReproError, RecordingError
from ..store.run import rank_folder
from .directory import AnotherRankFailed
from .recipe import build
from .recorder import RecordingWarning, RecordOptions, record

__all__ = ["init_process_group", "main", "record_ranks", "torchrun_command"]

_REPORTS = "BISECT_REPRO_RANK_REPORTS"
_POLL_S = 0.25


class _Committed:
    """How many step lines ``rank0/steps.jsonl`` holds, read incrementally as it grows."""

    def __init__(self, out: Path) -> None:
        self.path = out / rank_folder(0) / "steps.jsonl"
        self.offset = self.lines = 0

    def count(self) -> int:
        try:
            with open(self.path, "rb") as handle:
                if os.fstat(handle.fileno()).st_size < self.offset:  # rewritten by a resume
                    self.offset = self.lines = 0
                handle.seek(self.offset)
                added = handle.read()
        except OSError:
            return self.lines
        self.offset += len(added)
        self.lines += added.count(b"\n")
        return self.lines


def _by_rank(reports: Path, kind: str) -> list[tuple[int, Path]]:
    """This node's report files of a kind, by global rank (``rank{r}.{kind}``), in rank order."""
    found = [(int(f.stem[4:]), f) for f in reports.glob(f"rank*.{kind}") if f.stem[4:].isdigit()]
    return sorted(found)


def _first_error(reports: Path) -> str | None:
    """The first rank's own error; a rank that stopped because another failed says so in a ``.peer``
    file."""
    for kind in ("error", "peer"):
        for _, file in _by_rank(reports, kind)[:1]:
            return file.read_text(errors="replace").strip()
    return None


def torchrun_command(nproc: int, nodes: tuple[str, ...] = ()) -> list[str]:
    """The launcher of ``nproc`` ranks on this node: this interpreter's ``torch.distributed.run``
    (the module ``torchrun`` runs); alone, it picks its own free rendezvous port; with ``nodes``
    (``--nnodes=2 --rdzv-endpoint=...``), it meets the other nodes where those options say."""
    alone = () if nodes else ("--standalone",)
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *alone,
        *nodes,
        f"--nproc-per-node={nproc}",
    ]


def record_ranks(
    target: str,
    out: Path,
    options: RecordOptions,
    config: Mapping[str, Any],
    nproc: int,
    *,
    resume: bool = False,
    on_progress: Callable[[int], None] | None = None,
    on_warning: Callable[[str], None] | None = None,
    nodes: tuple[str, ...] = (),
) -> None:
    """Record ``target`` on ``nproc`` ranks of this node into ``out`` (with ``nodes``, this node's
    share of a run of several, see :func:`torchrun_command`); raise the first rank's error (one
    line) if one failed."""
    if nproc < 1:
        raise BisectReproError(f"--nproc-per-node {nproc}: must be at least 1")
    spec = {
        "target": target,
        "out": str(out.resolve()),
        "options": asdict(options),
        "config": dict(config),
        "resume": resume,
    }
    reports = Path(tempfile.mkdtemp(prefix="bisect-repro-ranks-"))
    committed = _Committed(out)
    log = reports / "torchrun.log"
    command = [
        *torchrun_command(nproc, nodes),
        "-m",
        "bisect_repro.record.torchrun",
        json.dumps(spec),
    ]
    try:
        with open(log, "wb") as output:
            process = subprocess.Popen(
                command,
                stdout=output,
                stderr=subprocess.STDOUT,
                env={**os.environ, _REPORTS: str(reports)},
            )
            try:
                while process.poll() is None:
                    if on_progress is not None:
                        on_progress(committed.count())
                    time.sleep(_POLL_S)
            except BaseException:
                process.terminate()
                process.wait()
                raise
        for rank, file in _by_rank(reports, "warnings"):
            if on_warning is not None:
                for line in file.read_text(errors="replace").splitlines():
                    on_warning(f"rank {rank}: {line}")
        if process.returncode != 0:
            error = _first_error(reports)
            if error is not None:
                raise BisectReproError(error)
            # a new file: never through a link
            handle, name = tempfile.mkstemp(prefix="bisect-repro-torchrun-", suffix=".log")
            with os.fdopen(handle, "wb") as copy, open(log, "rb") as source:
                shutil.copyfileobj(source, copy)
            kept = Path(name)
            raise RecordingError(
                f"{out}: a rank failed (torchrun exited with code {process.returncode}); see its "
                f"output in {kept}"
            )
        if on_progress is not None:
            on_progress(committed.count())
    finally:
        shutil.rmtree(reports, ignore_errors=True)


def init_process_group() -> bool:
    """Initialise the default process group for a recipe when nothing has; whether this did (a
    rank's replay starts a recipe the same way, see :mod:`bisect_repro.replay.bootstrap`)."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if (
        torch.cuda.is_available()
        and int(os.environ.get("LOCAL_WORLD_SIZE", "1")) <= torch.cuda.device_count()
    ):
        # one GPU a rank; more ranks than GPUs on this node train on the CPU
        torch.cuda.set_device(local_rank)
        # NCCL for CUDA tensors, gloo for a model left on the CPU
        dist.init_process_group("cpu:gloo,cuda:nccl")
    else:
        dist.init_process_group("gloo")
    return True


def main(argv: list[str] | None = None) -> int:
    """One rank: initialise, build the recipe, record it; errors and warnings to the reports
    folder."""
    spec = json.loads((argv if argv is not None else sys.argv[1:])[0])
    reports = Path(os.environ.get(_REPORTS, tempfile.gettempdir()))
    rank = int(os.environ.get("RANK", "0"))

    def report(kind: str, text: str) -> None:
        with open(reports / f"rank{rank}.{kind}", "a", encoding="utf-8") as handle:
            handle.write(" ".join(text.split()) + "\n")

    import torch.distributed as dist

    ours = False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default", RecordingWarning)
            warnings.showwarning = lambda message, *_, **__: report("warnings", str(message))
            ours = init_process_group()
            options = RecordOptions(**spec["options"])
            trainee = build(spec["target"], spec["config"])
            record(
                trainee,
                spec["out"],
                options,
                target=spec["target"],
                config=spec["config"],
                resume=spec["resume"],
            )
    except BisectReproError as error:
        report("peer" if isinstance(error, AnotherRankFailed) else "error", f"rank {rank}: {error}")
        return 2
    finally:
        if ours and dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
