"""Compare time against the time to record one run, for runs that part late, with the processes
started.

    python -m benchmarks.compare_late --out /tmp/late               # every case
    python -m benchmarks.compare_late --out /tmp/late --only recipe lightning

Each case records two runs of one training that part ways late (whole commands, wall time), then
runs ``bisect-repro compare --json`` on them (the whole command) and reports: the wall time of
recording run A, of the compare, their ratio, the replaying processes the compare started
(``replay.processes``, fork servers included) and how many of them were forked from a fork server
(``replay.forked``: no Python start, no imports), the steps replayed and the verdict. The cases:

- ``recipe``: :mod:`benchmarks.late_cnn` (a ~2M-parameter CNN, 200 steps, snapshots every 10,
  checkpoints every 50, torch's stream reseeded from entropy at step 170);
- ``loop``: the same training in a loop of its own under the Recorder API;
- ``script``: the same training as an unchanged script (``bisect-repro record -- python ...``);
- ``lightning``, ``hf``: ``examples/lightning_train.py`` and ``examples/hf_train.py``, run B with
  ``--reseed-at 7`` (20 steps; each skipped when its framework is not installed).

Writes ``compare_late.json`` into ``--out`` with the load average before and after each case (a
case not run keeps its row from an earlier run there).
With ``--repeat N`` each case runs N rounds (record A, record B, compare) and reports the medians,
the median of the rounds' own ratios and the lowest and highest of them, the last round's verdict
(and every round's, where they disagree). Where it stops: on a
machine shared with other work, read the ratios with the load beside them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CNN = ROOT / "benchmarks" / "late_cnn.py"
EVERY = ["--every", "10", "--checkpoint-every", "50"]
CLI = str(Path(sys.executable).with_name("bisect-repro"))


def _cases() -> dict[str, tuple[str | None, list[str], list[str]]]:
    """Each case: the framework it needs, and the commands recording runs A and B (``{out}`` the run
    directory)."""
    python = sys.executable
    recipe = [
        CLI,
        "record",
        f"{CNN}:build",
        "--steps",
        "200",
        *EVERY,
        "--force",
        "--quiet",
        "--out",
    ]
    script = [CLI, "record", *EVERY, "--force", "--quiet", "--out", "{out}", "--", python, str(CNN)]
    loop = [python, str(CNN), "--recorder", "--out", "{out}"]
    lightning = [python, str(ROOT / "examples" / "lightning_train.py"), "--out", "{out}"]
    hf = [python, str(ROOT / "examples" / "hf_train.py"), "--out", "{out}"]
    return {
        "recipe": (None, [*recipe, "{out}"], [*recipe, "{out}"]),
        "loop": (None, loop, loop),
        "script": (None, script, script),
        "lightning": ("lightning", lightning, [*lightning, "--reseed-at", "7"]),
        "hf": ("transformers", hf, [*hf, "--reseed-at", "7"]),
    }


def _timed(command: list[str], cwd: Path) -> tuple[float, subprocess.CompletedProcess[str]]:
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    started = time.perf_counter()
    done = subprocess.run(
        command, cwd=cwd, env=environment, capture_output=True, text=True, check=False
    )
    return time.perf_counter() - started, done


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _verdict(result: dict[str, Any]) -> list[Any]:
    return [
        (result.get("verdict") or {}).get(k)
        for k in ("step", "phase", "layer", "cause", "confidence")
    ]


def run_case(
    name: str,
    commands: tuple[list[str], list[str]],
    folder: Path,
    repeat: int = 1,
    ahead: bool = False,
) -> dict[str, Any]:
    """Record both runs (run A timed), compare them (timed), ``repeat`` times in turn: one row of
    medians (each compare against the recording of its own round). ``ahead``: each round also
    compares with the command's module run directly (``python -m bisect_repro.cli``, which starts
    no fork server ahead), right after, on the same runs."""
    row: dict[str, Any] = {"case": name, "load before": _load()}
    records, compares, verdicts, result = [], [], [], {}
    direct: list[float] = []
    for round_ in range(repeat):
        runs = []
        for label, command in zip("ab", commands, strict=True):
            out = folder / f"{name}-{round_}-{label}"
            seconds, done = _timed([part.replace("{out}", str(out)) for part in command], folder)
            if done.returncode != 0:
                raise RuntimeError(f"recording {name} {label} failed: {done.stderr[-2000:]}")
            if label == "a":
                records.append(seconds)
            runs.append(str(out))
        seconds, done = _timed([CLI, "compare", "--json", *runs], folder)
        compares.append(seconds)
        result = json.loads(done.stdout)
        verdicts.append(_verdict(result))
        if ahead:
            seconds, done = _timed(
                [sys.executable, "-m", "bisect_repro.cli", "compare", "--json", *runs], folder
            )
            direct.append(seconds)
            verdicts.append(_verdict(json.loads(done.stdout)))
    replay = result["replay"]
    ratios = sorted(c / r for c, r in zip(compares, records, strict=True))
    row.update(
        {
            "record s": round(statistics.median(records), 2),
            "compare s": round(statistics.median(compares), 2),
            "compare / record": round(statistics.median(ratios), 2),
            "rounds": repeat,
            "compare / record, lowest to highest": [round(ratios[0], 2), round(ratios[-1], 2)],
            "processes": replay.get("processes"),
            "forked": replay.get("forked"),
            "replayed steps": replay.get("replayed_steps"),
            **(
                {}
                if not direct
                else {
                    "compare s, no server ahead": round(statistics.median(direct), 2),
                    "no server ahead / record": round(
                        statistics.median(d / r for d, r in zip(direct, records, strict=True)), 2
                    ),
                }
            ),
            "verdict": verdicts[-1],
            # a round that disagreed
            **(
                {} if all(v == verdicts[-1] for v in verdicts) else {"verdicts, by round": verdicts}
            ),
            "load after": _load(),
        }
    )
    return row


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for compare_late.json")
    parser.add_argument(
        "--only", nargs="+", choices=("recipe", "loop", "script", "lightning", "hf"), metavar="CASE"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds of each case (record A, record B, compare); medians",
    )
    parser.add_argument(
        "--ahead",
        action="store_true",
        help="also compare without a fork server started ahead, in the same rounds",
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bisect-repro-late-") as tmp:
        for name, (needs, a, b) in _cases().items():
            if args.only and name not in args.only:
                continue
            if needs is not None and importlib.util.find_spec(needs) is None:
                print(f"{name}: skipped ({needs} is not installed)")
                continue
            row = run_case(name, (a, b), Path(tmp), args.repeat, args.ahead)
            print(json.dumps(row))
            rows.append(row)
    path = args.out / "compare_late.json"
    try:  # a case not run this time keeps its earlier row
        earlier = [
            row
            for row in json.loads(path.read_text())
            if row.get("case") not in {r["case"] for r in rows}
        ]
    except (OSError, ValueError):
        earlier = []
    order = list(_cases())
    rows = sorted(
        earlier + rows,
        key=lambda row: order.index(row["case"]) if row.get("case") in order else len(order),
    )
    path.write_text(json.dumps(rows, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    main()
