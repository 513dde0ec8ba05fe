"""The HTML report: its content for diverged, identical, records-only and multi-rank comparisons,
its size, its safety.

``reseed.json`` and ``nondeterministic_op.json`` are real ``compare --json`` outputs (paths
shortened): ``examples/own_loop.py`` with ``--reseed-at 23``, and ``bisect-repro demo``.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bisect_repro import RecordOptions, record
from bisect_repro.cli import app
from bisect_repro.diagnose.compare.verdict import CompareResult
from bisect_repro.diagnose.show.summary import RunSummary, run_summary
from bisect_repro.record.recipe import build
from bisect_repro.report.html import comparison_html, summary_html
from bisect_repro.report.svg import downsample
from bisect_repro.store.run import Run

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent.parent / "examples"
runner = CliRunner()


def sample(name: str = "reseed") -> dict:
    return json.loads((HERE / f"{name}.json").read_text())


def report(result: dict, losses: list) -> str:
    """The page of a ``compare --json`` object, read back into a :class:`CompareResult`."""
    return comparison_html(CompareResult.from_json(result), losses)


def timeline_row(step: int, equal: bool, differing: int) -> dict:
    """A snapshot timeline row of the ``compare --json`` object."""
    return {
        "step": step,
        "equal": equal,
        "differing_tensors": differing,
        "first_tensor": None,
        "streams": [],
        "layers": {},
    }


def summary_of(**fields: object) -> RunSummary:
    """A run summary with nothing in it but ``fields``."""
    empty = {
        "path": "runs/a",
        "format": 1,
        "target": None,
        "config": {},
        "options": {},
        "recorded_by_you": False,
        "complete": True,
        "steps_logged": 0,
        "last_step": None,
        "snapshots": [],
        "checkpoints": [],
        "streams": [],
        "tensors_hashed": 0,
        "verified": None,
        "first_loss": None,
        "last_loss": None,
        "snapshot_bytes": 0,
        "checkpoint_bytes": 0,
        "model": {},
        "loader": {},
        "environment": {},
    }
    return RunSummary(**{**empty, **fields})


def losses(steps: int = 40, part_at: int | None = 23) -> list[dict[int, float | None]]:
    a = {s: 1.0 / (1 + s) for s in range(steps)}
    b = {s: v + (0.01 if part_at is not None and s >= part_at else 0.0) for s, v in a.items()}
    return [a, b]


def sections(page: str) -> dict[str, str]:
    """Each <section> by its heading (the verdict, which has none, as 'verdict')."""
    found = {}
    for chunk in page.split("<section")[1:]:
        heading = re.search(r"<h2>(.*?)</h2>", chunk)
        name = "verdict" if 'class="verdict' in chunk[:40] else heading.group(1) if heading else "?"
        found[name] = chunk.split("</section>")[0]
    return found


def rows(table_html: str) -> list[list[str]]:
    body = table_html.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    return [re.findall(r"<td>(.*?)</td>", row) for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body)]


def heatmap_rows(svg: str) -> dict[str, list[str]]:
    """Row label -> the cell classes (eq, ne, none), read from the SVG in order."""
    found: dict[str, list[str]] = {}
    current = None
    for match in re.finditer(
        r'<text class="row-label"[^>]*>(.*?)<title>|<rect class="cell (\w+)', svg
    ):
        if match.group(1) is not None:
            current = match.group(1)
            found[current] = []
        else:
            assert current is not None
            found[current].append(match.group(2))
    return found


def test_the_verdict_comes_first_with_cause_confidence_explanation_fix_and_evidence() -> None:
    page = report(sample(), losses())
    parts = list(sections(page))
    assert parts[:3] == ["verdict", "Loss", "Snapshot timeline"]
    verdict = sections(page)["verdict"]
    assert (
        "The runs diverge at step <b>23</b>, forward pass, layer <b>body.2</b>, tensor "
        "<b>body.2.output</b>" in verdict
    )
    assert "op <b>aten.bernoulli_.float</b>" in verdict
    assert "Cause: <b>a random stream not seeded alike</b> (torch)" in verdict
    assert '<span class="badge proven">proven</span>' in verdict
    assert (
        "Torch is reseeded from entropy during the step (torch.seed() at examples/own_loop.py:64)"
        in verdict
    )
    assert '<div class="fix"><b>Fix:</b> remove the reseeding from entropy' in verdict
    assert "<code>torch.seed()</code> at <code>examples/own_loop.py:64</code>" in verdict
    evidence = rows(verdict)
    assert [row[0] for row in evidence] == ["replay", "self_rerun", "self_rerun", "reseed_fixed"]
    assert [re.sub(r"<[^>]+>", "", row[2]) for row in evidence] == [
        "differs",
        "matches",
        "differs",
        "matches",
    ]
    assert (
        'class="badge matches"' in evidence[3][2]
        and "given a fixed seed, step 23 repeats exactly" in evidence[3][3]
    )


def test_loss_curves_of_both_runs_with_the_divergence_marked_at_its_step() -> None:
    loss = sections(report(sample(), losses(steps=40)))["Loss"]
    curves = re.findall(r'<polyline class="line (\w+)" points="([^"]+)"', loss)
    assert [css for css, _ in curves] == ["a", "b", "diff"]
    xs = [float(p.split(",")[0]) for p in curves[0][1].split()]
    assert len(xs) == 40
    marker = re.search(r'<line class="marker m0" x1="([\d.]+)"', loss)
    assert marker is not None and "diverges at step 23" in loss
    assert math.isclose(float(marker.group(1)), xs[0] + (xs[-1] - xs[0]) * 23 / 39, abs_tol=0.2)
    diff_points = curves[2][1].split()
    assert len(diff_points) == 40 - 23  # |A - B| only where the losses differ
    assert "at the 17 step(s) where the losses differ; equal at 23 step(s)" in loss


def test_the_timeline_heatmap_has_a_row_per_layer_and_per_differing_stream() -> None:
    result = sample()
    timeline = sections(report(result, losses()))["Snapshot timeline"]
    found = heatmap_rows(timeline)
    layers = list(dict.fromkeys(name for row in result["timeline"] for name in row["layers"]))
    assert list(found) == ["all tensors", *layers, "stream torch"]
    first = next(i for i, row in enumerate(result["timeline"]) if not row["equal"])
    for name, cells in found.items():
        assert len(cells) == len(result["timeline"]), name
        assert cells[:first] == ["eq"] * first and cells[first] == "ne", name
    # on the first divergent column
    outline = re.search(r'<rect class="outline" x="([\d.]+)"', timeline)
    cell = re.findall(r'<rect class="cell \w+[^>]*x="([\d.]+)"', timeline)[first]
    assert outline is not None and math.isclose(float(outline.group(1)), float(cell) - 1)
    assert "<title>step 25, body.0: 6 differing tensor(s)</title>" in timeline


def test_no_stream_differing_is_one_equal_row() -> None:
    timeline = sections(report(sample("nondeterministic_op"), losses()))["Snapshot timeline"]
    found = heatmap_rows(timeline)
    assert list(found) == ["all tensors", "embed", "head", "random streams"]
    assert found["random streams"] == ["eq"] * 5


def test_the_first_divergent_tensor_with_its_histogram_as_bars() -> None:
    result = sample("nondeterministic_op")
    # order must not matter
    result["verdict"]["histogram"] = dict(reversed(list(result["verdict"]["histogram"].items())))
    part = sections(report(result, losses()))["First divergent tensor"]
    assert (
        "<code>embed.table.grad</code>" in part
        and "5.821e-11" in part
        and "2048" in part
        and "6.834%" in part
    )
    bars = re.findall(r'<rect class="bar"[^>]*height="([\d.]+)"><title>(.*?)</title>', part)
    assert [title for _, title in bars] == ["1e-14: 25", "1e-13: 238", "1e-12: 1270", "1e-11: 654"]
    heights = [float(h) for h, _ in bars]
    assert max(heights) == heights[2] and math.isclose(
        heights[3] / heights[2], 654 / 1270, rel_tol=0.02
    )


def test_the_ops_around_the_divergent_op_with_the_first_highlighted() -> None:
    result = sample("nondeterministic_op")
    part = sections(report(result, losses()))["Ops around the first divergent op"]
    table = rows(part)
    assert len(table) == len(result["ops_context"]) == 9
    highlighted = re.findall(r'<tr class="first">(.*?)</tr>', part)
    assert len(highlighted) == 1 and "<code>aten.index_put.default</code>" in highlighted[0]
    assert 'class="badge differ"' in table[4][5] and 'class="badge equal"' in table[4][4]


def test_config_and_environment_diffs_replay_and_notes() -> None:
    result = sample()
    result["config_diff"] = {"lr": [0.1, 0.2]}
    result["environment_diff"] = {"OMP_NUM_THREADS": ["1", "2"], "TF32": [None, True]}
    parts = sections(report(result, losses()))
    assert rows(parts["Config diff"]) == [["<code>lr</code>", "0.1", "0.2"]]
    assert rows(parts["Environment diff"]) == [
        ["<code>OMP_NUM_THREADS</code>", "1", "2"],
        ["<code>TF32</code>", '<span class="muted">not set</span>', "yes"],
    ]
    replay = parts["Replay"]
    assert (
        "from the checkpoint at step 0, 24 step(s) in 27.05 s" in replay
        and "reproduced both runs&#x27; records" in replay
    )
    assert (
        "<code>python examples/own_loop.py --out runs/a --steps 40 (in /home/me/project)</code>"
        in replay
    )
    assert "run B at step 23: loss" in replay
    assert "<h2>Notes</h2><ul><li>the replay from the checkpoints at steps 20/20 parted" in replay


def test_an_identical_pair() -> None:
    result = {
        **sample("nondeterministic_op"),
        "identical": True,
        "verdict": None,
        "ops_context": [],
        "config_diff": {},
    }
    result["timeline"] = [
        {**row, "equal": True, "differing_tensors": 0, "layers": {}, "streams": []}
        for row in result["timeline"]
    ]
    result["first_log_difference"] = {"order": None, "batch": None, "loss": None}
    result["snapshots"] = {"last_equal": 20, "first_divergent": None}
    page = report(result, losses(steps=20, part_at=None))
    parts = sections(page)
    assert '<p class="headline good">The runs are identical' in parts[
        "verdict"
    ] and "diverge" not in page.replace("first divergent snapshot", "")
    assert (
        "Evidence" not in page
        and "First divergent tensor" not in parts
        and "Ops around the first divergent op" not in parts
    )
    assert (
        "The losses are equal at all 20 step(s) both runs logged." in parts["Loss"]
        and 'class="marker' not in page
    )
    assert set(heatmap_rows(parts["Snapshot timeline"])) == {"all tensors", "random streams"}
    assert "outline" not in parts["Snapshot timeline"]


def test_runs_that_differ_without_a_verdict_are_not_called_identical() -> None:
    verdict = sections(report({**sample(), "verdict": None}, losses()))["verdict"]
    assert (
        "The runs differ; the comparison gave no verdict." in verdict and "identical" not in verdict
    )


def test_a_report_of_several_ranks() -> None:
    result = sample()
    step = result["verdict"]["step"]
    result["ranks"] = [
        {
            "rank": 0,
            "verdict": None,
            "timeline": [timeline_row(s, True, 0) for s in (0, 10, 20, 30)],
        },
        {
            "rank": 1,
            "verdict": {**result["verdict"], "rank": 1},
            "timeline": [timeline_row(s, s < 30, 3 * (s >= 30)) for s in (0, 10, 20, 30)],
        },
        {"rank": 2, "verdict": None, "timeline": [timeline_row(s, True, 0) for s in (0, 10)]},
    ]
    result["verdict"]["rank"] = 1
    page = report(result, losses())
    parts = sections(page)
    assert list(parts)[:2] == ["verdict", "Ranks"]
    assert f"step <b>{step}</b>, rank <b>1</b>, forward pass" in parts["verdict"]
    table = rows(parts["Ranks"])
    assert [row[0] for row in table] == ["0", "1", "2"]
    assert table[0][2] == "identical" and table[1][2].startswith(
        f"step {step}, forward pass, layer body.2"
    )
    assert table[1][3] == "a random stream not seeded alike"
    grid = heatmap_rows(parts["Ranks"])
    assert grid == {
        "rank 0": ["eq"] * 4,
        "rank 1": ["eq", "eq", "eq", "ne"],
        "rank 2": ["eq", "eq", "none", "none"],
    }


def test_every_string_is_escaped() -> None:
    evil = "<script>alert(1)</script><img src=x>"
    result = sample()
    result["runs"] = [evil, "runs/b"]
    verdict = result["verdict"]
    verdict.update(
        layer=evil,
        tensor=evil,
        op=evil,
        explanation=evil,
        fix=evil,
        rng=[evil],
        histogram={evil: 3, "1e-2": 4},
    )
    verdict["evidence"][0]["detail"] = evil
    verdict["reseeded"][0]["where"] = evil
    result["timeline"][-1]["layers"][evil] = 2
    result["timeline"][-1]["streams"].append(evil)
    result["ops_context"][0]["op"] = evil
    result["config_diff"] = {evil: [evil, 1]}
    result["environment_diff"] = {"x": [evil, None]}
    result["notes"].append(evil)
    result["replay"]["commands"][0] = evil
    result["ranks"] = [{"rank": 0, "verdict": verdict, "timeline": [timeline_row(0, False, 1)]}]
    page = report(result, losses())
    assert "<script" not in page and "<img" not in page
    assert page.count("&lt;script&gt;") >= 12
    summary = summary_of(
        path=evil,
        target=evil,
        config={evil: evil},
        environment={evil: evil},
        loader={evil: evil},
        streams=[evil],
    )
    page = summary_html(summary, {0: 1.0, 1: 0.5})
    assert "<script" not in page and page.count("&lt;script&gt;") >= 4


def assert_self_contained(page: str) -> None:
    assert not re.search(
        r"https?:|src\s*=|href\s*=|url\(|@import|<script|<link|<iframe|<object|<embed",
        page,
        re.IGNORECASE,
    )
    assert "Content-Security-Policy" in page and "default-src 'none'" in page


def test_nothing_is_loaded_from_anywhere() -> None:
    for name in ("reseed", "nondeterministic_op"):
        assert_self_contained(report(sample(name), losses()))
    assert_self_contained(summary_html(summary_of(complete=False, last_step=3), {0: 1.0}))


def test_a_long_run_stays_small() -> None:
    steps, every = 10_000, 10
    result = sample()
    layers = [f"encoder.layers.{i}.block" for i in range(48)]
    result["timeline"] = [
        {
            "step": s,
            "equal": s < 5_000,
            "differing_tensors": 0 if s < 5_000 else 96,
            "first_tensor": None,
            "streams": [] if s < 5_000 else ["torch"],
            "layers": {} if s < 5_000 else dict.fromkeys(layers, 2),
        }
        for s in range(0, steps + 1, every)
    ]
    a = {s: 2.0 * math.exp(-s / 3_000) + 0.05 * math.sin(s) for s in range(steps)}
    b = {s: v + (1e-3 * math.cos(s) if s >= 5_000 else 0.0) for s, v in a.items()}
    a[7_777] = 40.0  # a spike survives the downsampling
    page = report(result, [a, b])
    assert len(page.encode()) < 2_000_000
    curves = re.findall(r'<polyline class="line (\w+)" points="([^"]+)"', sections(page)["Loss"])
    assert [css for css, _ in curves] == ["a", "b", "diff"]
    assert all(len(points.split()) <= 1_202 for _, points in curves)
    a_points = [tuple(map(float, p.split(","))) for p in curves[0][1].split()]
    # the highest point drawn is the spike, at its step
    x_top = min(a_points, key=lambda p: p[1])[0]
    assert math.isclose(
        x_top, a_points[0][0] + (a_points[-1][0] - a_points[0][0]) * 7_777 / 9_999, abs_tol=0.2
    )
    grid = heatmap_rows(sections(page)["Snapshot timeline"])
    assert len(grid) == 1 + 30 + 1 + 1  # all, 30 layers, the rest in one row, the torch stream
    assert "18 more layers" in grid and all(len(cells) <= 60 for cells in grid.values())


def test_downsampling_keeps_each_buckets_extremes_in_order() -> None:
    points = [(s, float(s % 7)) for s in range(10_000)]
    points[4_321] = (4_321, 99.0)
    kept = downsample(points, 100)
    assert len(kept) <= 202 and (4_321, 99.0) in kept and kept == sorted(kept)
    assert kept[0] == points[0] and kept[-1] == points[-1]  # the curve spans the whole run
    assert min(v for _, v in kept) == 0.0 and downsample(points[:50], 100) == points[:50]


def test_losses_that_are_missing_or_not_finite_are_left_out_and_said() -> None:
    a = {0: 1.0, 1: float("nan"), 2: None, 3: 0.5}
    loss = sections(report(sample(), [a, dict(a)]))["Loss"]
    assert (
        "run A: 2 step(s) without a finite loss; run B: 2 step(s) without a finite loss (not "
        "drawn)." in loss
    )
    points = re.search(r'<polyline class="line a" points="([^"]+)"', loss).group(1).split()
    assert len(points) == 2 and "nan" not in " ".join(points).lower()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Runs recorded in this process, each naming its recipe so that compare can replay it.

    ``init_a`` and ``init_b``: a model initialised without a seed (they differ from step 0);
    ``mlp_a`` and ``mlp_b``: a seeded MLP (identical); ``mlp_lr``: the same with another ``lr``.
    """
    folder = tmp_path_factory.mktemp("runs")
    init, mlp = f"{EXAMPLES / 'unseeded_init.py'}:build", f"{EXAMPLES / 'mlp.py'}:build"
    plan = {
        "init_a": (init, {}),
        "init_b": (init, {}),
        "mlp_a": (mlp, {"hidden": 8}),
        "mlp_b": (mlp, {"hidden": 8}),
    }
    plan["mlp_lr"] = (mlp, {"hidden": 8, "lr": 0.01})
    for name, (target, config) in plan.items():
        record(
            build(target, config),
            folder / name,
            RecordOptions(steps=6, every=3, checkpoint_every=3),
            target=target,
            config=config,
        )
    return {name: folder / name for name in plan}


