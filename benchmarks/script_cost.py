"""What an unchanged script costs under bisect-repro, whole processes as a user runs them.

    python -m benchmarks.script_cost --case gpt --out benchmarks/results-cuda --rounds 2
    python -m benchmarks.script_cost --case gpt --quick --out /tmp/cost   # a CPU check, tiny

The parts, each optional (``--only``):

- ``overhead``: the script run plainly, and under ``bisect-repro record -- python ...`` at
  ``--every 10`` and ``--every 1`` (a checkpoint every 50 steps), each a whole process, in rounds
  that rotate the order; a ratio is the median of each round's own ratio to its plain run.
- ``startup``: the fixed cost, a script that only imports torch run plainly and under ``record``
  (which then records nothing and exits 3), whole processes in paired rounds;
- ``breakdown``: where a recording's time goes (:mod:`benchmarks.script_breakdown`, one process at
  ``--every 10`` and one at ``--every 1``): the recorder's start and exit, its CPU by part on the
  training thread, its writer thread's CPU, and cProfile's top functions of the recorder;
- ``compare``: runs A and B of the same command and run C with a late planted bug (``--reseed-at``)
  recorded, then ``compare --json`` A against B and A against C, each timed against the recording
  of run A, with the verdicts.
- ``doctor``: ``doctor --json -- python ...`` on a short run of the script, timed, with its
  findings.

Writes ``script_cost.json`` into ``--out`` (a case run again replaces its entry) and prints each
process as it ends. Where it stops: wall times on a machine that may be shared; the load average
is recorded before and after each part.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "bisect_repro"]


@dataclass(frozen=True)
class Case:
    """A script and how each part runs it: its arguments for ``steps`` iterations, and the
    planted bug's arguments."""

    script: Path
    steps_flag: str
    overhead_steps: int
    compare_steps: int
    bug: tuple[str, ...]
    quick: tuple[str, ...] = ()
    fixed: tuple[str, ...] = ()
    """Arguments every run is given (before the planted bug's, which override them)."""
    schedule: tuple[int, int] = (10, 20)
    """The compare part's snapshot and checkpoint intervals."""

    def command(self, steps: int, *extra: str, quick: bool = False) -> list[str]:
        sizes = self.quick if quick else ()
        return [
            sys.executable,
            str(self.script),
            self.steps_flag,
            str(steps),
            *sizes,
            *self.fixed,
            *extra,
        ]


CASES = {
    "gpt": Case(
        ROOT / "benchmarks" / "gpt_script.py",
        "--iters",
        300,
        60,
        ("--reseed-at", "40"),
        ("--size", "tiny"),
    ),
    # the late-divergence CNN as a plain script (a seeded DataLoader, SGD, dropout), never reseeded
    # unless planted: the issue's 200-step case, compared at its recordings' schedule
    "cnn": Case(
        ROOT / "benchmarks" / "late_cnn.py",
        "--steps",
        200,
        200,
        ("--reseed-at", "170"),
        fixed=("--reseed-at", "1000000"),
        schedule=(10, 50),
    ),
}


def _run(command: list[str], cwd: Path) -> tuple[float, subprocess.CompletedProcess[str]]:
    """``command``'s wall seconds and result; ``PYTHONPATH=DIR`` as its first word: run with that
    ``PYTHONPATH`` and in that folder (another copy of bisect-repro, the baseline)."""
    env = dict(os.environ)
    if command[0].startswith("PYTHONPATH="):  # run there too: python -m imports from its folder
        cwd = Path(command[0].partition("=")[2])
        env["PYTHONPATH"] = str(cwd)
        command = command[1:]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False, env=env)
    return time.perf_counter() - started, done


def _checked(command: list[str], cwd: Path, codes: tuple[int, ...] = (0,)) -> tuple[float, str]:
    seconds, done = _run(command, cwd)
    if done.returncode not in codes:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}: {done.stderr[-3000:]}")
    return seconds, done.stdout


