"""What differs in how two runs were set up: their config, their environment and their code, as one
typed bundle.

:func:`read_differences` reads a :class:`Differences` from two runs: each config key, command-line
argument and environment key whose values differ (with both values), and the code each run ran
where its SHA-256 differs (:class:`CodeDifference`: the script's, module's or recipe file's path
and hash in each run and, where both files are on this machine and still hash as recorded, the
first lines where they differ). The non-tensor settings that differ at a snapshot
(:class:`~bisect_repro.diagnose.compare.settings.SettingsDifference`) join the bundle once the
snapshots are read. The records (:class:`~bisect_repro.diagnose.compare.records.Records`), the
result (:class:`~bisect_repro.diagnose.compare.verdict.CompareResult`), the rules' signals
(:class:`~bisect_repro.diagnose.compare.signals.Signals`) and both renderers hold or read this
one object; it turns into JSON only at the edge (``config_diff``, ``environment_diff``,
``code_diff``, ``settings_diff``).

Where the guarantees stop: a run records the hash of its main file only (the script, the module
run as ``__main__`` or the recipe file), not of the modules it imports. Lines are shown only from
files both present here that still hash as recorded (then they are the bytes each run ran), at most
:data:`MAX_CODE_BYTES` each, decoded as UTF-8 with undecodable bytes replaced; the first lines
shown are those of the first change, up to :data:`MAX_LINES` from each file.
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...capture import env
from ...record.arguments import argv_flags
from ...store.meta import CodeKind, CodeRecord
from ...store.run import Run
from .settings import SettingsDifference

__all__ = [
    "MAX_CODE_BYTES",
    "MAX_LINES",
    "CodeDifference",
    "Differences",
    "FirstLines",
    "code_differences",
    "read_differences",
    "run_config",
]

MAX_CODE_BYTES = 4 * 1024 * 1024
"""The largest code file whose lines are compared."""
MAX_LINES = 3
"""Lines shown from each file where the two first differ."""
_MAX_COMPARED = 20_000
"""Past this many lines between the common start and end, only the first differing line is
found (a line-by-line match would take too long)."""


@dataclass(frozen=True, kw_only=True)
class FirstLines:
    """Where two versions of a file first differ: the line in each (1-based) and the lines there."""

    line: tuple[int, int]
    a: tuple[str, ...]
    """Run A's lines from there (up to :data:`MAX_LINES`; none where run B only adds lines)."""
    b: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"line": list(self.line), "a": list(self.a), "b": list(self.b)}

    @classmethod
    def from_json(cls, found: Mapping[str, Any]) -> FirstLines:
        line = found.get("line") or [0, 0]
        return cls(
            line=(int(line[0]), int(line[1])),
            a=tuple(found.get("a") or ()),
            b=tuple(found.get("b") or ()),
        )