def compare_html(tmp_path: Path, a: Path, b: Path, *args: str) -> tuple[int, str, dict[str, str]]:
    """``compare A B --html`` through the CLI: the exit code, stdout and the report's sections."""
    out = tmp_path / "report.html"
    result = runner.invoke(app, ["compare", str(a), str(b), "--html", str(out), *args])
    assert result.exit_code in (0, 1), result.output
    assert result.stderr.strip().splitlines()[-1] == f"wrote {out}"
    page = out.read_text()
    assert_self_contained(page)
    return result.exit_code, result.stdout, sections(page)


def test_show_html_of_a_run(runs, tmp_path) -> None:
    out = tmp_path / "show.html"
    result = runner.invoke(app, ["show", str(runs["mlp_a"]), "--html", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stderr.strip().splitlines()[-1] == f"wrote {out}"
    assert str(runs["mlp_a"]) in result.stdout  # the text summary is printed as before
    page = out.read_text()
    summary = run_summary(Run.open(runs["mlp_a"]))
    assert (
        f"<h1>bisect-repro show: {runs['mlp_a']}" in page
        and '<span class="badge complete">complete</span>' in page
    )
    assert re.search(r'<polyline class="line a" points="([^"]+)"', page).group(1).count(",") == 6
    assert f"first {summary.first_loss:.4g}, last {summary.last_loss:.4g}" in page
    assert "snapshots</th><td>3, at steps 0 to 6" in page and "hidden=8" in page
    assert_self_contained(page)


def test_compare_html_of_a_diverged_pair_with_the_replay(runs, tmp_path) -> None:
    code, stdout, parts = compare_html(tmp_path, runs["init_a"], runs["init_b"], "--json")
    assert code == 1
    found = json.loads(stdout)
    assert (
        found["verdict"]["confidence"] == "proven"
        and '<span class="badge proven">proven</span>' in parts["verdict"]
    )
    assert (
        "The runs diverge at step <b>0</b>, init, layer <b>0</b>, tensor <b>0.weight</b>"
        in parts["verdict"]
    )
    assert [row[0] for row in rows(parts["verdict"])] == [
        item["experiment"] for item in found["verdict"]["evidence"]
    ]
    assert heatmap_rows(parts["Snapshot timeline"])["all tensors"] == ["ne", "ne", "ne"]
    assert (
        len(re.findall(r'<polyline class="line [ab]"', parts["Loss"])) == 2
        and "diverges at step 0" in parts["Loss"]
    )
    assert "100%" in parts["First divergent tensor"]  # every element of the weight differs
    page = (tmp_path / "report.html").read_text()
    assert page == report(found, [Run.open(runs[name]).losses() for name in ("init_a", "init_b")])


def test_compare_html_records_only(runs, tmp_path) -> None:
    code, stdout, parts = compare_html(tmp_path, runs["mlp_a"], runs["mlp_lr"], "--no-replay")
    assert code == 1 and "The runs diverge" in stdout  # the text report is printed as before
    assert (
        "Cause: <b>the config</b> (lr)" in parts["verdict"]
        and '<span class="badge inferred">inferred</span>' in parts["verdict"]
    )
    assert rows(parts["Config diff"]) == [
        ["<code>lr</code>", '<span class="muted">not set</span>', "0.01"]
    ]
    assert "none: the verdict is from the records alone" in parts["Replay"]
    assert (
        "Ops around the first divergent op" not in parts and "First divergent tensor" not in parts
    )
    assert heatmap_rows(parts["Snapshot timeline"])["all tensors"] == ["eq", "ne", "ne"]


def test_compare_html_of_an_identical_pair(runs, tmp_path) -> None:
    code, _, parts = compare_html(tmp_path, runs["mlp_a"], runs["mlp_b"])
    assert (
        code == 0
        and "The runs are identical" in parts["verdict"]
        and "Evidence" not in parts["verdict"]
    )
    assert "The losses are equal at all 6 step(s) both runs logged." in parts["Loss"]
    assert all(set(cells) == {"eq"} for cells in heatmap_rows(parts["Snapshot timeline"]).values())


@pytest.mark.parametrize("command", ["show", "compare"])
def test_a_report_path_in_a_missing_folder_is_one_line_and_exit_2(runs, tmp_path, command) -> None:
    out = tmp_path / "missing" / "report.html"
    given = [str(runs["mlp_a"])] if command == "show" else [str(runs["mlp_a"]), str(runs["mlp_b"])]
    result = runner.invoke(app, [command, *given, "--html", str(out)])
    assert result.exit_code == 2, result.output
    assert (
        result.stderr.strip()
        == f"error: {out}: the folder {out.parent} does not exist; create it or give another path "
        "for the report"
    )
    assert result.stdout == "" and not out.parent.exists()


def test_a_stream_nothing_drew_from_is_drawn_grey_and_named_unused() -> None:
    result = sample()
    result["timeline"][0]["streams"] = ["python", "torch"]
    result["unused_streams"] = ["python"]
    page = report(result, losses())
    assert "stream python (differs, unused)" in page and 'class="cell muted"' in page
    assert "stream torch (differs, unused)" not in page and "stream torch" in page
