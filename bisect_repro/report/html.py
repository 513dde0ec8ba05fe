"""The HTML report of ``compare --html`` and ``show --html``: one self-contained file, verdict
first.

:func:`comparison_html` renders a :class:`~bisect_repro.diagnose.compare.verdict.CompareResult` and
:func:`summary_html` a :class:`~bisect_repro.diagnose.show.summary.RunSummary`, each with the runs'
logged losses (``Run.losses()``). They are pure functions from those objects to a string: they read
no file and run nothing. Reading the losses and writing the file is :func:`run_losses` and
:func:`write_html`.

The guarantee: the page holds the same facts as ``--json`` (the verdict with its cause,
confidence, explanation, fix and evidence; the snapshot timeline by layer and random stream; the
first divergent tensor's difference; the ops around the first divergent op; the config,
environment and code diffs; the replay; the notes; per-rank rows when the object has ``ranks``),
plus the loss curves. Every string from the object or a run (paths, names, values, explanations) is
escaped, nothing is loaded from the network and no script runs in it. Its size is bounded by the
charts' limits, not the run's length: a 10,000-step run gives a report of a few hundred KB.

Where the guarantees stop: the loss curves are downsampled (each bucket's minimum and maximum);
a timeline longer than the heatmap's columns is shown in groups of snapshots (a group shows its
largest count), and layers past the row limit are added into one row; the page shows the losses
as logged, and a loss never fetched (an incomplete run) is simply absent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..diagnose.compare.causes.registry import cause_title
from ..diagnose.compare.differences import CodeDifference
from ..diagnose.compare.verdict import SCHEMA as COMPARE_SCHEMA
from ..diagnose.compare.verdict import CompareResult, OpContext, RankResult, TimelineRow, Verdict
from ..diagnose.show.summary import SCHEMA as SHOW_SCHEMA
from ..diagnose.show.summary import RunSummary
from ..errors import BisectReproError
from ..store.run import Run
from ..version import __version__
from .numerics_html import numerics_section
from .page import badge, document, esc, key_values, section, table, value
from .svg import Cell, Series, bars, downsample, heatmap, line_chart
from .text import named_by, replay_summary, verdict_where

__all__ = ["check_html_path", "comparison_html", "run_losses", "summary_html", "write_html"]

Losses = Mapping[int, float | None]

BUCKETS = 600
"""Loss-curve buckets: each keeps its minimum and maximum, so a curve has at most 1,202 points."""
MAX_COLUMNS = 60
"""Heatmap columns; more snapshots are grouped."""
MAX_ROWS = 30
"""Heatmap layer rows; the rest are added into one row."""


def run_losses(paths: Sequence[str | Path]) -> list[dict[int, float | None]]:
    """Each run's logged losses, read (and validated) by :class:`Run`."""
    return [Run.open(path).losses() for path in paths]


def check_html_path(path: Path) -> None:
    """Refuse, before any work, a report path that cannot be written: its folder missing, or a
    folder itself."""
    if path.is_dir():
        raise BisectReproError(
            f"{path}: is a folder; give a file name for the report, such as {path / 'report.html'}"
        )
    if not path.parent.is_dir():
        raise BisectReproError(
            f"{path}: the folder {path.parent} does not exist; create it or give another path for "
            "the report"
        )


def write_html(path: Path, text: str) -> None:
    check_html_path(path)
    try:
        path.write_text(text, encoding="utf-8", errors="backslashreplace")
    except OSError as error:
        raise BisectReproError(
            f"{path}: cannot write the report ({error.strerror or error}); give another path"
        ) from None


def _bytes(count: Any) -> str:
    return f"{count:,} bytes" if isinstance(count, int) else value(count)


def _span(steps: Sequence[Any]) -> str:
    """``, at steps 0 to 1000`` for a list of steps."""
    return (
        f", at steps {value(steps[0])} to {value(steps[-1])}"
        if len(steps) > 1
        else f", at step {value(steps[0])}"
        if steps
        else ""
    )


def _a_float(item: Any) -> bool:
    """Whether ``item`` is a number that is a finite float (an integer past the floats is not)."""
    if isinstance(item, bool) or not isinstance(item, (int, float)):
        return False
    try:
        return math.isfinite(float(item))
    except OverflowError:
        return False


def _finite(losses: Losses) -> tuple[list[tuple[int, float]], int]:
    """The finite losses in step order, and how many were missing or not finite."""
    points = [
        (int(step), float(loss))
        for step, loss in sorted(losses.items())
        if loss is not None and _a_float(loss)
    ]
    return points, len(losses) - len(points)


