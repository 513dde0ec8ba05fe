"""What to run to replay a run, and whether it may be run: the launch spec.

A run names what produced it (``run.json``'s ``launch``, see :mod:`bisect_repro.record.provenance`):
a recipe TARGET with its config, or a script or module with its ``argv``. :func:`spec_for_run`
turns that into a :class:`LaunchSpec`; a recipe built here without a run (``doctor``) gets
:func:`spec_for_recipe`, and a script ``doctor`` runs unchanged :func:`spec_for_command`.

The trust model. A run directory never decides what code runs:

- **Consent.** A spec is ``signed`` when the run's launch claim carries this user's signature and
  every file a replay restores (its checkpoints, module globals and data position included) is
  named by an index line this user signed (:mod:`bisect_repro.store.trust`): the user recorded it
  here, as it is, and it replays with no flag. Any
  other run replays only when the user agrees (``compare --trust``, or yes at the prompt that
  shows :meth:`LaunchSpec.announcement`); without consent the verdict comes from the records.
- **Validation, even with consent** (:func:`spec_for_run` raises :class:`ReplayUnavailable`):
  the code must name an absolute file and its SHA-256, and that file must be on this machine with
  that hash, outside Python's standard library; the module that runs is that file (a module's
  dotted name must be the file's path below its root, and the bootstrap checks the file it
  imports), and a recipe's function must be a Python function of that file; no code from inside
  a run directory; the recorded working directory becomes the process's working directory but
  never enters the import path (the process starts in a private folder and the bootstrap drops
  it from ``sys.path``); of the recorded environment variables only those that change numerics
  or order (:data:`REPLAYED_VARIABLES`) are set, and their values must be short printable text;
  a distributed run's world size must fit this machine (four gloo ranks a core, one NCCL rank a
  GPU). The recorded interpreter is never used: the replay runs this one.
- **The announcement** (:meth:`LaunchSpec.announcement`) names the file that runs, its hash, the
  working directory and every variable set, with control characters escaped. The hash travels to
  the bootstrap, which runs only bytes with that hash (:mod:`bisect_repro.replay.pinned`): a file
  swapped after the announcement is refused, never run.

Where the guarantees stop: only the main file (or recipe file) is hashed, not what it imports;
consent to replay a run is consent to run that file with those arguments.
"""

from __future__ import annotations

import os
import re
import shlex
import sysconfig
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from ..capture.env import NUMERIC_ENV_VARS
from ..errors import BisectReproError
from ..record.arguments import redacted
from ..record.provenance import file_digest
from ..record.recipe import recipe_file
from ..store.meta import CodeKind, CodeRecord
from ..store.printable import printable
from ..store.run import Run
from ..store.trust import provenance
from .deadline import step_seconds

__all__ = [
    "REPLAYED_VARIABLES",
    "Consent",
    "LaunchSpec",
    "ReplayUnavailable",
    "spec_for_command",
    "spec_for_recipe",
    "spec_for_run",
]

REPLAYED_VARIABLES = frozenset(
    {
        *NUMERIC_ENV_VARS,
        "NCCL_ALGO",
        "NCCL_PROTO",
        "NCCL_MIN_NCHANNELS",
        "NCCL_MAX_NCHANNELS",
        "NCCL_NTHREADS",
        "NCCL_BUFFSIZE",
    }
)
"""The recorded environment variables a replay sets: those that change numerics or order, and
no variable that loads code or names a file (``PYTHONPATH``, ``LD_PRELOAD``,
``NCCL_NET_PLUGIN``)."""

_VALUE = re.compile(r"[\x20-\x7e]{0,256}")
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


class ReplayUnavailable(BisectReproError):
    """A run cannot be replayed here (its code is missing, changed or not allowed, or it names
    none)."""


