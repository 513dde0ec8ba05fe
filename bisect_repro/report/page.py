"""The HTML page around a report: the stylesheet (light and dark), the document shell, small
elements.

The guarantee: :func:`document` returns one self-contained HTML file: inline CSS, inline SVG,
no script, nothing fetched (a ``Content-Security-Policy`` forbids loading anything, so a copy
opened as an e-mail attachment stays inert), and every helper here escapes what it is given.
Where the guarantees stop: a reader's browser decides the fonts and the theme
(``prefers-color-scheme``); printing uses the light theme.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from ..store.printable import html_text

__all__ = ["badge", "document", "esc", "key_values", "section", "table", "value"]

_CSS = """
:root { color-scheme: light dark;
  --bg: #f7f7f8; --card: #ffffff; --fg: #1d1f23; --muted: #5f6670; --line: #d8dbe0; --grid: #eceef1;
  --a: #2563eb; --b: #e0551f; --diff: #7c3aed; --ok: #17803d; --ok-soft: #d9f2e1; --bad: #c62828;
  --bad-soft: #fde2e1;
  --warn: #a15c00; --warn-soft: #fdf0d5; --none: #eceef1; --code: #f1f3f5; }
@media (prefers-color-scheme: dark) { :root {
  --bg: #15171b; --card: #1e2127; --fg: #e6e8eb; --muted: #9aa3ad; --line: #343a42; --grid: #2a2f36;
  --a: #6ea0ff; --b: #ff8a5c; --diff: #b794f6; --ok: #4ccf7a; --ok-soft: #1d3a28; --bad: #ff6b6b;
  --bad-soft: #45201f;
  --warn: #f3b44a; --warn-soft: #43351a; --none: #2a2f36; --code: #262a31; } }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--fg);
  font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
  }
main { max-width: 1080px; margin: 0 auto; padding: 20px 20px 40px; }
h1 { font-size: 1.35rem; margin: 0 0 4px; } h2 { font-size: 1.05rem; margin: 0 0 10px; }
section { background: var(--card); border: 1px solid var(--line); border-radius: 8px;
  padding: 16px 18px; margin: 14px 0; }
.runs { color: var(--muted); font-size: .9rem; margin: 0; }
.runs b.a { color: var(--a); } .runs b.b { color: var(--b); }
.headline { font-size: 1.15rem; font-weight: 600; margin: 0 0 6px; }
.headline.bad { color: var(--bad); } .headline.good { color: var(--ok); }
.verdict.bad { border-left: 5px solid var(--bad); }
  .verdict.good { border-left: 5px solid var(--ok); }
.cause { font-size: 1.05rem; margin: 4px 0; }
.fix { background: var(--ok-soft); border-radius: 6px; padding: 8px 12px; margin: 10px 0 4px; }
code, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
  font-size: .86em; }
code { background: var(--code); padding: 1px 4px; border-radius: 4px; overflow-wrap: anywhere; }
.badge { display: inline-block; padding: 1px 9px; border-radius: 999px; font-size: .8rem;
  font-weight: 600;
  vertical-align: 1px; border: 1px solid currentColor; white-space: nowrap; }
.badge.proven, .badge.matches, .badge.equal, .badge.complete { color: var(--ok);
  background: var(--ok-soft); }
.badge.inferred, .badge.inconclusive, .badge.incomplete { color: var(--warn);
  background: var(--warn-soft); }
.badge.unexplained, .badge.differs, .badge.differ { color: var(--bad); background: var(--bad-soft);
  }
table { border-collapse: collapse; width: 100%; font-size: .9rem; }
th, td { text-align: left; padding: 5px 8px; border-bottom: 1px solid var(--line);
  vertical-align: top; overflow-wrap: break-word; }
th { color: var(--muted); font-weight: 600; }
table.kv th { width: 15em; }
tr.first td { background: var(--bad-soft); font-weight: 600; }
.muted { color: var(--muted); } .small { font-size: .85rem; }
ul { margin: 6px 0; padding-left: 20px; }
details summary { cursor: pointer; color: var(--muted); margin-top: 8px; }
.legend span { margin-right: 16px; font-size: .88rem; }
.legend i { display: inline-block; width: 18px; height: 3px; vertical-align: middle;
  margin-right: 5px; }
.legend i.a { background: var(--a); } .legend i.b { background: var(--b); }
  .legend i.diff { background: var(--diff); }
.legend i.ne { background: var(--bad); height: 10px; }
.legend i.eq { background: var(--ok-soft); height: 10px; border: 1px solid var(--ok); }
.legend i.muted { background: var(--muted); opacity: 0.45; height: 10px; }
svg { max-width: 100%; height: auto; display: block; margin: 6px 0; }
svg text { fill: var(--muted); font-size: 11px; font-family: inherit; }
svg .frame { fill: none; stroke: var(--line); } svg .grid { stroke: var(--grid); }
svg .line { fill: none; stroke-width: 1.6; stroke-linejoin: round; }
svg .line.a { stroke: var(--a); } svg .line.b { stroke: var(--b); stroke-dasharray: 5 3; }
  svg .line.diff { stroke: var(--diff); }
svg .dot.a { fill: var(--a); } svg .dot.b { fill: var(--b); } svg .dot.diff { fill: var(--diff); }
svg .marker { stroke: var(--bad); stroke-width: 1.5; stroke-dasharray: 4 3; }
  svg .marker.m1 { stroke: var(--warn); }
svg .marker-label { fill: var(--bad); font-weight: 600; } svg .marker-label.m1 { fill: var(--warn);
  }
svg .cell.eq { fill: var(--ok-soft); } svg .cell.ne { fill: var(--bad); }
  svg .cell.none { fill: var(--none); }
svg .cell.muted { fill: var(--muted); fill-opacity: 0.45; }
svg .outline { fill: none; stroke: var(--fg); stroke-width: 1.5; }
svg .row-label { fill: var(--fg); font-size: 12.5px; } svg .bar { fill: var(--bad); }
footer { color: var(--muted); font-size: .8rem; text-align: center; }
@media print { section { break-inside: avoid; } }
"""

_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'none'; "
    "base-uri 'none'"
)


def esc(text: object) -> str:
    """Text for the page: :func:`bisect_repro.store.printable.html_text` (control, surrogate, format
    characters escaped)."""
    return html_text(text)


def value(item: Any) -> str:
    """Any JSON value, short and escaped: numbers to 4 significant digits, ``-`` for ``None``."""
    if item is None:
        return "-"
    if isinstance(item, bool):
        return "yes" if item else "no"
    if isinstance(item, float):
        return esc(f"{item:.4g}")
    if isinstance(item, (list, dict)):
        return esc(json.dumps(item, default=str))
    return esc(item)


def badge(text: str, kind: str | None = None) -> str:
    return f'<span class="badge {esc(kind or text)}">{esc(text)}</span>'


def section(title: str, body: str, *, css: str = "") -> str:
    return (
        f'<section class="{esc(css)}"><h2>{esc(title)}</h2>{body}</section>'
        if title
        else f'<section class="{esc(css)}">{body}</section>'
    )


def table(
    header: Iterable[str], rows: Iterable[Iterable[str]], *, row_css: Iterable[str] | None = None
) -> str:
    """A table; ``rows`` hold HTML already escaped (built with :func:`value`, :func:`esc`,
    :func:`badge`)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    classes = iter(row_css or ())
    body = "".join(
        f'<tr class="{esc(next(classes, ""))}">'
        + "".join(f"<td>{cell}</td>" for cell in row)
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def key_values(pairs: Mapping[str, Any] | Iterable[tuple[str, str]]) -> str:
    """Two columns: a label (escaped here) and HTML (escaped by the caller) or, for a mapping, any
    JSON value."""
    items = [(k, value(v)) for k, v in pairs.items()] if isinstance(pairs, Mapping) else list(pairs)
    return (
        '<table class="kv"><tbody>'
        + "".join(f"<tr><th>{esc(k)}</th><td>{v}</td></tr>" for k, v in items)
        + "</tbody></table>"
    )


def document(title: str, body: str, *, footer: str) -> str:
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_POLICY}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="color-scheme" content="light dark">'
        f"<title>{esc(title)}</title><style>{_CSS}</style></head>"
        f"<body><main>{body}<footer>{esc(footer)}</footer></main></body></html>\n"
    )