def _loss_charts(
    losses: Sequence[Losses], labels: Sequence[str], markers: Sequence[tuple[int, str]]
) -> str:
    curves = [_finite(run) for run in losses]
    series = [
        Series(label, css, downsample(points, BUCKETS))
        for (points, _), label, css in zip(curves, labels, "ab", strict=False)
    ]
    values = [v for points, _ in curves for _, v in points]
    steps = [step for points, _ in curves for step, _ in points]
    log_y = bool(values) and min(values) > 0 and max(values) / min(values) > 100
    legend = "".join(f'<span><i class="{s.css}"></i>{esc(s.label)}</span>' for s in series)
    span = (min(steps), max(steps)) if steps else None
    out = f'<div class="legend">{legend}</div>' + line_chart(
        series, title="loss by step", markers=markers, x_range=span, log_y=log_y
    )
    skipped = [
        f"{label}: {n} step(s) without a finite loss"
        for (_, n), label in zip(curves, labels, strict=False)
        if n
    ]
    if len(curves) == 2:
        b = dict(curves[1][0])
        gaps = [(step, abs(v - b[step])) for step, v in curves[0][0] if step in b]
        differing = [(step, gap) for step, gap in gaps if gap > 0]
        if differing:
            chart = line_chart(
                [Series("|loss A - loss B|", "diff", downsample(differing, BUCKETS))],
                title="|A - B|",
                markers=markers,
                x_range=span,
                log_y=True,
                height=170,
            )
            equal = len(gaps) - len(differing)
            out += (
                '<p class="small muted">|loss A &minus; loss B| (log scale), at the '
                f"{len(differing)} step(s) where the losses differ; "
            )
            out += f"equal at {equal} step(s).</p>"
            out += chart
        elif gaps:
            out += (
                f'<p class="small muted">The losses are equal at all {len(gaps)} step(s) both '
                "runs logged.</p>"
            )
    if skipped:
        out += '<p class="small muted">' + esc("; ".join(skipped)) + " (not drawn).</p>"
    return out


def _code(text: str) -> str:
    return f"<code>{esc(text)}</code>"


def _verdict(result: CompareResult) -> str:
    verdict = result.verdict
    if result.identical:
        body = (
            '<p class="headline good">The runs are identical at every common snapshot and step.</p>'
        )
        return section("", body, css="verdict good")
    if verdict is None:
        return section(
            "",
            '<p class="headline bad">The runs differ; the comparison gave no verdict.</p>',
            css="verdict bad",
        )
    where = ", ".join(
        f"{esc(label)} <b>{esc(v)}</b>" if label else esc(v)
        for label, v in verdict_where(verdict, ranks=result.ranks)
    )
    named = named_by(verdict)
    body = f'<p class="headline bad">The runs diverge at {where}.</p>'
    body += f'<p class="cause">Cause: <b>{esc(cause_title(verdict.cause))}</b>'
    body += (
        f" ({esc(', '.join(named))})" if named else ""
    ) + f" {badge(verdict.confidence.value)}</p>"
    explanation = verdict.explanation.rstrip(".")
    body += f"<p>{esc(explanation[:1].upper() + explanation[1:])}.</p>" if explanation else ""
    body += f'<div class="fix"><b>Fix:</b> {esc(verdict.fix)}</div>' if verdict.fix else ""
    if verdict.reseeded:
        items = "".join(
            f"<li>{c.describe(_code)}{f' ({esc(c.stream)})' if c.stream else ''}</li>"
            for c in verdict.reseeded
        )
        body += f"<p>Reseeded from entropy during the step:</p><ul>{items}</ul>"
    if verdict.evidence:
        rows = [
            [esc(e.label), esc(e.subject), badge(e.outcome.value), esc(e.detail)]
            for e in verdict.evidence
        ]
        body += "<h2>Evidence</h2>" + table(["experiment", "on", "result", "what was seen"], rows)
    return section("", body, css="verdict bad")


def _run_names(runs: Sequence[Any]) -> str:
    return "".join(
        f'<p class="runs"><b class="{css}">run {css.upper()}</b> <span '
        f'class="mono">{esc(run)}</span></p>'
        for run, css in zip(runs, "ab", strict=False)
    )


def _group(steps: Sequence[int]) -> list[list[int]]:
    """Snapshot indices in at most ``MAX_COLUMNS`` consecutive groups."""
    size = max(1, math.ceil(len(steps) / MAX_COLUMNS))
    return [list(range(i, min(i + size, len(steps)))) for i in range(0, len(steps), size)]


def _column(steps: Sequence[int], group: Sequence[int]) -> str:
    first, last = steps[group[0]], steps[group[-1]]
    return str(first) if first == last else f"{first}-{last}"


