"""A fork server started the moment ``bisect-repro compare`` starts, before the command has
imported torch, so that the server's imports and the command's run side by side.

A compare's replaying processes are forked from a fork server (:mod:`bisect_repro.replay.forks`),
which imports torch and the run's framework first: seconds of a core. Started when the command
has read its runs, the server's imports come after the command's own (torch, about 1.3 s of a
core); started here, at the entry of the command line (:mod:`bisect_repro.__main__`), they run on
another core meanwhile.

Design decisions:

- **It imports only what every fork server imports** (torch, NumPy, the bootstrap). Which of the
  libraries in :data:`~bisect_repro.replay.forks.PRELOADED` it adds is decided later, from the
  run's checked code (:func:`~bisect_repro.replay.forks.preloads`), by a request: nothing in a
  run directory is read here.
- **Adopted only where it is the server a replica would start**: its environment is this
  process's at start as a replaying process gets it (:func:`replica_environment`), with no
  recorded variable changed. A replica whose run recorded other values of the replayed variables
  gets a server of its own, as before, and the prestarted one ends unused.
- **It ends with this process**: its standard input is a pipe from here, and a fork server whose
  input closes exits at once; the pipe closes when this process exits, however it exits.

Where the guarantees stop: a compare that replays nothing (identical runs, runs it may not
replay) has paid a server's imports on a core it did not otherwise use.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from ..variables import DEFER_VARIABLE, PRIVATE_PREFIX

__all__ = ["ServerProcess", "discard", "end", "launch", "prestart", "replica_environment", "take"]


@dataclass(frozen=True)
class ServerProcess:
    """A fork server's process, with its private folder, log and environment (started ahead or
    not)."""

    process: subprocess.Popen[bytes]
    folder: str
    log: Path
    environment: dict[str, str]
    """The environment it was started with, less :data:`DEFER_VARIABLE`."""


_ahead: list[ServerProcess] = []
_lock = threading.Lock()


def replica_environment(variables: dict[str, str | None] | None = None) -> dict[str, str]:
    """The environment a replaying process starts with, less its private variables: this one's,
    without bisect-repro's own variables, with ``variables`` set (``None``: unset) and the
    package first on ``PYTHONPATH``."""
    package_root = str(Path(__file__).resolve().parents[2])
    environment = {k: v for k, v in os.environ.items() if not k.startswith(PRIVATE_PREFIX)}
    for name, value in (variables or {}).items():
        if value is None:
            environment.pop(name, None)
        else:
            environment[name] = str(value)
    environment["PYTHONPATH"] = os.pathsep.join(
        p for p in (package_root, environment.get("PYTHONPATH")) if p
    )
    return environment


def launch(environment: dict[str, str], modules: list[str]) -> ServerProcess:
    """Start a fork server with ``environment`` (less :data:`DEFER_VARIABLE`, which it gets too),
    preloading ``modules``, in a private folder of its own."""
    # mode 0700, empty: its cwd, on its sys.path
    folder = tempfile.mkdtemp(prefix="bisect-repro-fork-")
    log = Path(folder) / "server.log"
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "bisect_repro.replay.forkserver", json.dumps(modules)],
            cwd=folder,
            env={**environment, DEFER_VARIABLE: "1"},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=output,
        )
    return ServerProcess(process, folder, log, environment)


def prestart() -> ServerProcess:
    """Start a fork server now, for :func:`take` to hand to the first replica whose server it is."""
    started = launch(replica_environment(), [])
    with _lock:
        _ahead.append(started)
    return started


def take(environment: dict[str, str]) -> ServerProcess | None:
    """The server started ahead with exactly ``environment`` (a replica's, less its private
    variables), handed over once; ``None`` when there is none, it has ended, or its environment
    differs."""
    with _lock:
        for started in _ahead:
            if started.environment == environment and started.process.poll() is None:
                _ahead.remove(started)
                return started
    return None


def discard() -> None:
    """End the servers started ahead that no replica took."""
    with _lock:
        left = _ahead[:]
        _ahead.clear()
    for started in left:
        end(started.process, started.folder, started.log)


def end(process: subprocess.Popen[bytes], folder: str, log: Path) -> None:
    """End a fork server: its input closes (it kills the copies still running, then exits), it is
    waited for (killed after 10 s), and its folder is removed."""
    if process.stdin is not None:
        with contextlib.suppress(OSError):
            process.stdin.close()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    with contextlib.suppress(OSError):
        log.unlink()
        os.rmdir(folder)
