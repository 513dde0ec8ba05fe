"""``config``: the runs were built with different settings (a config value, a command-line
argument, an optimizer setting).

The records name it where a config value or argument differs, or where the optimizer's or the
scheduler's non-tensor settings differ at a snapshot while no argument names them (a config
file's weight decay). A replay proves it by rebuilding run B with run A's config (a recipe) or
relaunching run B's script with run A's arguments, the step then matching.
"""

from __future__ import annotations

from ...advice import config_value, config_values
from ..records import Records
from ..signals import Signals
from ..verdict import Verdict
from .cause import Cause
from .entry import CauseEntry, Finding, Particulars, RecordsSignal, Window

__all__ = ["ENTRY"]


def _config(records: Records, w: Window) -> Finding | None:
    differences = records.differences
    settings = differences.settings
    # a setting no argument names (a config file's)
    if not differences.config and settings is not None:
        keys = list(settings.differing)
        return Finding(cause=Cause.CONFIG, what=settings.describe(), config_keys=keys)
    if not differences.config:
        return None
    keys = (settings.config_keys if settings is not None else []) or list(differences.config)
    shown = ", ".join(config_values(differences.config, keys[:4]))
    return Finding(cause=Cause.CONFIG, what=f"the settings differ ({shown})", config_keys=keys)


def _holds(s: Signals, v: Verdict) -> bool:
    return bool(s.config) and (
        "optimizer settings" in s.config or all(key in s.config for key in v.config_keys)
    )


def _fix(p: Particulars) -> str:
    shown = ", ".join(
        f"{k}: {config_value(v[0])} vs {config_value(v[1])}" for k, v in p.config.items()
    )
    return (
        f"record both runs with the same settings ({shown})"
        if shown
        else "record both runs with the same settings"
    )


def _explain(p: Particulars) -> str:
    named = ", ".join(config_values(p.config, p.config_keys))
    matches = ", and run B rebuilt with run A's matches" if p.proven else ""
    return f"the runs were built with different settings ({named}): {p.where} differs{matches}"


ENTRY = CauseEntry(
    cause=Cause.CONFIG,
    title="the config",
    meaning="the runs were built with different settings (`--set` values, the Recorder's "
    "`config=`, a script's command-line flags, an optimizer setting)",
    requires="a config value, a command-line argument or an optimizer setting differs",
    holds=_holds,
    proof="run B rebuilt (a script: relaunched) with run A's config or arguments, the step then "
    "matching",
    unproven="inferred: the settings differ and nothing else the records show does",
    remedy="the key or flag named with both values, the same in both runs",
    fix=_fix,
    explain=_explain,
    signals=(
        RecordsSignal(
            name="config",
            rank=60,
            when="a config value, command-line argument or optimizer setting differs",
            find=_config,
        ),
    ),
    compiler_may_explain=True,
)