@dataclass(frozen=True, kw_only=True)
class LaunchSpec:
    """How to start a process that replays one run."""

    kind: CodeKind
    target: str | None = None
    """The recipe TARGET (``recipe``): ``/abs/file.py:function`` or ``package.module:function``."""
    config: dict[str, Any] = field(default_factory=dict)
    """The recipe's keyword arguments (``recipe``)."""
    path: str | None = None
    """The file that runs: the script, the module's file or the recipe file (absolute)."""
    sha256: str | None = None
    """Its content hash, checked before the process starts."""
    module: str | None = None
    """The module run as ``__main__`` (``module``)."""
    root: str | None = None
    """The folder a module (or a module recipe) is imported from: its file's path less the dotted
    name."""
    argv: list[str] = field(default_factory=list)
    """``sys.argv`` as recorded (``script``, ``module``)."""
    cwd: str | None = None
    """The working directory to run in (as recorded, when it exists here); never on the import
    path."""
    variables: dict[str, str | None] = field(default_factory=dict)
    """Environment variables to set (``None``: unset), as the run had them
    (:data:`REPLAYED_VARIABLES` only)."""
    seeds: dict[str, int] | None = None
    """Seed these global streams before anything runs (an experiment on the initialisation)."""
    world_size: int | None = None
    """A distributed run's number of ranks: the replay runs that many under ``torchrun
    --standalone`` (see :mod:`bisect_repro.replay.ranked`); ``None``: one process."""
    focus: int = 0
    """The rank whose replies a distributed replay returns (the rank the records point to)."""
    signed: bool = True
    """Whether this user recorded the run here (its launch claim carries this user's signature).
    A spec that is not signed runs only with the user's consent."""
    step_seconds: float | None = None
    """The recorded seconds a step took, which bound every wait on the replaying process
    (:mod:`bisect_repro.replay.deadline`)."""
    auto: bool = False
    """The script was recorded unchanged (``record -- python train.py``): the bootstrap installs
    the same hooks (:mod:`bisect_repro.record.autohooks`) before running it."""
    start_step: int = 0
    """The step the script's first step is (``auto`` only): a script resumed from another run's
    checkpoint, its count started again at 0, is replayed at the other run's steps
    (:meth:`~bisect_repro.store.run.Run.shifted`)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", CodeKind(self.kind))

    def to_json(self) -> dict[str, Any]:
        """What the bootstrap reads (``BISECT_REPRO_SPEC``)."""
        return {
            "kind": self.kind.value,
            "target": self.target,
            "config": self.config,
            "path": self.path,
            "module": self.module,
            "root": self.root,
            "argv": self.argv,
            "cwd": self.cwd,
            "seeds": self.seeds,
            "world_size": self.world_size,
            "auto": self.auto,
            "start_step": self.start_step,
            "sha256": self.sha256,
        }

    def describe(self) -> str:
        """The command this replays, as a person would type it, on one line with control characters
        escaped and a secret's value redacted (a distributed run's: under torchrun, with the rank in
        focus)."""
        ranks = f" --nproc-per-node {self.world_size}" if self.world_size is not None else ""
        focus = f" (focus: rank {self.focus})" if self.world_size is not None else ""
        if self.kind is CodeKind.RECIPE:
            settings = " ".join(f"--set {shlex.quote(f'{k}={v}')}" for k, v in self.config.items())
            return printable(
                f"recipe {self.target}" + (f" {settings}" if settings else "") + ranks + focus
            )
        python = ["torchrun", "--standalone", *ranks.split()] if ranks else ["python"]
        main = ["-m", self.module or ""] if self.kind is CodeKind.MODULE else [self.path or ""]
        command = [*python, *main, *redacted(self.argv[1:])]
        where = f" (in {self.cwd})" if self.cwd else ""
        hooks = " (under bisect-repro's hooks)" if self.auto else ""
        return printable(" ".join(shlex.quote(part) for part in command) + where + hooks + focus)

    def announcement(self) -> list[str]:
        """What runs, in full, for the user to read before it does: the command, the file and its
        hash, the working directory and every variable set; control characters escaped."""
        lines = [self.describe(), f"file: {printable(self.path)} (sha256 {self.sha256})"]
        if self.root is not None:
            lines.append(f"imported from: {printable(self.root)}")
        lines.append(f"working directory: {printable(self.cwd or os.getcwd())}")
        values = [
            f"{name}={printable(shlex.quote(value))}"
            for name, value in self.variables.items()
            if value is not None
        ]
        unset = [name for name, value in self.variables.items() if value is None]
        lines.append(f"sets: {', '.join(values)}" if values else "sets no environment variable")
        if unset:
            lines.append(f"unsets: {', '.join(unset)}")
        return lines

    def with_config(self, config: dict[str, Any]) -> LaunchSpec:
        return replace(self, config=dict(config))

    def with_variables(self, variables: dict[str, str | None]) -> LaunchSpec:
        return replace(self, variables=_replayed(variables, None))

    def with_seeds(self, seeds: dict[str, int]) -> LaunchSpec:
        return replace(self, seeds=dict(seeds))

    def on_ranks(self, world_size: int, focus: int) -> LaunchSpec:
        """This spec run on ``world_size`` ranks under torchrun, replying for rank ``focus``."""
        return replace(self, world_size=world_size, focus=focus)


Consent = Callable[[Sequence[tuple[str, LaunchSpec]]], bool]
"""Asks the user whether runs that this user did not record here may be replayed: called with
each such run's label and spec (whose :meth:`LaunchSpec.announcement` says what would run)."""


