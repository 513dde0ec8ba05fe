"""The property every comparison must have: its verdict satisfies its cause's precondition
(:mod:`bisect_repro.diagnose.compare.rules`), read from the finished result alone (or its JSON), and
no line of it prints ``None``.

:func:`every_comparison_is_checked` (an autouse fixture in ``tests/conftest.py``) checks each
comparison a test makes in its own process, through the API or the CLI alike; end-to-end tests
that run the CLI in a subprocess call :func:`assert_rules_hold` on its JSON.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from bisect_repro.diagnose.compare import compare as compare_module
from bisect_repro.diagnose.compare.rules import violation
from bisect_repro.diagnose.compare.signals import Signals
from bisect_repro.diagnose.compare.verdict import CompareResult

__all__ = ["assert_rules_hold", "every_comparison_is_checked", "rule_violations"]


def rule_violations(result: CompareResult) -> list[str]:
    """What is wrong with the result's verdict by the rules (empty: nothing)."""
    verdict = result.verdict
    if verdict is None:
        return []
    problem = violation(verdict, Signals.of_result(result))
    lines = [verdict.explanation, verdict.fix, *(e.detail for e in verdict.evidence)]
    return [problem] * (problem is not None) + [
        f"prints None: {line}" for line in lines if re.search(r"\bNone\b", line)
    ]


def assert_rules_hold(result: CompareResult | Mapping[str, Any]) -> None:
    found = result if isinstance(result, CompareResult) else CompareResult.from_json(result)
    assert not rule_violations(found), (rule_violations(found), found.verdict)


@pytest.fixture(autouse=True)
def every_comparison_is_checked(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each comparison made in this process during a test, checked when the test ends."""
    seen: list[CompareResult] = []
    for name in ("_compare_pair", "_compare_ranks"):
        original = getattr(compare_module, name)

        def checked(*args: Any, _original: Any = original, **kwargs: Any) -> CompareResult:
            result: CompareResult = _original(*args, **kwargs)
            seen.append(result)
            return result

        monkeypatch.setattr(compare_module, name, checked)
    yield
    broken = [(problem, result.verdict) for result in seen for problem in rule_violations(result)]
    assert not broken, f"a comparison's verdict breaks its cause's rule: {broken}"
