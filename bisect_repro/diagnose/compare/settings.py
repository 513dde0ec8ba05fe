"""Non-tensor state compared: the optimizer's hyperparameters and the scheduler's state, snapshot by
snapshot.

A learning rate, a momentum, a milestone: none of them is a tensor, so the hashes of a snapshot do
not show them, yet a step that reads another one computes other numbers. Each snapshot records
them (``settings``, see :meth:`~bisect_repro.capture.state.TrainingState.settings`);
:func:`settings_difference` finds the first snapshot both runs hold where they differ, and names
the config keys that set them: a key whose two values are the two settings (or are found in them,
as a milestone is in a scheduler's ``milestones``).

Where the guarantees stop: only what ``param_groups`` and the scheduler's ``state_dict`` hold as
plain data; a hyperparameter kept elsewhere (a global, a closure) is seen only by its effect.
Runs recorded before snapshots held settings compare as equal here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SettingsDifference", "settings_difference"]


@dataclass(frozen=True, kw_only=True)
class SettingsDifference:
    """The first snapshot where the runs' non-tensor state differs."""

    step: int
    differing: dict[str, list[Any]]
    """Each setting that differs, with run A's and run B's values."""
    config_keys: list[str] = field(default_factory=list)
    """The config keys whose values are those settings' (the keys that set them)."""

    def describe(self) -> str:
        shown = ", ".join(
            f"{_short(key)} ({_short(repr(a))} vs {_short(repr(b))})"
            for key, (a, b) in list(self.differing.items())[:4]
        )
        more = f" and {len(self.differing) - 4} more" if len(self.differing) > 4 else ""
        keys = (
            f", set by the config key{'s' if len(self.config_keys) > 1 else ''} "
            f"{', '.join(self.config_keys)}"
            if self.config_keys
            else ""
        )
        return f"the non-tensor state differs at step {self.step}: {shown}{more}{keys}"


def _short(text: str, limit: int = 80) -> str:
    """At most ``limit`` characters of a name or value from a run (which may be anything)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _holds(setting: Any, value: Any) -> bool:
    """Whether a config value is this setting's value, or one of its items (a milestone of many)."""
    if setting == value:
        return True
    if isinstance(setting, list):
        return value in setting
    if isinstance(setting, dict):
        return str(value) in setting
    return False


def settings_difference(
    snapshots: Iterable[tuple[int, Any, Any]], config_diff: dict[str, list[Any]]
) -> SettingsDifference | None:
    """The first of ``(step, run A's settings, run B's settings)`` (snapshots in step order) whose
    settings differ (``None``: none does), and the config keys among ``config_diff`` that set what
    differs (a key absent from one run's config, at the recipe's default there, is matched on the
    other)."""
    for step, sa, sb in snapshots:
        if not isinstance(sa, dict) or not isinstance(sb, dict):
            continue  # recorded before snapshots held settings, or damaged: nothing to compare
        differing = {key: [sa[key], sb[key]] for key in sa if key in sb and sa[key] != sb[key]}
        if differing:
            keys = [
                key
                for key, (va, vb) in config_diff.items()
                if any(
                    (va is None or _holds(x, va)) and (vb is None or _holds(y, vb))
                    for x, y in differing.values()
                )
            ]
            return SettingsDifference(step=step, differing=differing, config_keys=keys)
    return None
