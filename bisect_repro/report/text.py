"""What the CLI prints for people: the typed results rendered with rich.

The results are made where their data is (:class:`~bisect_repro.diagnose.show.summary.RunSummary`,
:class:`~bisect_repro.diagnose.compare.verdict.CompareResult`,
:class:`~bisect_repro.diagnose.doctor.doctor.DoctorReport`); their ``to_json()`` is what ``--json``
prints, and the renderings read the same objects, so the two never disagree. Every string in them
that a run supplied (paths, target, config, names, environment, notes) enters rich markup through
:func:`bisect_repro.report.safe.safe_text`: ``[red]`` in a run is printed as text and a control
character as a visible escape, never sent to the terminal.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from ..diagnose.compare.causes.registry import cause_title
from ..diagnose.compare.differences import CodeDifference, Differences
from ..diagnose.compare.verdict import CompareResult, RankResult, ReplayInfo, TimelineRow, Verdict
from ..diagnose.doctor.doctor import DoctorReport
from ..diagnose.doctor.findings import SEVERITIES
from ..diagnose.show.drift import RankDrift
from ..diagnose.show.summary import RunSummary
from ..store.nodes import Layout
from .safe import safe_text

__all__ = [
    "plain_verdict",
    "named_by",
    "render_comparison",
    "render_doctor",
    "render_summary",
    "replay_summary",
    "verdict_where",
]


def _short(values: list[int], limit: int = 12) -> str:
    if len(values) <= limit:
        return ", ".join(map(str, values))
    return (
        ", ".join(map(str, values[: limit // 2]))
        + ", ..., "
        + ", ".join(map(str, values[-limit // 2 :]))
    )


def _recorded_by(summary: RunSummary) -> str:
    if summary.recorded_by_you:
        return "you, on this machine: compare replays it"
    if summary.edited:
        files = safe_text(
            ", ".join(summary.edited[:3])
            + (f" and {len(summary.edited) - 3} more" if len(summary.edited) > 3 else "")
        )
        return (
            f"[yellow]you, but edited since[/] ({files} no longer as signed): compare replays "
            "it only with your consent (--trust)"
        )
    return (
        "[yellow]someone else, or edited since[/]: compare replays it only with your consent "
        "(--trust)"
    )


def _what_ran(summary: RunSummary) -> list[tuple[str, object]]:
    """A recipe's target, or a script's command, working directory and file with its hash."""
    if summary.command is None:
        return [("target", summary.target)]
    return [
        ("command", summary.command),
        ("directory", summary.cwd),
        ("script", f"{summary.script} (sha256 {summary.script_sha256})"),
    ]


def render_summary(summary: RunSummary, console: Console) -> None:
    status = (
        "[green]complete[/]"
        if summary.complete
        else f"[yellow]incomplete[/] (last complete step {summary.last_step})"
    )
    console.print(f"[bold]{safe_text(summary.path)}[/]  {status}")
    table = Table(show_header=False, box=None, padding=(0, 2))
    for label, shown in _what_ran(summary):
        table.add_row(label, safe_text(shown))
    table.add_row(
        "config", safe_text(", ".join(f"{k}={v!r}" for k, v in summary.config.items()) or "-")
    )
    options = summary.options
    table.add_row(
        "options",
        safe_text(
            f"steps={options.get('steps')} every={options.get('every')} "
            f"checkpoint_every={options.get('checkpoint_every')}"
        ),
    )
    table.add_row("recorded by", _recorded_by(summary))
    table.add_row("steps logged", str(summary.steps_logged))
    table.add_row(
        "snapshots",
        f"{len(summary.snapshots)}: {_short(summary.snapshots)}  ({summary.snapshot_bytes:,} "
        "bytes)",
    )
    table.add_row(
        "checkpoints",
        f"{len(summary.checkpoints)}: {_short(summary.checkpoints)}  ({summary.checkpoint_bytes:,} "
        "bytes)",
    )
    table.add_row("tensors hashed", str(summary.tensors_hashed))
    table.add_row("random streams", safe_text(", ".join(map(str, summary.streams))))
    table.add_row("loss", safe_text(f"first {summary.first_loss}, last {summary.last_loss}"))
    table.add_row("loader", safe_text(", ".join(f"{k}={v}" for k, v in summary.loader.items())))
    environment = summary.environment
    keys = (
        "python",
        "torch",
        "numpy",
        "cuda",
        "cpu",
        "devices",
        "torch.get_num_threads",
        "torch.are_deterministic_algorithms_enabled",
    )
    table.add_row("environment", safe_text(", ".join(f"{k}={environment.get(k)}" for k in keys)))
    if summary.distributed is not None:
        described = summary.distributed
        waiting = [f"rank {r.rank} at step {r.last_step}" for r in summary.ranks if not r.complete]
        table.add_row(
            "ranks",
            safe_text(
                f"{described.get('world_size')} ({described.get('layout')}, "
                f"{described.get('backend')})"
                + (f"; incomplete: {', '.join(waiting)}" if waiting else "")
            ),
        )
        if summary.layout is not None:
            for label, line in layout_lines(summary.layout):
                table.add_row(label, safe_text(line))
        if summary.replicas is not None:
            table.add_row("replicas", _replicas_line(summary.replicas))
    console.print(table)


def layout_lines(layout: Layout) -> list[tuple[str, str]]:
    """``show``'s rows of a distributed run's nodes: each node's host and ranks, then what is
    missing."""
    rows = []
    if layout.nnodes is not None and layout.nproc_per_node is not None:
        rows.append(("nodes", f"{layout.nnodes} x {layout.nproc_per_node} ranks"))
    for node in layout.nodes:
        name = f"node {node.node}" if node.node is not None else "node ?"
        rows.append(
            (
                name,
                f"{', '.join(node.hosts) or 'host unknown'}: ranks "
                f"{', '.join(map(str, node.ranks))}",
            )
        )
    if layout.partial:
        lost = [f"rank {r} missing (no records)" for r in layout.missing]
        for rank, step in layout.incomplete.items():
            on = layout.node_of(rank)
            stopped = f"at step {step}" if step is not None else "before its first snapshot"
            lost.append(
                f"rank {rank} stopped {stopped}" + (f" (node {on})" if on is not None else "")
            )
        rows.append(("partial", "; ".join(lost)))
    return rows


def _replicas_line(drift: RankDrift, limit: int = 4) -> str:
    if drift.replicated == "none":
        return f"nothing replicated to compare (layout {safe_text(drift.layout)})"
    if drift.step is None:
        compared = f"{safe_text(drift.compared)} tensors compared across ranks"
        return f"[green]equal[/] at {len(drift.snapshots)} snapshots ({compared})"
    parts = [
        f"[bold]{safe_text(t.tensor)}[/] on rank {safe_text(', '.join(map(str, t.ranks)))}"
        for t in drift.tensors[:limit]
    ]
    more = f" and {len(drift.tensors) - limit} more" if len(drift.tensors) > limit else ""
    equal = (
        f"equal up to step {safe_text(drift.last_equal)}"
        if drift.last_equal is not None
        else "already at the first snapshot"
    )
    return f"[bold red]part at step {safe_text(drift.step)}[/] ({equal}): {'; '.join(parts)}{more}"


def _diff_table(title: str, diff: dict[str, list[Any]]) -> Table:
    table = Table(title=title, title_justify="left", show_header=True, header_style="bold")
    table.add_column("key")
    table.add_column("run A")
    table.add_column("run B")
    for key, (a, b) in diff.items():
        table.add_row(safe_text(key), safe_text(repr(a)), safe_text(repr(b)))
    return table


def _code_table(code: CodeDifference) -> Table:
    """A code file that differs: its path and hash in each run, and the first lines that differ
    (or why they are not shown)."""
    table = Table(title="code diff", title_justify="left", show_header=True, header_style="bold")
    for column in ("", "run A", "run B"):
        table.add_column(column)
    table.add_row("file", *(safe_text(path or "-") for path in code.path))
    table.add_row("sha256", *(safe_text(digest[:16]) for digest in code.sha256))
    found = code.first_lines
    if found is None:
        table.add_row("lines", safe_text(code.lines_unavailable or "-"), "")
        return table
    shown = [
        f"line {line}: " + safe_text("\n".join(text) or "(nothing)")
        for line, text in ((found.line[0], found.a), (found.line[1], found.b))
    ]
    table.add_row("first differing", *shown)
    return table


def _print_differences(differences: Differences, console: Console) -> None:
    """The config, environment and code differences, a table each where something differs."""
    if differences.config:
        console.print(_diff_table("config diff", differences.config))
    if differences.environment:
        console.print(_diff_table("environment diff", differences.environment))
    for code in differences.code:
        console.print(_code_table(code))


def verdict_where(
    verdict: Verdict, *, ranks: Sequence[RankResult] | None = None
) -> list[tuple[str, str]]:
    """Where a verdict places the divergence, as ``(label, value)`` pairs: ``("step", "14")``,
    ``("", "forward pass")``, ``("layer", "body.2")``, ... (the rank only when the comparison's
    ``ranks`` lists more than one)."""
    where = [("step", str(verdict.step))]
    if len(ranks or ()) > 1 and verdict.rank is not None:
        where.append(("rank", str(verdict.rank)))
    phase = verdict.phase
    if phase:
        where.append(("", f"{phase} pass" if phase not in ("init", "data") else str(phase)))
    where += [
        (key, str(found))
        for key, found in (("layer", verdict.layer), ("tensor", verdict.tensor), ("op", verdict.op))
        if found
    ]
    return where


def named_by(verdict: Verdict) -> list[str]:
    """What a verdict's cause names: its random streams, then its config and environment keys."""
    return [*verdict.rng, *verdict.config_keys, *verdict.environment_keys]


