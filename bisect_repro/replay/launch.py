"""What to run to replay a run, and whether it may be run: the launch spec.

A run names what produced it (``run.json``'s ``launch``, see :mod:`bisect_repro.record.launch`):
a recipe TARGET with its config, or a script or module with its ``argv``. :func:`spec_for_run`
turns that into a :class:`LaunchSpec` after checking that the code is on this machine with the
recorded content hash; a recipe built here without a run (``doctor``) gets
:func:`spec_for_recipe`. The spec's environment holds the recorded environment variables that
change numerics or order (``OMP_NUM_THREADS``, ``CUBLAS_WORKSPACE_CONFIG``, ``PYTHONHASHSEED``,
...), set or unset as they were, since they take effect only when a process starts.

Nothing inside a run directory is ever executed: the code a spec names is the user's own file,
outside the run, and :meth:`LaunchSpec.describe` is what ``compare`` prints before running it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import BisectReproError
from ..record.launch import code_changed
from ..record.recipe import recipe_file
from ..store.run import Run

__all__ = ["LaunchSpec", "ReplayUnavailable", "spec_for_recipe", "spec_for_run"]


class ReplayUnavailable(BisectReproError):
    """A run cannot be replayed here (its code is missing or changed, or it names none)."""


@dataclass(frozen=True, kw_only=True)
class LaunchSpec:
    """How to start a process that replays one run."""

    kind: str
    """``recipe``, ``script`` or ``module``."""
    target: str | None = None
    """The recipe TARGET (``recipe``)."""
    config: dict[str, Any] = field(default_factory=dict)
    """The recipe's keyword arguments (``recipe``)."""
    path: str | None = None
    """The file run as ``__main__`` (``script``), or the recipe file."""
    module: str | None = None
    """The module run as ``__main__`` (``module``)."""
    argv: list[str] = field(default_factory=list)
    """``sys.argv`` as recorded (``script``, ``module``)."""
    cwd: str | None = None
    """The working directory to run in (as recorded, when it exists here)."""
    variables: dict[str, str | None] = field(default_factory=dict)
    """Environment variables to set (``None``: unset), as the run had them."""
    seeds: dict[str, int] | None = None
    """Seed these global streams before anything runs (an experiment on the initialisation)."""
    world_size: int | None = None
    """A distributed run's number of ranks: the replay runs that many under ``torchrun --standalone``
    (see :mod:`bisect_repro.replay.ranks`); ``None``: one process."""
    focus: int = 0
    """The rank whose replies a distributed replay returns (the rank the records point to)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "target": self.target,
            "config": self.config,
            "path": self.path,
            "module": self.module,
            "argv": self.argv,
            "seeds": self.seeds,
            "world_size": self.world_size,
        }

    def describe(self) -> str:
        """The command this replays, as a person would type it (a distributed run's: under torchrun,
        with the rank in focus)."""
        ranks = f" --nproc-per-node {self.world_size}" if self.world_size is not None else ""
        focus = f" (focus: rank {self.focus})" if self.world_size is not None else ""
        if self.kind == "recipe":
            settings = " ".join(f"--set {shlex.quote(f'{k}={v}')}" for k, v in self.config.items())
            return f"recipe {self.target}" + (f" {settings}" if settings else "") + ranks + focus
        python = ["torchrun", "--standalone", *ranks.split()] if ranks else ["python"]
        command = [*python, "-m", self.module or "", *self.argv[1:]] if self.kind == "module" else [*python, *self.argv]
        where = f" (in {self.cwd})" if self.cwd else ""
        return " ".join(shlex.quote(part) for part in command) + where + focus

    def with_config(self, config: dict[str, Any]) -> LaunchSpec:
        return replace(self, config=dict(config))

    def with_variables(self, variables: dict[str, str | None]) -> LaunchSpec:
        return replace(self, variables=dict(variables))

    def with_seeds(self, seeds: dict[str, int]) -> LaunchSpec:
        return replace(self, seeds=dict(seeds))

    def on_ranks(self, world_size: int, focus: int) -> LaunchSpec:
        """This spec run on ``world_size`` ranks under torchrun, replying for rank ``focus``."""
        return replace(self, world_size=world_size, focus=focus)


def recorded_variables(environment: dict[str, Any]) -> dict[str, str | None]:
    """The environment variables of a fingerprint (``env.NAME`` keys), as a process needs them."""
    return {key.removeprefix("env."): value for key, value in environment.items() if key.startswith("env.")}


def spec_for_run(run: Run, *, accept_changed: bool = False) -> LaunchSpec:
    """How to replay ``run`` here; :class:`ReplayUnavailable` (one line) when it cannot be."""
    meta = run.meta
    launch = meta.get("launch") or {}
    code = launch.get("code")
    target = meta.get("target")
    variables = recorded_variables(meta.get("environment", {}))
    cwd = launch.get("cwd")
    cwd = cwd if cwd and Path(cwd).is_dir() else None
    if target:
        code = code or {"kind": "recipe", "path": None}
        problem = code_changed(code) if code.get("path") else _recipe_missing(target)
        if problem and not (accept_changed and "changed" in problem):
            raise ReplayUnavailable(f"{run.path}: its recipe {problem}; {_advice(problem)}")
        if code.get("path"):  # the file as recorded, absolute: a relative TARGET named it from the recording's folder
            target = f"{code['path']}:{target.rpartition(':')[2]}"
        config = dict(meta.get("config", {}))
        return LaunchSpec(kind="recipe", target=target, config=config, path=code.get("path"), cwd=cwd, variables=variables)
    if not code:
        raise ReplayUnavailable(
            f"{run.path}: the run names no script or recipe that can be run again (recorded from an interactive session, "
            "python -c or a test runner); record it from a script, or give the Recorder target=, to replay it"
        )
    problem = code_changed(code)
    if problem and not (accept_changed and "changed" in problem):
        raise ReplayUnavailable(f"{run.path}: its script {problem}; {_advice(problem)}")
    return LaunchSpec(
        kind=code["kind"],
        path=code.get("path"),
        module=code.get("module"),
        argv=list(launch.get("argv") or [code.get("path") or ""]),
        cwd=cwd,
        variables=variables,
    )


def spec_for_recipe(target: str, config: dict[str, Any] | None = None, variables: dict[str, str | None] | None = None) -> LaunchSpec:
    """A recipe built fresh (``doctor``): no run, this process's environment unless ``variables`` say otherwise."""
    return LaunchSpec(kind="recipe", target=target, config=dict(config or {}), variables=dict(variables or {}))


def _recipe_missing(target: str) -> str | None:
    path = recipe_file(target)
    return f"{path} is not on this machine" if path is not None and not path.is_file() else None


def _advice(problem: str) -> str:
    if "changed" in problem:
        return "the verdict is from the records alone; pass --accept-changed-code to replay the current version anyway"
    return "the verdict is from the records alone; run compare where the code is"
