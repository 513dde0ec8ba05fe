"""SVG drawn as text for the HTML report: line charts, a heatmap, bars. No plotting library.

The guarantee: every function returns one ``<svg>`` element as a string, sized by its
``viewBox`` (it scales with the page), coloured only through CSS classes (so the page's light
and dark themes apply), with every label passed through :func:`html.escape`. Long series are
reduced with :func:`downsample` (the minimum and maximum of each bucket), so a chart's size is
bounded by its number of buckets, not by the length of the run; a heatmap by its row and
column limits.

Where the guarantees stop: a downsampled curve keeps each bucket's extremes, not every wiggle
between them; non-finite values (NaN, infinity) are left out of a chart (the caller says how
many); labels longer than the room for them are shortened, with the full text in the element's
``<title>`` (a tooltip in a browser, not in a screenshot or a printout).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..store.printable import html_text

__all__ = ["Cell", "Series", "bars", "downsample", "heatmap", "line_chart"]


def _e(value: object) -> str:
    return html_text(value)


def _n(value: float) -> str:
    """A coordinate, short."""
    return f"{value:.1f}".removesuffix(".0")


def _label(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1e5 or abs(value) < 1e-3:
        return f"{value:.0e}".replace("e+0", "e").replace("e-0", "e-").replace("e+", "e")
    return f"{value:.4g}"


def _open(css: str, width: float, height: float, title: str) -> str:
    """An ``<svg>`` start tag at its natural size (CSS shrinks it to fit), with its title."""
    size = f'width="{_n(width)}" height="{_n(height)}" viewBox="0 0 {_n(width)} {_n(height)}"'
    return f'<svg class="{css}" {size} role="img"><title>{_e(title)}</title>'


def _titled(element: str, attributes: str, tip: str, text: str = "") -> str:
    """An element with a tooltip (``<title>``), escaped."""
    return f"<{element} {attributes}>{_e(text)}<title>{_e(tip)}</title></{element}>"


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else "\u2026" + text[-(limit - 1) :]


def downsample(points: Sequence[tuple[int, float]], buckets: int) -> list[tuple[int, float]]:
    """At most ``2 * buckets + 2`` points, in order: the first, the minimum and the maximum of each
    run of consecutive points (``buckets`` runs), and the last."""
    if len(points) <= 2 * buckets + 2:
        return list(points)
    size = len(points) / buckets
    kept: list[int] = [0]
    for b in range(buckets):
        start, end = int(b * size), int((b + 1) * size)
        if end > start:
            chunk = range(start, end)
            kept += sorted(
                {min(chunk, key=lambda i: points[i][1]), max(chunk, key=lambda i: points[i][1])}
            )
    kept.append(len(points) - 1)
    return [points[i] for i in sorted(set(kept))]


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    if high <= low:
        return [low]
    raw = (high - low) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(int((high - first) / step + 1e-9) + 1)]


def _log_ticks(low: float, high: float) -> list[float]:
    """Ticks for a log scale between ``10**low`` and ``10**high``: powers of ten, at most about
    six."""
    powers = list(range(math.ceil(low), math.floor(high) + 1))
    if len(powers) < 2:
        return sorted({float(f"{10.0**t:.1g}") for t in _ticks(low, high, 3)})
    return [10.0**k for k in powers[:: math.ceil(len(powers) / 6)]]


@dataclass(frozen=True)
class Series:
    """One curve: its label, its CSS class (``a``, ``b``, ``diff``) and its ``(step, value)``
    points."""

    label: str
    css: str
    points: Sequence[tuple[int, float]]


def line_chart(
    series: Sequence[Series],
    *,
    title: str,
    markers: Sequence[tuple[int, str]] = (),
    x_range: tuple[int, int] | None = None,
    log_y: bool = False,
    width: int = 1000,
    height: int = 260,
) -> str:
    """Curves over steps, with vertical ``markers`` (step, label), over at least ``x_range``.

    Points must be finite (positive when ``log_y``).
    """
    left, right, top, bottom = 64, 16, 14, 34
    plot_w, plot_h = width - left - right, height - top - bottom
    every = [p for s in series for p in s.points]
    if not every:
        return _open("chart", width, 40, title) + '<text x="8" y="24">no values</text></svg>'
    steps = [p[0] for p in every] + [m[0] for m in markers] + list(x_range or ())
    x0, x1 = min(steps), max(steps)
    scale_y = (lambda v: math.log10(v)) if log_y else (lambda v: v)
    ys = [scale_y(p[1]) for p in every]
    y0, y1 = min(ys), max(ys)
    pad = (y1 - y0) * 0.06 or (abs(y0) * 0.1 or 1.0)
    y0, y1 = y0 - pad, y1 + pad

    def px(step: float) -> float:
        return left + (step - x0) / ((x1 - x0) or 1) * plot_w

    def py(value: float) -> float:
        return top + (1 - (scale_y(value) - y0) / (y1 - y0)) * plot_h

    out = [_open("chart", width, height, title)]
    out.append(f'<rect class="frame" x="{left}" y="{top}" width="{plot_w}" height="{plot_h}"/>')
    y_ticks = _log_ticks(y0, y1) if log_y else _ticks(y0, y1)
    for value in y_ticks:
        y = py(value)
        if not top - 0.5 <= y <= top + plot_h + 0.5:
            continue
        out.append(
            f'<line class="grid" x1="{left}" x2="{left + plot_w}" y1="{_n(y)}" y2="{_n(y)}"/>'
        )
        out.append(
            f'<text class="tick" x="{left - 6}" y="{_n(y + 4)}" '
            f'text-anchor="end">{_e(_label(value))}</text>'
        )
    for step in _ticks(x0, x1, 8):
        if step == int(step):
            x = px(step)
            out.append(
                f'<text class="tick" x="{_n(x)}" y="{top + plot_h + 16}" '
                f'text-anchor="middle">{int(step)}</text>'
            )
    out.append(
        f'<text class="tick" x="{left + plot_w}" y="{height - 2}" text-anchor="end">step</text>'
    )
    for s in series:
        points = " ".join(f"{_n(px(step))},{_n(py(value))}" for step, value in s.points)
        if len(s.points) == 1:
            step, value = s.points[0]
            out.append(
                _titled(
                    "circle",
                    f'class="dot {_e(s.css)}" cx="{_n(px(step))}" cy="{_n(py(value))}" r="3"',
                    s.label,
                )
            )
        else:
            out.append(_titled("polyline", f'class="line {_e(s.css)}" points="{points}"', s.label))
    for i, (step, label) in enumerate(markers):
        x = px(step)
        anchor = "end" if x > left + plot_w * 0.7 else "start"
        shift = -4 if anchor == "end" else 4
        out.append(
            f'<line class="marker m{i}" x1="{_n(x)}" x2="{_n(x)}" y1="{top}" y2="{top + plot_h}"/>'
        )
        out.append(
            f'<text class="marker-label m{i}" x="{_n(x + shift)}" y="{top + 12 + 14 * i}" '
            f'text-anchor="{anchor}">{_e(label)}</text>'
        )
    out.append("</svg>")
    return "".join(out)


@dataclass(frozen=True)
class Cell:
    """One heatmap cell: a count (0: equal; ``None``: no snapshot) and its tooltip."""

    value: int | None
    tip: str
    muted: bool = False
    """A difference that cannot matter (a stream nothing drew from): drawn grey, not red."""


def heatmap(
    rows: Sequence[tuple[str, Sequence[Cell]]],
    columns: Sequence[str],
    *,
    title: str,
    highlight: int | None = None,
) -> str:
    """Rows of cells over columns (snapshots); a cell's colour grows with its value relative to the
    largest.

    ``highlight`` outlines one column (the first divergent snapshot).
    """
    label_w = 14 + int(7.5 * min(30, max((len(name) for name, _ in rows), default=8)))
    # room for the column labels, slanted
    head = 22 + int(4.5 * min(12, max((len(c) for c in columns), default=1)))
    cell_w, cell_h = max(6, min(44, 720 // max(1, len(columns)))), 22
    width, height = label_w + cell_w * len(columns) + 24, head + cell_h * len(rows) + 6
    largest = max((c.value or 0 for _, cells in rows for c in cells), default=0) or 1
    out = [_open("heatmap", width, height, title)]
    label_every = math.ceil(30 / cell_w)
    for j, column in enumerate(columns):
        if j % label_every == 0 or j == highlight:
            x, y = _n(label_w + j * cell_w + cell_w / 2), head - 6
            out.append(
                f'<text class="tick" x="{x}" y="{y}" transform="rotate(-40 {x} '
                f'{y})">{_e(_shorten(column, 12))}</text>'
            )
    for i, (name, cells) in enumerate(rows):
        y = head + i * cell_h
        out.append(
            _titled(
                "text",
                f'class="row-label" x="{label_w - 6}" y="{y + 15}" text-anchor="end"',
                name,
                _shorten(name, 30),
            )
        )
        for j, cell in enumerate(cells):
            if cell.value is None:
                kind = "none"
            elif cell.value == 0:
                kind = "eq"
            elif cell.muted:
                kind = "muted"
            else:
                kind = f'ne" fill-opacity="{0.35 + 0.65 * min(cell.value, largest) / largest:.2f}'
            box = f'x="{label_w + j * cell_w}" y="{y}" width="{cell_w - 1}" height="{cell_h - 2}"'
            out.append(_titled("rect", f'class="cell {kind}" {box}', cell.tip))
    if highlight is not None and rows:
        left = label_w + highlight * cell_w
        out.append(
            f'<rect class="outline" x="{left - 1}" y="{head - 1}" width="{cell_w + 1}" '
            f'height="{cell_h * len(rows) + 1}"/>'
        )
    out.append("</svg>")
    return "".join(out)


def bars(
    counts: Sequence[tuple[str, int]], *, title: str, width: int = 520, height: int = 180
) -> str:
    """Vertical bars with their labels below and counts above, in the order given."""
    left, top, bottom = 8, 18, 30
    largest = max((c for _, c in counts), default=0) or 1
    slot = (width - 2 * left) / max(1, len(counts))
    plot_h = height - top - bottom
    out = [_open("bars", width, height, title)]
    for i, (label, count) in enumerate(counts):
        h = max(1.0, plot_h * count / largest) if count > 0 else 0.0
        x, y = left + i * slot + slot * 0.15, top + plot_h - h
        middle = _n(left + i * slot + slot / 2)
        out.append(
            _titled(
                "rect",
                f'class="bar" x="{_n(x)}" y="{_n(y)}" width="{_n(slot * 0.7)}" height="{_n(h)}"',
                f"{label}: {count}",
            )
        )
        out.append(
            f'<text class="tick" x="{middle}" y="{_n(y - 4)}" '
            f'text-anchor="middle">{_e(count)}</text>'
        )
        out.append(
            f'<text class="tick" x="{middle}" y="{height - 10}" '
            f'text-anchor="middle">{_e(label)}</text>'
        )
    out.append("</svg>")
    return "".join(out)