def plain_verdict(result: CompareResult) -> list[str]:
    """The verdict in plain lines with no markup: what the report says when rendering it fails."""
    verdict = result.verdict
    if result.identical or verdict is None:
        return ["The runs are identical at every common snapshot and step."]
    where = ", ".join(
        f"{label} {value}".strip() for label, value in verdict_where(verdict, ranks=result.ranks)
    )
    return [
        safe_text(f"The runs diverge at {where}."),
        safe_text(f"Cause: {cause_title(verdict.cause)} ({verdict.confidence.value})"),
        safe_text(f"{verdict.explanation}."),
        safe_text(f"Fix: {verdict.fix}"),
        *(safe_text(f"note: {note}") for note in result.notes),
    ]


def render_comparison(result: CompareResult, console: Console) -> None:
    """The human report: the verdict first, with its evidence, then the timeline."""
    verdict = result.verdict
    if result.identical:
        _print_identical(result, console)
    else:
        assert verdict is not None
        _print_verdict(verdict, result.ranks, console)
    _print_differences(result.differences, console)
    if verdict and verdict.max_abs_diff is not None:
        console.print(
            f"first divergent tensor [bold]{safe_text(verdict.tensor)}[/]: max |a-b| = "
            f"{verdict.max_abs_diff:.3g}, "
            f"max ULP distance = {verdict.max_ulp}, {100 * (verdict.fraction_differing or 0):.2f}% "
            "of elements differ"
        )
    if result.numerics is not None:
        style = "green" if result.numerics.rounding_only else "yellow"
        console.print(f"[bold]numerics:[/] [{style}]{safe_text(result.numerics.sentence)}[/]")
    if len(result.ranks) > 1:
        console.print(_ranks_table(result.ranks))
    console.print(_timeline_table(result.timeline, result.unused_streams))
    _print_replay(result.replay, console)
    if result.compile_bisect is not None:
        console.print(f"[bold]compiled:[/] {safe_text(result.compile_bisect.sentence())}")
    for note in result.notes:
        console.print(f"[yellow]note:[/] {safe_text(note)}")


