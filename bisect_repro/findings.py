"""What ``doctor`` reports: one finding per source of irreproducibility, as plain JSON data.

A finding is a dict, not a class: it is the ``findings`` item of the ``bisect-repro/doctor/1``
JSON object as it is printed, and the steps that prove it amend it in place (``threads-unpinned``
gains its proof or drops to ``info``). It lives apart from ``doctor`` because the experiments, the
environment audit and the report all make or read findings, and ``doctor`` imports them all.

Severity: ``error`` makes the recipe irreproducible on this machine, ``warning`` will bite
elsewhere (another GPU, core count or launcher), ``info`` is worth knowing; ``SEVERITIES`` is
also the order findings are listed in.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SEVERITIES", "finding"]

SEVERITIES = ("error", "warning", "info")


def finding(id: str, severity: str, evidence: str, fix: str, layer: str | None = None, op: str | None = None) -> dict[str, Any]:
    """One finding: what it is (``id``), how bad, where (``layer``, ``op``), what was seen, and the fix."""
    return {"id": id, "severity": severity, "layer": layer, "op": op, "evidence": evidence, "fix": fix}
