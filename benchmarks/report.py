"""The results as Markdown: the machine, then one table per benchmark, each with when it was
measured."""

from __future__ import annotations

from typing import Any

__all__ = ["markdown"]


def _format(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _table(rows: list[dict[str, Any]]) -> list[str]:
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_format(row.get(c, "")) for c in columns) + " |" for row in rows]
    return lines


def _loads(values: Any) -> str:
    return "n/a" if values is None else ", ".join(f"{v:.2f}" for v in values)


def _measured(section: dict[str, Any]) -> list[str]:
    """One line on when a section was measured and the load around it."""
    m = section.get("measured")
    if m is None:
        return []
    return [
        "",
        f"Measured {m['date']} at {m['commit']} in {m['seconds']:.0f} s; load average "
        f"{_loads(m['load average at start'])}"
        f" at start, {_loads(m['load average at end'])} at end; CPU pressure at start "
        f"`{m['cpu pressure at start']}`.",
    ]


def _section(
    title: str, intro: str, section: dict[str, Any], rows: list[dict[str, Any]]
) -> list[str]:
    """One benchmark's part of the page: its heading, what it measured, when, and its table."""
    return ["", f"## {title}", "", intro, *_measured(section), "", *_table(rows)]


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        "# bisect-repro benchmarks",
        "",
        f"Last run {m['date']} on {m['cpu']} ({m['cpu cores']} cores, {m['memory GiB']} GiB), "
        f"device `{m['device']}`"
        + (f" ({m['gpu']}, CUDA {m['cuda']})" if "gpu" in m else "")
        + f"; Python {m['python']}, torch {m['torch']}, NumPy {m['numpy']}, bisect-repro "
        f"{m['bisect-repro']}"
        + (f" at {m['commit']}" if m["commit"] else "")
        + f", triton {m['triton']}, xxhash {m['xxhash']}; {m['torch threads']} torch threads;"
        + f" load average at start {_loads(m['load average at start'])}, at end "
        f"{_loads(m.get('load average at end'))};"
        + f" CPU pressure (`/proc/pressure/cpu`) at start `{m['cpu pressure at start']}`, at end "
        f"`{m.get('cpu pressure at end')}`."
        + " A load above the core count means other work shared the machine and slowed both sides "
        "of each ratio.",
        "",
        "Every figure is the median of repeated runs; each ratio compares figures from the same "
        "run.",
        "Each section says when it was measured and the load around it (sections may come from "
        "separate runs).",
    ]
    hashed = results.get("hash")
    if hashed is not None:
        intro = (
            "`read ceiling x.sum()` reads each byte once, which a hash must also do: the "
            "physical limit."
        )
        intro += f" The hash ran on: {hashed['path']}." if "path" in hashed else ""
        lines += _section("Hash throughput (GB/s)", intro, hashed, hashed["rows"])
    small = results.get("small")
    if small is not None:
        intro = (
            f"{small['tensors']:,} tensors of {small['bytes each'] // 1024} KiB "
            f"({small['tensors'] * small['bytes each'] / 1e6:.1f} MB);"
            f" the hash ran on: {small['path']}."
        )
        lines += _section("Many small tensors", intro, small, small["rows"])
    for key, title in (
        ("overhead_mlp", "Recording overhead, MLP"),
        ("overhead_cnn", "Recording overhead, CNN example"),
        ("overhead_cnn2m", "Recording overhead, 2.1M-parameter CNN, whole process"),
        (
            "overhead_gpt",
            "Recording overhead, GPT-style transformer, bf16 autocast and AdamW, whole process",
        ),
    ):
        section = results.get(key)
        if section is None:
            continue
        if "skipped" in section:
            lines += ["", f"## {title}", "", f"Skipped: {section['skipped']}."]
            continue
        runs = section["rows"][0]["runs"]
        if "steps timed per run" in section:  # per step, in this process
            intro = (
                f"{section['parameters']:,} parameters; a checkpoint every "
                f"{section['checkpoint_every']} steps;"
                f" mean step time over {section['steps timed per run']} steps, median of {runs} "
                "runs."
            )
        else:  # whole processes
            intro = (
                f"{section['parameters']:,} parameters; {section['steps']} steps in a fresh "
                "process per run, a checkpoint every"
                f" {section['checkpoint_every']} steps; the loop's time runs from the built "
                "trainee to the last write, the process's"
                f" adds the interpreter's start, the imports and the build; {runs} rounds, each "
                "running every configuration"
                " once, in a rotating order; each overhead is the median over rounds of the "
                "round's own ratio to its plain loop."
            )
            if "base" in section:
                intro += (
                    f" Rows marked `base`: the recorder of commit {section['base']}, in the "
                    "same rounds."
                )
        lines += _section(title, intro, section, section["rows"])
    storage = results.get("storage")
    if storage is not None:
        lines += _section(
            "Storage", f"MLP, {storage['parameters']:,} parameters, Adam.", storage, storage["rows"]
        )
    compare = results.get("compare")
    if compare is not None:
        shown = {k: v for k, v in compare.items() if k not in ("note", "measured")}
        lines += _section("Compare cost", f"{compare['note']}.", compare, [shown])
    lines.append("")
    return "\n".join(lines)