def _print_identical(result: CompareResult, console: Console) -> None:
    from rich.panel import Panel

    console.print(
        Panel.fit(
            "[bold green]The runs are identical[/] at every common snapshot and step.\n"
            f"{safe_text(result.runs[0])}\n{safe_text(result.runs[1])}",
            title="verdict",
        )
    )


def _print_verdict(verdict: Verdict, ranks: list[RankResult], console: Console) -> None:
    """The verdict's panel: where, the cause and its confidence, the explanation, the fix; then
    its evidence."""
    from rich.panel import Panel

    where = [
        f"{label} [bold]{safe_text(value)}[/]" if label else safe_text(value)
        for label, value in verdict_where(verdict, ranks=ranks)
    ]
    named = [safe_text(name) for name in named_by(verdict)]
    confidence = verdict.confidence.value
    style = {"proven": "green", "inferred": "yellow", "unexplained": "red"}.get(
        confidence, "yellow"
    )
    lines = [
        f"[bold red]The runs diverge[/] at {', '.join(where)}.",
        f"Cause: [bold]{safe_text(cause_title(verdict.cause))}[/]"
        + (f" ({', '.join(named)})" if named else "")
        + f"  [{style}]{safe_text(confidence)}[/]",
        f"{safe_text(verdict.explanation)}.",
        f"[bold green]Fix:[/] {safe_text(verdict.fix)}",
    ]
    console.print(Panel("\n".join(lines), title="verdict", expand=False))
    if not verdict.evidence:
        return
    table = Table(title="evidence", title_justify="left", header_style="bold")
    for column in ("experiment", "on", "result", "what was seen"):
        table.add_column(column)
    marks = {"matches": "[green]matches[/]", "differs": "[red]differs[/]"}
    for item in verdict.evidence:
        outcome = marks.get(item.outcome.value) or safe_text(item.outcome.value)
        table.add_row(
            safe_text(item.label), safe_text(item.subject), outcome, safe_text(item.detail)
        )
    console.print(table)