def _replayed(variables: dict[str, Any], run: Run | None) -> dict[str, str | None]:
    """The variables a replay sets: :data:`REPLAYED_VARIABLES` with short printable values."""
    kept: dict[str, str | None] = {}
    for name, value in variables.items():
        if name not in REPLAYED_VARIABLES:
            continue
        if value is not None and (not isinstance(value, str) or not _VALUE.fullmatch(value)):
            where = f"{run.path}: " if run is not None else ""
            raise ReplayUnavailable(
                f"{where}its recorded {name} is not short printable text; the run was edited, "
                "record it again"
            )
        kept[name] = value
    return kept


def _bounded_world(run: Run) -> None:
    """Refuse a world size this machine cannot run: more than four ranks a CPU core (gloo), or
    under NCCL more ranks than GPUs."""
    distributed = run.meta.distributed
    if distributed is None:
        return
    nccl = "nccl" in (distributed.backend or "")  # "nccl", or "cpu:gloo,cuda:nccl"
    limit = torch.cuda.device_count() if nccl else 4 * (os.cpu_count() or 1)
    if distributed.world_size > limit:
        raise ReplayUnavailable(
            f"{run.path}: was recorded on {distributed.world_size} ranks, more than this machine "
            f"runs ({limit}); "
            "the verdict is from the records alone; compare it where it ran"
        )


def _quietly(check: Callable[[], Any]) -> Any:
    """A file-system check on a path a run names, ``None`` when the path cannot even be looked at
    (too long, a loop of links, not permitted): such a path is never run."""
    try:
        return check()
    except (OSError, RuntimeError, ValueError):
        return None


def _inside_a_run(path: Path) -> Path | None:
    """The run directory ``path`` lies in, if any: code from there is never run."""
    for folder in path.parents:
        if _quietly((folder / "run.json").is_file) and _quietly((folder / "rank0").is_dir):
            return folder
    return None


def _standard_library(path: Path) -> bool:
    """Whether ``path`` is a module of Python's standard library (``timeit``, ``subprocess``): never
    a training script, and what a crafted launch would name to run a command."""
    if {"site-packages", "dist-packages"} & set(path.parts):
        return False
    roots = {Path(sysconfig.get_paths()[key]).resolve() for key in ("stdlib", "platstdlib")}
    return any(path.is_relative_to(root) for root in roots)