def _record(out: Path, every: int, checkpoint_every: int, script: list[str]) -> list[str]:
    options = [
        "--every",
        str(every),
        "--checkpoint-every",
        str(checkpoint_every),
        "--force",
        "--quiet",
    ]
    return [*CLI, "record", "--out", str(out), *options, "--", *script]


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def overhead(
    case: Case, folder: Path, rounds: int, quick: bool, baseline: Path | None = None
) -> dict[str, Any]:
    """Whole-process seconds of the plain script and of its recordings at every=10 and every=1;
    ``baseline``: also every=10 recorded by the copy of bisect-repro in that folder."""
    steps = 6 if quick else case.overhead_steps
    script = case.command(steps, quick=quick)
    configs: dict[str, list[str]] = {"plain": script}
    for every in (10, 1):
        configs[f"every={every}"] = _record(folder / f"every{every}", every, 50, script)
    if baseline is not None:
        recorded = _record(folder / "baseline", 10, 50, script)
        configs["every=10, baseline"] = [f"PYTHONPATH={baseline}", *recorded]
    return {"steps": steps, **_paired(configs, rounds, "overhead")}


def startup(folder: Path, rounds: int, baseline: Path | None = None) -> dict[str, Any]:
    """The fixed cost: a script that imports torch and nothing else, plain and recorded (and
    recorded by the ``baseline`` copy of bisect-repro)."""
    script = folder / "import_torch.py"
    script.write_text("import torch\n")
    plain = [sys.executable, str(script)]
    recorded = _record(folder / "startup", 10, 50, plain)
    configs = {"plain": plain, "recorded": recorded}
    if baseline is not None:
        configs["recorded, baseline"] = [f"PYTHONPATH={baseline}", *recorded]
    return _paired(configs, rounds, "startup", codes=(0, 3))


def _paired(
    configs: dict[str, list[str]], rounds: int, part: str, codes: tuple[int, ...] = (0,)
) -> dict[str, Any]:
    """Each command's whole-process seconds in rounds that rotate their order, each ratio the
    median of the rounds' own ratios to the first command's (the plain run)."""
    names = list(configs)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    load, loads = _load(), []
    for round_ in range(rounds):
        loads.append(_load())
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            took, _ = _checked(configs[name], ROOT, codes)
            seconds[name].append(took)
            print(f"{part} round {round_ + 1}, {name}: {took:.2f} s", file=sys.stderr, flush=True)
    rows = []
    for name in names:
        ratios = sorted(a / b for a, b in zip(seconds[name], seconds[names[0]], strict=True))
        rows.append(
            {
                "configuration": name,
                "process s": round(statistics.median(seconds[name]), 2),
                "process overhead": round(statistics.median(ratios), 3),
                "rounds' lowest to highest": [round(ratios[0], 3), round(ratios[-1], 3)],
                "each round s": [round(s, 2) for s in seconds[name]],
            }
        )
    return {
        "rounds": rounds,
        "load before": load,
        "load at each round's start": loads,
        "load after": _load(),
        "rows": rows,
    }


def _verdict(stdout: str) -> dict[str, Any]:
    found = json.loads(stdout)
    verdict = found.get("verdict") or {}
    keys = ("step", "phase", "layer", "tensor", "op", "cause", "confidence", "rng")
    numerics = found.get("numerics") or {}
    return {
        "identical": bool(found.get("identical")),
        **{key: verdict.get(key) for key in keys},
        "replayed steps": (found.get("replay") or {}).get("replayed_steps"),
        "numerics": numerics.get("sentence"),
    }