def _print_replay(replay: ReplayInfo, console: Console) -> None:
    if not replay.performed:
        return
    summary, exact = replay_summary(replay)
    faithful = f"[{'green' if exact else 'yellow'}]{safe_text(summary)}[/]"
    if replay.from_step is None:
        console.print(f"replay: the code built again in fresh processes, {replay.seconds:.2f}s")
    else:
        steps = f"{replay.replayed_steps} step(s) in {replay.seconds:.2f}s"
        console.print(
            f"replay: from the checkpoint at step {replay.from_step}, {steps}; {faithful}"
        )


def replay_summary(replay: ReplayInfo) -> tuple[str, bool]:
    """How faithful a replay was, in words that agree with where it parted from its records, and
    whether it reproduced every step before the divergent one."""
    parted = ", ".join(f"run {p.run} at step {p.step}" for p in replay.parted)
    if not replay.faithful:
        return f"did not reproduce the records exactly ({parted or 'see the notes'})", False
    # only at the divergent step, whose cause (entropy) makes a replay differ from its record
    if parted:
        return (
            f"reproduced both runs' records before the divergent step (then {parted} parted from "
            "its records)",
            True,
        )
    return "reproduced both runs' records", True


def _ranks_table(ranks: list[RankResult]) -> Table:
    table = Table(title="ranks", title_justify="left", header_style="bold")
    nodes = any(entry.node is not None for entry in ranks)
    table.add_column("rank", justify="right")
    if nodes:
        table.add_column("node", justify="right")
    table.add_column("first difference in its records")
    table.add_column("role")
    table.add_column("cause")
    for entry in ranks:
        verdict = entry.verdict
        node = [safe_text(entry.node if entry.node is not None else "?")] if nodes else []
        if verdict is None:
            table.add_row(safe_text(entry.rank), *node, "[green]identical[/]", "-", "-")
        else:
            cells = (
                f"step {safe_text(verdict.step)}",
                safe_text(entry.role or "-"),
                safe_text(cause_title(verdict.cause)),
            )
            table.add_row(safe_text(entry.rank), *node, *cells)
    return table


