"""Replaying processes forked from one that has already imported torch and the run's framework.

Starting a replaying process is mostly starting Python and importing torch and the run's
framework (seconds of a core each), and a framework's run repeats a step in a fresh process
(see :mod:`bisect_repro.replay.replica`), so a compare may start ten. Inside :func:`forking`, a
:class:`~bisect_repro.replay.replica.Replica` instead asks a fork server for its process: a
``python -m bisect_repro.replay.forkserver`` started once per environment, which imports torch,
NumPy, bisect-repro's bootstrap and the heavy libraries the run's code imports, then, for each
request, forks a copy that runs the bootstrap exactly as a fresh process would. The copy starts
in milliseconds, with nothing run but imports.

Design decisions:

- **Forked before any work, never after.** A process that has run a multi-threaded torch op
  cannot be forked safely: GNU OpenMP's thread pool does not survive ``fork`` and the copy hangs
  in its first parallel op. The server only imports, and forks nothing if its imports started a
  thread (an OpenMP team) or initialised CUDA, so each copy builds its own, as a fresh process.
- **One server per environment.** Variables read when a library loads (``OMP_NUM_THREADS``,
  ``PYTHONHASHSEED``, ``CUBLAS_WORKSPACE_CONFIG``) are the server's: a replica whose environment
  differs in anything but its connection gets another server (an experiment on a variable).
- **What is preloaded is ours to choose, from what the code imports.** Only libraries in
  :data:`PRELOADED` that the checked file itself imports (read with :mod:`ast`, never run), and
  none that a file beside the code or in its working directory would shadow. Nothing in a run
  directory names a module here.
- **A copy is a fresh process in all that the run reads**: its Python, NumPy and torch global
  streams are drawn again from the OS (a fresh interpreter's are; CUDA's start in the copy), and
  its working directory, import path, environment and output are a fresh replica's.
- **Exit codes are true**: the server reaps its copies and reports each exit code.
- **The imports' objects are frozen out of the garbage collector** (:func:`gc.freeze`) before the
  first fork. A copy's collections would walk every object torch and the framework made, and
  each page walked is copied: four copies of the Hugging Face example's server took 0.65 s to
  connect side by side, 0.2 s frozen, and its compare 8.9 s against 7.2 s.

Where the guarantees stop: the salt of ``str`` hashes is fixed when Python starts, so copies of
one server share it where ``PYTHONHASHSEED`` is unset (fresh processes would each draw one): a
step that iterates a set of strings repeats in copies as it would not in fresh processes. A
seeding call or thread count set *while* a preloaded library is imported happens in the server,
before the bootstrap's watch is installed, and is not reported (none of the libraries in
:data:`PRELOADED` makes one). ``doctor``, whose experiments compare fresh processes, does not fork.
A server that cannot start or fork leaves the replica to a fresh process, as outside
:func:`forking`.
"""

from __future__ import annotations

import ast
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from .prestart import ServerProcess, discard, end, launch, take

_log = logging.getLogger(__name__)

__all__ = [
    "PRELOADED",
    "ForkServers",
    "ForkedProcess",
    "forking",
    "preloads",
    "servers",
    "start_process",
]

PRELOADED = frozenset(
    {
        "torch",
        "numpy",
        "lightning",
        "pytorch_lightning",
        "transformers",
        "accelerate",
        "torchvision",
        "torchaudio",
    }
)
"""Libraries a fork server imports when the run's code does: heavy to import, and importing them
draws no random number and starts no thread pool."""


_PARSING = threading.Lock()
"""Held around ``ast.parse``: CPython 3.11 keeps the AST converter's recursion depth in
per-interpreter state, so two threads parsing at once can fail with ``SystemError: AST
constructor recursion depth mismatch`` (replicas start on pool threads)."""


def preloads(path: str | None, beside: tuple[str | None, ...] = ()) -> list[str]:
    """What a fork server imports for the code in ``path``: each :data:`PRELOADED` library it
    imports (``module`` or ``module:Name`` for a name taken from it, which loads a lazy module's
    part), except one that a file or folder in ``path``'s folder or in ``beside`` would shadow."""
    if path is None:
        return []
    try:
        with _PARSING:
            tree = ast.parse(Path(path).read_bytes())
    except (OSError, SyntaxError, ValueError):
        return []
    folders = [Path(path).parent, *(Path(folder) for folder in beside if folder)]

    def shadowed(name: str) -> bool:
        return any(
            (folder / name).exists() or (folder / f"{name}.py").exists() for folder in folders
        )

    found: dict[str, None] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [
                node.module,
                *(f"{node.module}:{alias.name}" for alias in node.names if alias.name != "*"),
            ]
        else:
            continue
        for name in names:
            top = name.split(".")[0].split(":")[0]
            if top in PRELOADED and not shadowed(top):
                found[name] = None
    return list(found)