def _row(
    label: str,
    values: Sequence[int | None],
    steps: Sequence[int],
    groups: Sequence[Sequence[int]],
    unit: str,
    *,
    muted: bool = False,
) -> tuple[str, list[Cell]]:
    """One heatmap row: per group of snapshots the largest value (``None``: no snapshot), with a
    tooltip.

    ``unit`` names what is counted (``differing tensor(s)``); without one a value is a yes or no (a
    stream differs).
    """
    cells = []
    for group in groups:
        seen = [value for value in (values[i] for i in group) if value is not None]
        n = max(seen) if seen else None
        what = (
            "no snapshot"
            if n is None
            else f"{n} {unit}"
            if unit
            else ("differs, unused" if muted else "differs")
            if n
            else "equal"
        )
        cells.append(
            Cell(
                n,
                f"{'step' if len(group) == 1 else 'steps'} {_column(steps, group)}, {label}: "
                f"{what}",
                muted=muted,
            )
        )
    return label, cells


def _count(item: Any) -> int:
    return int(item) if isinstance(item, (int, float)) else 0


def _timeline(timeline: Sequence[TimelineRow], unused: Sequence[str] = ()) -> str:
    title = "Snapshot timeline"
    if not timeline:
        return section(title, '<p class="muted">No common snapshots.</p>')
    steps = [row.step for row in timeline]
    groups = _group(steps)
    layers = [row.layers for row in timeline]
    # by the snapshot where each first differs
    order = list(dict.fromkeys(name for found in layers for name in found))
    unit = "differing tensor(s)"
    rows = [_row("all tensors", [row.differing_tensors for row in timeline], steps, groups, unit)]
    rows += [
        _row(
            name or "(the model itself)",
            [_count(found.get(name)) for found in layers],
            steps,
            groups,
            unit,
        )
        for name in order[:MAX_ROWS]
    ]
    rest = order[MAX_ROWS:]
    if rest:
        rows.append(
            _row(
                f"{len(rest)} more layers",
                [sum(_count(found.get(n)) for n in rest) for found in layers],
                steps,
                groups,
                unit,
            )
        )
    differ = [{str(s) for s in row.streams} for row in timeline]
    streams = sorted(set().union(*differ))
    for name in streams:
        label = f"stream {name} (differs, unused)" if name in unused else f"stream {name}"
        rows.append(
            _row(
                label,
                [int(name in found) for found in differ],
                steps,
                groups,
                "",
                muted=name in unused,
            )
        )
    if not streams:
        rows.append(_row("random streams", [0] * len(timeline), steps, groups, ""))
    first = next(
        (j for j, group in enumerate(groups) if any(not timeline[i].equal for i in group)), None
    )
    grouped = (
        f" Each column groups {len(groups[0])} snapshots and shows the largest count."
        if len(groups[0]) > 1
        else ""
    )
    outlined = " The outlined column is the first divergent snapshot." if first is not None else ""
    legend = (
        '<span class="legend"><span><i class="eq"></i>equal</span><span><i class="ne"></i>differ '
        "(darker: more tensors)</span>"
        '<span><i class="muted"></i>differs, but nothing drew from it</span></span>'
    )
    note = (
        f'<p class="small muted">{legend}Rows: differing tensors in all, by layer, then the '
        "random streams; columns: snapshots by step."
    )
    note += esc(grouped + outlined) + "</p>"
    columns = [_column(steps, group) for group in groups]
    return section(
        title,
        heatmap(rows, columns, title="differing tensors by layer and snapshot", highlight=first)
        + note,
    )


def _difference(verdict: Verdict | None) -> str:
    if verdict is None or all(
        x is None
        for x in (
            verdict.max_abs_diff,
            verdict.max_ulp,
            verdict.fraction_differing,
            verdict.histogram,
        )
    ):
        return ""
    fraction = verdict.fraction_differing
    shown = f"{100 * fraction:.4g}%" if isinstance(fraction, (int, float)) else value(fraction)
    body = key_values(
        [
            ("tensor", f"<code>{esc(verdict.tensor)}</code>"),
            ("max |a - b|", value(verdict.max_abs_diff)),
            ("max ULP distance", value(verdict.max_ulp)),
            ("elements that differ", esc(shown)),
        ]
    )
    histogram = verdict.histogram
    if isinstance(histogram, Mapping) and histogram:
        counts = []
        for key, count in histogram.items():
            try:
                counts.append((float(key), str(key), int(count)))
            except (TypeError, ValueError, OverflowError):
                continue
        body += (
            '<p class="small muted">|a &minus; b| over the differing elements, by power of ten:</p>'
        )
        body += bars(
            [(label, count) for _, label, count in sorted(counts)], title="histogram of |a - b|"
        )
    return section("First divergent tensor", body)