def compare(case: Case, folder: Path, quick: bool) -> dict[str, Any]:
    """Runs A, B (the same command) and C (the planted bug) recorded; A compared with B and C."""
    steps = 6 if quick else case.compare_steps
    bug = ("--reseed-at", "3") if quick else case.bug
    every, checkpoint_every = (2, 2) if quick else case.schedule
    load = _load()
    runs, records = {}, {}
    for label, extra in (("a", ()), ("b", ()), ("c", bug)):
        runs[label] = folder / label
        records[label], _ = _checked(
            _record(runs[label], every, checkpoint_every, case.command(steps, *extra, quick=quick)),
            ROOT,
        )
        print(
            f"compare: run {label} recorded in {records[label]:.2f} s", file=sys.stderr, flush=True
        )
    pairs = {}
    for label in ("b", "c"):
        took, stdout = _checked(
            [*CLI, "compare", "--json", str(runs["a"]), str(runs[label])], ROOT, (0, 1)
        )
        pairs[f"a against {label}"] = {
            "compare s": round(took, 2),
            "/ record": round(took / records["a"], 2),
            **_verdict(stdout),
        }
        print(f"compare: a against {label} in {took:.2f} s", file=sys.stderr, flush=True)
    planted = {
        "bug": list(bug),
        "steps": steps,
        "every": every,
        "checkpoint_every": checkpoint_every,
    }
    record_s = {label: round(s, 2) for label, s in records.items()}
    return {
        **planted,
        "record s": record_s,
        "pairs": pairs,
        "load before": load,
        "load after": _load(),
    }


def breakdown(case: Case, folder: Path, quick: bool) -> dict[str, Any]:
    """Where one recording's time goes, at every=10 and every=1 (:mod:`benchmarks.script_breakdown`;
    the script's path and arguments as ``case.command`` gives them)."""
    steps = 6 if quick else case.overhead_steps
    script = case.command(steps, quick=quick)[1:]
    found: dict[str, Any] = {"load before": _load()}
    for every in (10, 1):
        _, stdout = _checked(
            [
                sys.executable,
                "-m",
                "benchmarks.script_breakdown",
                "--every",
                str(every),
                "--out",
                str(folder / f"breakdown{every}"),
                "--profile",
                "--",
                *script,
            ],
            ROOT,
        )
        found[f"every={every}"] = json.loads(stdout)
        print(f"breakdown at every={every} done", file=sys.stderr, flush=True)
    found["load after"] = _load()
    return found


def doctor(case: Case, quick: bool) -> dict[str, Any]:
    """``doctor --json`` on a short run of the script (4 steps)."""
    load = _load()
    took, stdout = _checked(
        [*CLI, "doctor", "--json", "--", *case.command(4, quick=quick)], ROOT, (0, 1)
    )
    report = json.loads(stdout)
    findings = [
        {key: f.get(key) for key in ("id", "severity", "op")} for f in report.get("findings", [])
    ]
    print(f"doctor in {took:.2f} s", file=sys.stderr, flush=True)
    return {
        "doctor s": round(took, 2),
        "findings": findings,
        "load before": load,
        "load after": _load(),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=sorted(CASES), default="gpt")
    parser.add_argument("--out", type=Path, required=True, help="folder for script_cost.json")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=("startup", "overhead", "breakdown", "compare", "doctor"),
        default=None,
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="a folder with another copy of bisect-repro: overhead also records every=10 with it",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a tiny model and a few steps: a check of the benchmark",
    )
    args = parser.parse_args(argv)
    case = CASES[args.case]
    parts = args.only or ["startup", "overhead", "breakdown", "compare", "doctor"]
    found: dict[str, Any] = {"case": args.case, "script": str(case.script.relative_to(ROOT))}
    with tempfile.TemporaryDirectory(prefix="bisect-repro-cost-") as tmp:
        if "startup" in parts:
            found["startup"] = startup(Path(tmp), args.rounds, args.baseline)
        if "overhead" in parts:
            found["overhead"] = overhead(case, Path(tmp), args.rounds, args.quick, args.baseline)
        if "breakdown" in parts:
            found["breakdown"] = breakdown(case, Path(tmp), args.quick)
        if "compare" in parts:
            found["compare"] = compare(case, Path(tmp), args.quick)
        if "doctor" in parts:
            found["doctor"] = doctor(case, args.quick)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "script_cost.json"
    kept = json.loads(path.read_text()) if path.exists() else {}
    key = f"{args.case}{', quick' if args.quick else ''}"
    kept[key] = {**kept.get(key, {}), **found}  # a part not run keeps its earlier result
    path.write_text(json.dumps(kept, indent=1) + "\n")
    return found


if __name__ == "__main__":
    print(json.dumps(main(), indent=1))