class ForkedProcess:
    """A replaying process asked of a fork server: ``pid``, ``poll``, ``wait`` and ``kill``, as
    :class:`subprocess.Popen`'s. Until the server has forked it, ``pid`` is ``None``; when the
    server cannot fork (it could not start, or is unfit), the process is started afresh by
    ``fresh`` instead, and this object stands for that one."""

    def __init__(self, fresh: Callable[[], subprocess.Popen[bytes]]) -> None:
        self._fresh = fresh
        self._popen: subprocess.Popen[bytes] | None = None
        self._pid: int | None = None
        self._code: int | None = None
        self._done = threading.Event()
        self._killed = False

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen is not None else self._pid

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode if self._popen is not None else self._code

    def _forked(self, pid: int) -> None:
        self._pid = pid
        if self._killed:
            self.kill()

    def _exited(self, code: int) -> None:
        self._code = code
        self._done.set()

    def _fall_back(self) -> None:
        """The server will not fork this one: start it afresh (unless it was killed meanwhile)."""
        if self._killed:
            self._exited(-9)
            return
        self._popen = self._fresh()
        self._done.set()

    def poll(self) -> int | None:
        return self._popen.poll() if self._popen is not None else self._code

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(f"forked replica {self._pid}", timeout or 0.0)
        if self._popen is not None:
            return self._popen.wait(timeout)
        assert self._code is not None
        return self._code

    def kill(self) -> None:
        self._killed = True
        if self._popen is not None:
            self._popen.kill()
        elif self._pid is not None and self._code is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._pid, signal.SIGKILL)


class _Server:
    """One fork server: its process, the copies it was asked for, and the thread that reads its
    reports."""

    def __init__(
        self, environment: dict[str, str], modules: list[str], ahead: ServerProcess | None = None
    ) -> None:
        """Start a server, or (``ahead``) take one started ahead with this environment and ask it
        to import ``modules`` before its first fork."""
        self._lock = threading.Lock()
        self._waiting: list[ForkedProcess] = []  # asked for, not yet forked, in order
        self._running: dict[int, ForkedProcess] = {}
        self.unfit: str | None = None
        """Why this server forks no more (``None``: it forks)."""
        self.forked = 0
        """The copies it has forked."""
        server = ahead if ahead is not None else launch(environment, modules)
        self.process, self.folder, self.log = server.process, server.folder, server.log
        if ahead is not None and modules and self.process.stdin is not None:
            # a server that has ended is found unfit by its reader
            with contextlib.suppress(OSError):
                self.process.stdin.write((json.dumps({"preload": modules}) + "\n").encode())
                self.process.stdin.flush()
        started = "taken, started ahead" if ahead is not None else "started"
        _log.info(
            "fork server %d %s (preloading %s), output in %s",
            self.process.pid,
            started,
            ", ".join(modules) or "torch",
            self.log,
        )
        self._reader = threading.Thread(target=self._read, name="fork-server-reports", daemon=True)
        self._reader.start()

    def fork(
        self,
        environment: dict[str, str],
        cwd: str,
        log: Path,
        fresh: Callable[[], subprocess.Popen[bytes]],
    ) -> ForkedProcess | None:
        """A copy running the bootstrap with ``environment`` in ``cwd``, its output in ``log`` (or,
        should the server turn out unfit, a fresh process from ``fresh``); ``None`` when this
        server has ended or is unfit."""
        child = ForkedProcess(fresh)
        request = json.dumps({"environment": environment, "cwd": cwd, "log": str(log)}) + "\n"
        with self._lock:
            if (
                self.unfit is not None
                or self.process.poll() is not None
                or self.process.stdin is None
            ):
                return None
            self._waiting.append(child)
            try:
                self.process.stdin.write(request.encode())
                self.process.stdin.flush()
            except OSError:
                self._waiting.remove(child)
                return None
        return child

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            report = json.loads(line)
            with self._lock:
                if "forked" in report:
                    self.forked += 1
                    child = self._waiting.pop(0)
                    self._running[int(report["forked"])] = child
                    child._forked(int(report["forked"]))
                elif "exited" in report and int(report["exited"]) in self._running:
                    self._running.pop(int(report["exited"]))._exited(int(report["code"]))
                elif "unfit" in report:
                    self.unfit = str(report["unfit"])
                    _log.info(
                        "fork server %d cannot fork: %s; replaying processes start afresh",
                        self.process.pid,
                        self.unfit,
                    )
        code = self.process.wait()
        # the server ended: what it had not forked starts afresh; what it had is no longer reported
        with self._lock:
            if self.unfit is None:
                self.unfit = f"the fork server exited with code {code}"
            waiting, running = self._waiting, list(self._running.values())
            self._waiting, self._running = [], {}
        for child in running:
            child.kill()
            child._exited(code if code else -9)
        for child in waiting:
            child._fall_back()

    def close(self) -> None:
        """End the server: it kills the copies still running, then exits."""
        with self._lock:  # no request is being written meanwhile
            if self.process.stdin is not None:
                with contextlib.suppress(OSError):
                    self.process.stdin.close()
        end(self.process, self.folder, self.log)
        self._reader.join(timeout=10)