def _ops(ops: Sequence[OpContext]) -> str:
    if not ops:
        return ""

    def equal(flag: bool) -> str:
        return badge("equal") if flag else badge("differ")

    rows = [
        [
            value(o.index),
            f"<code>{esc(o.op)}</code>",
            value(o.layer),
            value(o.phase),
            equal(o.inputs_equal),
            equal(o.outputs_equal),
        ]
        for o in ops
    ]
    css = ["first" if o.first else "" for o in ops]
    note = (
        '<p class="small muted">In run A\'s order; the highlighted op is the first whose '
        "outputs differ.</p>"
    )
    return section(
        "Ops around the first divergent op",
        note + table(["#", "op", "layer", "phase", "inputs", "outputs"], rows, row_css=css),
    )


def _diffs(result: CompareResult) -> str:
    """The config and environment diffs (``{key: [a, b]}``, ``None`` for a key one run does not
    set), and each code file that differs."""

    def side(pair: Any, i: int) -> str:
        found = pair[i] if isinstance(pair, list) and len(pair) > i else None
        return '<span class="muted">not set</span>' if found is None else value(found)

    differences = result.differences
    out = ""
    for title, diff in (
        ("Config diff", differences.config),
        ("Environment diff", differences.environment),
    ):
        if diff:
            out += section(
                title,
                table(
                    ["key", "run A", "run B"],
                    [[f"<code>{esc(k)}</code>", side(v, 0), side(v, 1)] for k, v in diff.items()],
                ),
            )
    for code in differences.code:
        out += section("Code diff", table(["", "run A", "run B"], _code_rows(code)))
    return out


def _code_rows(code: CodeDifference) -> list[list[str]]:
    """A code file's path and hash in each run, and the first lines that differ (or why not)."""
    rows = [
        ["file", *(_code(path or "-") for path in code.path)],
        ["sha256", *(_code(digest) for digest in code.sha256)],
    ]
    found = code.first_lines
    if found is None:
        return [*rows, ["lines", esc(code.lines_unavailable or "-"), ""]]
    shown = [
        f"line {value(line)}: <pre>{esc(chr(10).join(text) or '(nothing)')}</pre>"
        for line, text in ((found.line[0], found.a), (found.line[1], found.b))
    ]
    return [*rows, ["first differing", *shown]]


def _replay(result: CompareResult) -> str:
    replay = result.replay
    pairs: list[tuple[str, str]] = []
    if replay.performed:
        if replay.from_step is None:
            pairs.append(
                ("replay", f"the code built again in fresh processes, {value(replay.seconds)} s")
            )
        else:
            summary, exact = replay_summary(replay)
            faithful = badge(summary, "equal" if exact else "inconclusive")
            steps = f"{value(replay.replayed_steps)} step(s) in {value(replay.seconds)} s"
            pairs.append(
                (
                    "replay",
                    f"from the checkpoint at step {value(replay.from_step)}, {steps} {faithful}",
                )
            )
        for label, command in zip(("run A", "run B"), replay.commands, strict=False):
            pairs.append((f"{label} replayed by", f"<code>{esc(command)}</code>"))
        for parted in replay.parted:
            pairs.append(
                (
                    "parted from its records",
                    f"run {esc(parted.run)} at step {value(parted.step)}: {esc(parted.what)}",
                )
            )
    else:
        pairs.append(("replay", "none: the verdict is from the records alone"))
    pairs.append(("last equal snapshot", value(result.snapshots.get("last_equal"))))
    pairs.append(("first divergent snapshot", value(result.snapshots.get("first_divergent"))))
    logs = result.first_log_difference
    pairs += [
        (f"logged {key} first differs at step", value(logs.get(key)))
        for key in ("order", "batch", "loss")
        if key in logs
    ]
    body = key_values(pairs)
    if result.compile_bisect is not None:
        body += f"<h2>Compiled against eager</h2><p>{esc(result.compile_bisect.sentence())}</p>"
    if result.notes:
        body += "<h2>Notes</h2><ul>" + "".join(f"<li>{esc(n)}</li>" for n in result.notes) + "</ul>"
    return section("Replay", body)


