"""The cause registry: one entry per cause, every table of causes derived from it, and a registry
that would break those refuses to load."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bisect_repro.diagnose.compare.causes import Cause
from bisect_repro.diagnose.compare.causes import registry as registry_module
from bisect_repro.diagnose.compare.causes.entry import Particulars
from bisect_repro.diagnose.compare.causes.registry import (
    ENTRIES,
    PRECEDENCE,
    REGISTRY,
    cause_title,
    explanation_for,
    fix_for,
)
from bisect_repro.diagnose.compare.rules import RULES


def test_each_cause_has_one_entry_and_the_rules_are_the_entries() -> None:
    assert [entry.cause for entry in ENTRIES] == list(REGISTRY)
    assert set(REGISTRY) == set(Cause) and len(ENTRIES) == len(Cause)
    assert dict(RULES) == dict(REGISTRY)
    assert all(entry.title and entry.meaning and entry.remedy for entry in ENTRIES)


def test_the_precedence_is_the_signals_of_every_entry_by_rank() -> None:
    ranks = [signal.rank for signal, _ in PRECEDENCE]
    assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks)
    owners = {signal.name: entry.cause for entry in ENTRIES for signal in entry.signals}
    assert {signal.name: cause for signal, cause in PRECEDENCE} == owners
    # what only a replay shows has no records signal
    assert not REGISTRY[Cause.NONDETERMINISTIC_OP].signals
    assert not REGISTRY[Cause.HIDDEN_STATE].signals


def test_a_registry_missing_a_cause_or_sharing_a_rank_refuses_to_load() -> None:
    with pytest.raises(RuntimeError, match="one entry per cause: \\['unknown'\\]"):
        registry_module._checked(ENTRIES[:-1])
    config = REGISTRY[Cause.CONFIG]
    twin = replace(config.signals[0], name="config_again")
    doubled = tuple(replace(e, signals=(*e.signals, twin)) if e is config else e for e in ENTRIES)
    with pytest.raises(RuntimeError, match="share a rank"):
        registry_module._checked(doubled)


def test_the_fix_and_the_explanation_are_each_causes_own() -> None:
    where = "step 3, forward pass, fc.output"
    keys = Particulars(where=where, environment_keys=["torch.get_num_threads"], proven=False)
    assert fix_for(Cause.ENVIRONMENT, keys).startswith("pin the thread count in both runs")
    assert explanation_for(Cause.ENVIRONMENT, keys) == (
        "the runs' settings differ (torch.get_num_threads): step 3, forward pass, fc.output differs"
    )
    proven = replace(keys, proven=True)
    assert explanation_for(Cause.ENVIRONMENT, proven).endswith(
        "differs, and under run A's settings run B matches"
    )
    assert cause_title(Cause.RNG_STATE) == "a random stream not seeded alike"
    assert cause_title("no_such_cause") == "no_such_cause"