def _module_root(module: str, path: Path, *, main: bool) -> Path | None:
    """The folder ``module`` is imported from, if ``path`` is that module's file below it (its
    ``.py``, its package's ``__init__.py``, or for ``-m`` its package's ``__main__.py``)."""
    parts = module.split(".")
    endings = [(*parts[:-1], f"{parts[-1]}.py"), (*parts, "__init__.py")] + (
        [(*parts, "__main__.py")] if main else []
    )
    for ending in endings:
        if path.parts[-len(ending) :] == ending:
            return path.parents[len(ending) - 1]
    return None


def _checked_code(
    run: Run, code: CodeRecord | None, kind: CodeKind, accept_changed: bool
) -> tuple[Path, str]:
    """The recorded file of a ``kind`` launch, resolved, after every check that does not depend on
    consent."""
    what = kind.value
    if code is None or not code.path or not code.sha256:
        raise ReplayUnavailable(
            f"{run.path}: its launch record names no {what} file with its SHA-256 (recorded by an "
            "older bisect-repro, or edited); "
            "the verdict is from the records alone; record the run again to replay it"
        )
    recorded = Path(code.path)
    if not recorded.is_absolute():
        raise ReplayUnavailable(
            f"{run.path}: its {what} {printable(code.path)} is not an absolute path; the run was "
            "edited, record it again"
        )
    path = _quietly(recorded.resolve) or recorded
    if not _quietly(path.is_file):
        raise ReplayUnavailable(
            f"{run.path}: its {what} {printable(path)} is not on this machine; "
            "the verdict is from the records alone; run compare where the code is"
        )
    if _standard_library(path):
        raise ReplayUnavailable(
            f"{run.path}: its {what} {printable(path)} is part of Python's standard library, not "
            "training code; "
            "the run was edited; the verdict is from the records alone"
        )
    inside = _inside_a_run(path)
    if inside is not None:
        raise ReplayUnavailable(
            f"{run.path}: its {what} {printable(path)} lies inside the run directory "
            f"{printable(inside)}; "
            "code from a run directory is never run; the verdict is from the records alone"
        )
    digest = file_digest(path)
    if digest != code.sha256 and not accept_changed:
        raise ReplayUnavailable(
            f"{run.path}: its {what} {printable(path)} changed since the run was recorded (its "
            "SHA-256 differs); the verdict is from "
            "the records alone; pass --accept-changed-code to replay the current version anyway"
        )
    return path, digest or ""


def recorded_variables(environment: Mapping[str, Any]) -> dict[str, str | None]:
    """The environment variables of a fingerprint (``env.NAME`` keys), as a process needs them."""
    return {
        key.removeprefix("env."): value
        for key, value in environment.items()
        if key.startswith("env.")
    }