@dataclass(frozen=True, kw_only=True)
class CodeDifference:
    """The code the runs ran, where its SHA-256 differs."""

    kind: tuple[str, str]
    """What each run ran: ``script``, ``module`` or ``recipe``."""
    path: tuple[str | None, str | None]
    """The file each run ran, as recorded."""
    sha256: tuple[str, str]
    first_lines: FirstLines | None = None
    """Where the two files first differ, when both could be read as recorded."""
    lines_unavailable: str | None = None
    """Why no lines are shown (``None`` where they are)."""

    @property
    def name(self) -> str:
        """The file's name (run A's, else run B's)."""
        return Path(self.path[0] or self.path[1] or "the code").name

    def describe(self) -> str:
        """The file and both hashes: ``train.py (sha256 1a2b3c4d5e6f in run A, 7a8b9c0d1e2f in
        run B)``."""
        names = [Path(p).name if p else "no file" for p in self.path]
        shown = self.name if names[0] == names[1] else f"{names[0]} in run A, {names[1]} in run B"
        hashes = f"sha256 {self.sha256[0][:12]} in run A, {self.sha256[1][:12]} in run B"
        return f"{shown} ({hashes})"

    def lines_described(self) -> str:
        """The first differing lines in words, or why they are not shown."""
        found = self.first_lines
        if found is None:
            return f"the lines are not shown: {self.lines_unavailable or 'unknown'}"
        a = " / ".join(found.a) or "(nothing)"
        b = " / ".join(found.b) or "(nothing)"
        where = (
            f"line {found.line[0]}"
            if found.line[0] == found.line[1]
            else f"line {found.line[0]} of run A's, {found.line[1]} of run B's"
        )
        return f"first differing at {where}: {a!r} in run A, {b!r} in run B"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": list(self.kind),
            "path": list(self.path),
            "sha256": list(self.sha256),
            "first_lines": self.first_lines.to_json() if self.first_lines else None,
            "lines_unavailable": self.lines_unavailable,
        }

    @classmethod
    def from_json(cls, found: Mapping[str, Any]) -> CodeDifference:
        kind, path, digest = (
            list(found.get(k) or [None, None]) for k in ("kind", "path", "sha256")
        )
        lines = found.get("first_lines")
        return cls(
            kind=(str(kind[0]), str(kind[1])),
            path=(path[0], path[1]),
            sha256=(str(digest[0]), str(digest[1])),
            first_lines=FirstLines.from_json(lines) if lines else None,
            lines_unavailable=found.get("lines_unavailable"),
        )


@dataclass(frozen=True, kw_only=True)
class Differences:
    """What differs in how two runs were set up (see the module docstring)."""

    config: dict[str, list[Any]] = field(default_factory=dict)
    """Config keys and command-line arguments whose values differ: ``{key: [a, b]}``."""
    environment: dict[str, list[Any]] = field(default_factory=dict)
    """Environment keys (settings, variables, versions) whose values differ: ``{key: [a, b]}``."""
    code: tuple[CodeDifference, ...] = ()
    """The code files whose SHA-256 differs."""
    settings: SettingsDifference | None = None
    """The first snapshot where the optimizer's or the scheduler's non-tensor state differs."""

    def to_json(self) -> dict[str, Any]:
        """The bundle's keys of ``compare --json``."""
        settings = self.settings
        return {
            "config_diff": self.config,
            "environment_diff": self.environment,
            "code_diff": [c.to_json() for c in self.code],
            "settings_diff": None
            if settings is None
            else {
                "step": settings.step,
                "differing": settings.differing,
                "config_keys": settings.config_keys,
            },
        }

    @classmethod
    def from_json(cls, found: Mapping[str, Any]) -> Differences:
        """The bundle read back from a ``compare --json`` object (absent keys: nothing differs)."""
        settings = found.get("settings_diff")
        return cls(
            config=dict(found.get("config_diff") or {}),
            environment=dict(found.get("environment_diff") or {}),
            code=tuple(CodeDifference.from_json(c) for c in found.get("code_diff") or ()),
            settings=SettingsDifference(
                step=settings["step"],
                differing=dict(settings.get("differing") or {}),
                config_keys=list(settings.get("config_keys") or []),
            )
            if settings
            else None,
        )


def run_config(run: Run) -> dict[str, Any]:
    """A run's config as compared: a script's also holds its command line flag by flag, unless
    its parsed arguments (keys ``--name``) are recorded, which say more (defaults, aliases)."""
    config, launch = run.meta.config, run.meta.launch
    if (
        launch is None
        or launch.code is None
        or launch.code.kind is CodeKind.RECIPE
        or any(k.startswith("-") for k in config)
    ):
        return config
    return {**argv_flags(launch.argv), **config}


def _names_its_run(value: Any, run: Run) -> Any:
    """``value`` with each path component that is the run directory's own name replaced by one
    placeholder: ``runs/a/logs`` of run ``a`` and ``runs/b/logs`` of run ``b`` then read alike."""
    if not isinstance(value, str):
        return value
    return "/".join("\0run" if part == run.path.name else part for part in value.split("/"))