class ForkServers:
    """The fork servers of one :func:`forking` block, one per environment and preloads."""

    def __init__(self) -> None:
        self._servers: dict[tuple[tuple[tuple[str, str], ...], tuple[str, ...]], _Server] = {}
        self._started: list[_Server] = []
        self._lock = threading.Lock()

    @property
    def started(self) -> int:
        """Fork servers started."""
        return len(self._started)

    @property
    def forked(self) -> int:
        """Replaying processes forked (not those started afresh where a server could not fork)."""
        return sum(server.forked for server in self._started)

    def start(
        self,
        environment: dict[str, str],
        private: set[str],
        modules: list[str],
        cwd: str,
        log: Path,
        fresh: Callable[[], subprocess.Popen[bytes]],
    ) -> ForkedProcess | None:
        """A replaying process forked with ``environment`` (the server's: without the ``private``
        variables, which differ per process), started by ``fresh`` should the server turn out
        unfit; ``None`` when the server for that environment is known to be unfit."""
        shared = {k: v for k, v in environment.items() if k not in private}
        key = (tuple(sorted(shared.items())), tuple(modules))
        with self._lock:
            server = self._servers.get(key)
            if server is None:
                server = self._servers[key] = _Server(shared, modules, take(shared))
                self._started.append(server)
        return server.fork(environment, cwd, log, fresh)

    def close(self) -> None:
        with self._lock:
            servers, self._servers = list(self._servers.values()), {}
        for server in servers:
            server.close()


_active: list[ForkServers] = []
"""The fork servers of the :func:`forking` block under way (this module's own state)."""


@contextlib.contextmanager
def forking() -> Iterator[ForkServers]:
    """Inside this block, replicas fork their processes from fork servers; the servers, any copy
    still running, and any server started ahead that no replica took, end with it."""
    pool = ForkServers()
    _active.append(pool)
    try:
        yield pool
    finally:
        _active.remove(pool)
        pool.close()
        discard()


def servers() -> ForkServers | None:
    """The fork servers replicas take their processes from now (``None``: outside
    :func:`forking`)."""
    return _active[-1] if _active else None


def start_process(
    environment: dict[str, str],
    private: set[str],
    code: tuple[str | None, ...],
    cwd: str,
    log: Path,
    label: str,
) -> subprocess.Popen[bytes] | ForkedProcess:
    """A replaying process running the bootstrap with ``environment`` in the private folder ``cwd``,
    its output in ``log``: inside :func:`forking`, forked from the server for that environment
    (less the ``private`` variables), preloading what the code in ``code[0]`` imports (``code[1:]``:
    the folders whose files it would import instead); otherwise, or where no server can fork it,
    Python started afresh."""

    def fresh() -> subprocess.Popen[bytes]:
        with open(log, "wb") as output:
            process = subprocess.Popen(
                [sys.executable, "-m", "bisect_repro.replay.bootstrap"],
                # private: the recorded cwd never enters sys.path; the bootstrap moves there
                cwd=cwd,
                env=environment,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        _log.info("%s: started process %d, output in %s", label, process.pid, log)
        return process

    pool = servers()
    if pool is not None:
        log.touch(mode=0o600)
        forked = pool.start(environment, private, preloads(code[0], code[1:]), cwd, log, fresh)
        if forked is not None:
            _log.info("%s: forked a process, output in %s", label, log)
            return forked
    return fresh()