def _ranks(ranks: Sequence[RankResult]) -> str:
    if not ranks:
        return ""
    rows = []
    for item in ranks:
        verdict = item.verdict
        if verdict is not None:
            where = ", ".join(
                f"{label} {v}" if label else v
                for label, v in verdict_where(verdict)
                if label != "rank"
            )
            rows.append(
                [
                    value(item.rank),
                    badge("differs"),
                    esc(where),
                    esc(cause_title(verdict.cause)),
                    badge(verdict.confidence.value),
                ]
            )
        else:
            rows.append([value(item.rank), badge("equal"), "identical", "-", "-"])
    body = table(["rank", "", "first divergence", "cause", "confidence"], rows)
    steps = sorted({row.step for item in ranks for row in item.timeline})
    if steps:
        groups = _group(steps)
        grid = []
        for item in ranks:
            by_step: dict[int, int | None] = {
                row.step: row.differing_tensors for row in item.timeline
            }
            grid.append(
                _row(
                    f"rank {item.rank}",
                    [by_step.get(step) for step in steps],
                    steps,
                    groups,
                    "differing tensor(s)",
                )
            )
        body += heatmap(
            grid,
            [_column(steps, g) for g in groups],
            title="differing tensors by rank and snapshot",
        )
    return section("Ranks", body)


def comparison_html(result: CompareResult, losses: Sequence[Losses] = ()) -> str:
    """The report of one comparison, with ``losses`` each run's ``Run.losses()``."""
    verdict = result.verdict
    markers: list[tuple[int, str]] = []
    if verdict is not None and verdict.step >= 0:
        markers.append((verdict.step, f"diverges at step {verdict.step}"))
    loss_step = result.first_log_difference.get("loss")
    if isinstance(loss_step, int) and not (markers and markers[0][0] == loss_step):
        markers.append((loss_step, f"losses differ from step {loss_step}"))
    curves = section("Loss", _loss_charts(losses, ["run A", "run B"], markers)) if losses else ""
    runs = result.runs
    title = "bisect-repro compare: " + " vs ".join(str(r) for r in runs)
    heading = "<h1>bisect-repro compare</h1>" + _run_names(runs)
    body = (
        heading
        + _verdict(result)
        + numerics_section(result.numerics)
        + _ranks(result.ranks)
        + curves
    )
    body += _timeline(result.timeline, result.unused_streams)
    body += _difference(verdict) + _ops(result.ops_context) + _diffs(result) + _replay(result)
    return document(title, body, footer=f"bisect-repro {__version__}, {COMPARE_SCHEMA}")


def _what_ran(summary: RunSummary) -> list[tuple[str, str]]:
    """A recipe's target, or a script's command, working directory and file with its hash."""
    if summary.command is None:
        return [("target", f"<code>{esc(summary.target)}</code>")]
    return [
        ("command", f"<code>{esc(summary.command)}</code>"),
        ("directory", f"<code>{esc(summary.cwd)}</code>"),
        ("script", f"<code>{esc(summary.script)}</code> (sha256 {esc(summary.script_sha256)})"),
    ]


def summary_html(summary: RunSummary, losses: Losses) -> str:
    """The report of one run, with ``losses`` its ``Run.losses()``."""
    status = (
        badge("complete")
        if summary.complete
        else badge(f"incomplete: last complete step {summary.last_step}", "incomplete")
    )
    options = summary.options
    snapshots, checkpoints = summary.snapshots, summary.checkpoints
    pairs = [
        *_what_ran(summary),
        ("config", esc(", ".join(f"{k}={v!r}" for k, v in summary.config.items()) or "-")),
        (
            "options",
            esc(", ".join(f"{k}={options.get(k)}" for k in ("steps", "every", "checkpoint_every"))),
        ),
        ("steps logged", value(summary.steps_logged)),
        ("snapshots", f"{len(snapshots)}{_span(snapshots)} ({_bytes(summary.snapshot_bytes)})"),
        (
            "checkpoints",
            f"{len(checkpoints)}{_span(checkpoints)} ({_bytes(summary.checkpoint_bytes)})",
        ),
        ("tensors hashed", value(summary.tensors_hashed)),
        ("random streams", esc(", ".join(map(str, summary.streams)))),
        ("loss", f"first {value(summary.first_loss)}, last {value(summary.last_loss)}"),
        ("model", value(summary.model)),
        ("loader", value(summary.loader)),
    ]
    title = f"bisect-repro show: {summary.path}"
    body = f"<h1>{esc(title)} {status}</h1>" + section("Run", key_values(pairs))
    body += section("Loss", _loss_charts([losses], ["loss"], []))
    environment = summary.environment
    if environment:
        body += section(
            "Environment",
            f"<details><summary>{len(environment)} "
            f"settings</summary>{key_values(environment)}</details>",
        )
    return document(title, body, footer=f"bisect-repro {__version__}, {SHOW_SCHEMA}")