def _timeline_table(rows: list[TimelineRow], unused: Sequence[str] = ()) -> Table:
    """The snapshot timeline, condensed around the first divergence; a row says how many snapshots
    it leaves out. A stream nothing drew from is shown dim, as ``(unused)``: it differs, but cannot
    matter."""
    table = Table(title="snapshot timeline", title_justify="left", header_style="bold")
    table.add_column("step", justify="right")
    table.add_column("tensors")
    table.add_column("random streams that differ")
    if not rows:  # models of another structure, say: nothing was compared snapshot by snapshot
        table.add_row("-", "[dim]no snapshots compared[/]", "-")
    for row in _condensed(rows):
        if isinstance(row, int):
            table.add_row("…", f"[dim]… {row} snapshot{'s' if row != 1 else ''} not shown …[/]", "")
            continue
        first = safe_text(row.first_tensor)
        state = (
            "[green]equal[/]"
            if row.equal
            else f"[red]{safe_text(row.differing_tensors)} differ[/] (first: {first})"
        )
        streams = [
            f"[dim]{safe_text(s)} (unused)[/]" if s in unused else safe_text(s)
            for s in map(str, row.streams)
        ]
        table.add_row(safe_text(row.step), state, ", ".join(streams) or "-")
    return table


def _condensed(rows: list[TimelineRow], keep: int = 4) -> list[TimelineRow | int]:
    """The timeline around the first divergence, not every snapshot of a long run: the first row,
    ``keep`` rows either side of the first that differs (else of the last) and the last; an ``int``
    in their place counts the rows left out there."""
    if not rows:
        return []
    first = next((i for i, row in enumerate(rows) if not row.equal), len(rows) - 1)
    chosen = sorted({0, *range(max(0, first - keep), min(len(rows), first + keep)), len(rows) - 1})
    condensed: list[TimelineRow | int] = []
    for before, index in zip([-1, *chosen[:-1]], chosen, strict=True):
        if index - before > 1:
            condensed.append(index - before - 1)
        condensed.append(rows[index])
    return condensed


_SEVERITY_STYLES = {"error": "bold red", "warning": "bold yellow", "info": "bold blue"}


def render_doctor(report: DoctorReport, console: Console) -> None:
    """Verdict first, then each finding with its evidence and fix."""
    from rich.panel import Panel

    findings = report.findings
    counts = {s: sum(f.severity == s for f in findings) for s in SEVERITIES}
    tally = (
        ", ".join(f"{n} {s}{'s' if n != 1 else ''}" for s, n in counts.items() if n)
        or "no findings"
    )
    subject = safe_text(report.target) if report.target else "this environment"
    if report.target is None:
        headline = (
            f"[bold green]Nothing in this environment alone makes runs irreproducible[/] ({tally})."
        )
    elif report.reproducible:
        headline = f"[bold green]Reproducible on this machine[/] ({tally})."
    else:
        headline = f"[bold red]Not reproducible on this machine[/] ({tally})."
    note = (
        f"\n{subject}"
        + (f", {report.steps} step(s) checked" if report.target else "")
        + f", {report.seconds:.1f}s"
    )
    console.print(Panel(headline + note, title="doctor", expand=False))
    for finding in findings:
        where = safe_text(
            ", ".join(
                x
                for x in (f"layer {finding.layer}" if finding.layer else "", finding.op or "")
                if x
            )
        )
        style = _SEVERITY_STYLES[finding.severity]
        title = (
            f"[{style}]{safe_text(finding.severity.value.upper())}[/] "
            f"[bold]{safe_text(finding.id)}[/]"
        )
        console.print("\n" + title + (f"  ({where})" if where else ""))
        console.print(f"  {safe_text(finding.evidence)}", highlight=False)
        console.print(f"  [bold green]Fix:[/] {safe_text(finding.fix)}", highlight=False)
    for line in report.notes:
        console.print(f"[yellow]note:[/] {safe_text(line)}", highlight=False)