def spec_for_run(run: Run, *, accept_changed: bool = False) -> LaunchSpec:
    """How to replay ``run`` here; :class:`ReplayUnavailable` (one line) when it cannot be.

    The spec's ``signed`` says whether this user recorded the run; see the module docstring."""
    meta = run.meta
    launch = meta.launch
    code = launch.code if launch is not None else None
    variables = _replayed(recorded_variables(meta.environment), run)
    cwd = (
        launch.cwd
        if launch is not None
        and launch.cwd
        and Path(launch.cwd).is_absolute()
        and _quietly(Path(launch.cwd).is_dir)
        else None
    )
    _bounded_world(run)  # refused before anything starts; the ranks are set by on_ranks
    auto = launch is not None and launch.auto
    common: dict[str, Any] = {
        "cwd": cwd,
        "variables": variables,
        "signed": provenance(run).yours,
        "auto": auto,
        "start_step": run.offset if auto else 0,
    }
    common["step_seconds"] = step_seconds(run)
    if meta.target:
        if code is None or code.kind is not CodeKind.RECIPE:
            code = None
        path, digest = _checked_code(run, code, CodeKind.RECIPE, accept_changed)
        where, _, function = meta.target.rpartition(":")
        if not function.isidentifier():
            raise ReplayUnavailable(
                f"{run.path}: its target {printable(meta.target)} names no function; the run was "
                "edited, record it again"
            )
        if where.endswith(".py"):
            return LaunchSpec(
                kind=CodeKind.RECIPE,
                target=f"{path}:{function}",
                config=dict(meta.config),
                path=str(path),
                sha256=digest,
                **common,
            )
        root = _module_root(where, path, main=False) if _MODULE.fullmatch(where) else None
        if root is None:
            raise ReplayUnavailable(
                f"{run.path}: its target {printable(meta.target)} is not the recorded file "
                f"{printable(path)}; "
                "the run was edited, record it again"
            )
        return LaunchSpec(
            kind=CodeKind.RECIPE,
            target=meta.target,
            config=dict(meta.config),
            path=str(path),
            sha256=digest,
            root=str(root),
            **common,
        )
    if code is None:
        raise ReplayUnavailable(
            f"{run.path}: the run names no script or recipe that can be run again (recorded from "
            "an interactive session, "
            "python -c or a test runner); record it from a script, or give the Recorder target=, "
            "to replay it"
        )
    if code.kind is CodeKind.RECIPE:
        raise ReplayUnavailable(
            f"{run.path}: its launch names a recipe but the run has no target; the run was edited, "
            "record it again"
        )
    path, digest = _checked_code(run, code, code.kind, accept_changed)
    argv = list(launch.argv) if launch is not None and launch.argv else [str(path)]
    if code.kind is CodeKind.SCRIPT:
        return LaunchSpec(kind=CodeKind.SCRIPT, path=str(path), sha256=digest, argv=argv, **common)
    module = code.module or ""
    root = _module_root(module, path, main=True) if _MODULE.fullmatch(module) else None
    if root is None:
        raise ReplayUnavailable(
            f"{run.path}: its module {printable(module)} is not the recorded file "
            f"{printable(path)}; "
            "the run was edited, record it again"
        )
    return LaunchSpec(
        kind=CodeKind.MODULE,
        path=str(path),
        sha256=digest,
        module=module,
        root=str(root),
        argv=argv,
        **common,
    )


def spec_for_command(
    path: Path,
    argv: Sequence[str],
    variables: dict[str, str | None] | None = None,
    *,
    module: str | None = None,
) -> LaunchSpec:
    """A script (or ``module``, whose file is ``path``) the user names here (``doctor -- python
    train.py ARGS``): run unchanged under the hooks (``auto``), in this process's working directory
    and environment, less what ``variables`` say otherwise; a module is imported from its root."""
    root = (
        _module_root(module, path, main=True)
        if module is not None and _MODULE.fullmatch(module)
        else None
    )
    if module is not None and root is None:
        raise BisectReproError(
            f"doctor: the module {printable(module)} is not the file {printable(path)}; give the "
            "script's path"
        )
    return LaunchSpec(
        kind=CodeKind.MODULE if module is not None else CodeKind.SCRIPT,
        path=str(path),
        sha256=file_digest(path),
        module=module,
        root=str(root) if root is not None else None,
        argv=list(argv),
        cwd=os.getcwd(),
        variables=_replayed(dict(variables or {}), None),
        auto=True,
    )


def spec_for_recipe(
    target: str,
    config: dict[str, Any] | None = None,
    variables: dict[str, str | None] | None = None,
) -> LaunchSpec:
    """A recipe the user names here (``doctor``): this process's working directory and environment,
    less what ``variables`` say otherwise; a module TARGET is imported from the working
    directory."""
    path = recipe_file(target)
    cwd = os.getcwd()
    if path is not None:
        target = f"{path}:{target.rpartition(':')[2]}"
    return LaunchSpec(
        kind=CodeKind.RECIPE,
        target=target,
        config=dict(config or {}),
        path=str(path) if path is not None else None,
        sha256=file_digest(path) if path is not None else None,
        root=None if path is not None else cwd,
        cwd=cwd,
        variables=_replayed(dict(variables or {}), None),
    )
