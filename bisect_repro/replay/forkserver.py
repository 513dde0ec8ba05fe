"""The fork server's process: ``python -m bisect_repro.replay.forkserver MODULES``.

It imports torch, bisect-repro's bootstrap and ``MODULES`` (a JSON list; ``module:Name`` also takes
a name from the module, which loads a lazy library's part), then reads one request a line on its
standard input: ``{"preload": MODULES}`` imports more (a server started ahead is told what the
run's code imports so), any other is the environment, working directory and output file of a
replaying process, and it forks a copy for each, which runs the bootstrap as a fresh process would.
It writes its reports, one JSON object a line, on its standard output: ``{"forked": pid}``,
``{"exited": pid, "code": c}`` (it reaps its copies), or once ``{"unfit": why}`` before it exits,
when an import started threads (an OpenMP team does not survive ``fork``) or initialised CUDA. It
ends, killing the copies still running, when its standard input closes. The controller's side, and
why it is built this way, is :mod:`bisect_repro.replay.forks`.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import select
import signal
import sys
import traceback
from typing import Any

from .forks import PRELOADED


def _preload(modules: list[str]) -> None:
    for name in modules:
        module, _, attribute = name.partition(":")
        # the controller asks for no other; nor is any other imported
        if module.split(".")[0] not in PRELOADED:
            print(
                f"fork server: {name} is not a library it preloads; not imported", file=sys.stderr
            )
            continue
        try:
            loaded = importlib.import_module(module)
            if attribute:
                getattr(loaded, attribute)
        # only a head start: the code imports it again, and fails there if it must
        except Exception as error:
            print(f"fork server: {name} not preloaded: {error}", file=sys.stderr)


def _child(request: dict[str, Any], folder: str, reports: int) -> None:
    """In the forked copy: become a fresh replaying process and run the bootstrap; never returns."""
    code = 1
    try:
        os.close(reports)
        for path, flags, targets in (
            (os.devnull, os.O_RDONLY, (0,)),
            (request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, (1, 2)),
        ):
            handle = os.open(path, flags, 0o600)
            for target in targets:
                os.dup2(handle, target)
            os.close(handle)
        os.environ.clear()
        os.environ.update(request["environment"])
        sys.path[:] = [
            request["cwd"] if p and os.path.realpath(p) == os.path.realpath(folder) else p
            for p in sys.path
        ]
        os.chdir(request["cwd"])
        import random

        import torch

        # a fresh interpreter's streams are drawn from the OS; the server's would be shared by every
        # copy
        random.seed()
        torch.default_generator.seed()
        if "numpy.random" in sys.modules:
            import numpy as np

            np.random.seed()
        from ..capture import vml
        from . import bootstrap

        # deferred in the server (see vml): made here, first, as a fresh process makes it at import
        vml.settle()
        bootstrap.main()
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _report(reports: int, message: dict[str, Any]) -> None:
    os.write(reports, (json.dumps(message) + "\n").encode())


def _unfit(threads: int) -> str | None:
    """Why this process may not fork after its imports, if it may not."""
    import torch

    if _threads() > threads:  # an import ran a parallel op: the copies would hang in their first
        return f"{_threads()} threads after the imports, not {threads}"
    if torch.cuda.is_initialized():  # a CUDA context does not survive fork
        return "an import initialised CUDA"
    # The imports' objects leave the collector's generations: a copy's collections would otherwise
    # walk every one of them, and each page walked is copied on write (starting copies took 0.15 s
    # each, and more beside each other).
    gc.freeze()
    return None


def _serve(modules: list[str]) -> None:
    reports = os.dup(1)
    os.dup2(2, 1)  # whatever an import prints goes to the server's log, never into the reports
    import torch  # noqa: F401  (it has a thread of its own, which a copy lacks: counted before the rest)

    threads = _threads()
    from . import bootstrap  # noqa: F401  (imported here once, for every copy)

    _preload(modules)
    if (why := _unfit(threads)) is not None:
        _report(reports, {"unfit": why})
        return
    folder = os.getcwd()
    children: set[int] = set()
    pending = b""
    while True:
        readable, _, _ = select.select([0], [], [], 0.05)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children.discard(pid)
            _report(reports, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})
        if not readable:
            continue
        data = os.read(0, 1 << 16)
        if not data:  # the controller has gone: so do the copies
            for pid in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            # At once: tearing down an interpreter that has imported torch and a framework takes a
            # second, which the controller would wait for; the reports are written unbuffered.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        pending += data
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            if "preload" in request:  # a server started ahead, told what the run's code imports
                _preload(list(request["preload"]))
                if (why := _unfit(threads)) is not None:
                    _report(reports, {"unfit": why})
                    return
                continue
            sys.stdout.flush()  # nothing an import left in a buffer reaches a copy's output
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(request, folder, reports)
            children.add(pid)
            _report(reports, {"forked": pid})


if __name__ == "__main__":
    _serve(json.loads(sys.argv[1]) if len(sys.argv) > 1 else [])