def read_differences(a: Run, b: Run) -> tuple[Differences, list[str]]:
    """The config, environment and code differences of two runs, and the config keys left out
    because their values differ only by naming each run's own directory (an output folder: they
    cannot change the numbers)."""
    config_a, config_b = run_config(a), run_config(b)
    differ = [
        k for k in dict.fromkeys([*config_a, *config_b]) if config_a.get(k) != config_b.get(k)
    ]
    run_names = [
        k
        for k in differ
        if _names_its_run(config_a.get(k), a) == _names_its_run(config_b.get(k), b)
    ]
    differences = Differences(
        config={k: [config_a.get(k), config_b.get(k)] for k in differ if k not in run_names},
        environment=env.diff(a.environment, b.environment),
        code=code_differences(a, b),
    )
    return differences, run_names


def _code(run: Run) -> CodeRecord | None:
    launch = run.meta.launch
    return launch.code if launch is not None else None


def code_differences(a: Run, b: Run) -> tuple[CodeDifference, ...]:
    """The code file each run ran, where both record a SHA-256 and the two differ (empty: the
    same code, or a run that records none)."""
    ca, cb = _code(a), _code(b)
    if ca is None or cb is None or not ca.sha256 or not cb.sha256 or ca.sha256 == cb.sha256:
        return ()
    texts = [_recorded_text(label, code) for label, code in (("A", ca), ("B", cb))]
    unread = next((why for _, why in texts if why is not None), None)
    lines = None
    if unread is None:
        lines = first_lines(texts[0][0] or "", texts[1][0] or "")
    return (
        CodeDifference(
            kind=(ca.kind.value, cb.kind.value),
            path=(ca.path, cb.path),
            sha256=(ca.sha256, cb.sha256),
            first_lines=lines,
            lines_unavailable=unread,
        ),
    )


def _recorded_text(label: str, code: CodeRecord) -> tuple[str | None, str | None]:
    """A run's code file as it ran (its text), or why it cannot be read so: not here, too large,
    or changed since it was recorded."""
    path = Path(code.path) if code.path else None
    if path is None or not path.is_absolute():
        return None, f"run {label} records no absolute path for its code"
    try:
        if not path.is_file():
            return None, f"run {label}'s {path.name} is not on this machine"
        if path.stat().st_size > MAX_CODE_BYTES:
            return None, f"run {label}'s {path.name} is larger than {MAX_CODE_BYTES} bytes"
        with path.open("rb") as file:
            data = file.read(MAX_CODE_BYTES + 1)
    except OSError as error:
        return None, f"run {label}'s {path.name} cannot be read ({error.strerror or error})"
    if len(data) > MAX_CODE_BYTES or hashlib.sha256(data).hexdigest() != code.sha256:
        return None, f"run {label}'s {path.name} changed since the run was recorded"
    return data.decode("utf-8", errors="replace"), None


def first_lines(a: str, b: str) -> FirstLines | None:
    """Where two texts first differ, line by line (``None``: their lines are the same)."""
    la, lb = a.splitlines(), b.splitlines()
    start = 0
    while start < min(len(la), len(lb)) and la[start] == lb[start]:
        start += 1
    if start == len(la) == len(lb):
        return None
    end = 0
    while end < min(len(la), len(lb)) - start and la[-1 - end] == lb[-1 - end]:
        end += 1
    middle_a, middle_b = la[start : len(la) - end], lb[start : len(lb) - end]
    i, j = 0, 0
    if max(len(middle_a), len(middle_b)) <= _MAX_COMPARED:
        matcher = difflib.SequenceMatcher(None, middle_a, middle_b, autojunk=False)
        _, i, i2, j, j2 = next(op for op in matcher.get_opcodes() if op[0] != "equal")
        middle_a, middle_b = middle_a[i:i2], middle_b[j:j2]
    return FirstLines(
        line=(start + i + 1, start + j + 1),
        a=tuple(_short(line) for line in middle_a[:MAX_LINES]),
        b=tuple(_short(line) for line in middle_b[:MAX_LINES]),
    )


def _short(line: str, limit: int = 160) -> str:
    line = line.rstrip()
    return line if len(line) <= limit else line[: limit - 3] + "..."
