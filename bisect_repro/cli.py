"""The command line: parse, call the Python API, map errors to exit codes.

Exit codes: 0 success (runs identical, recipe reproducible), 1 a divergence was found, 2 bad
input or an error, reported as one line naming the file and the problem, never a traceback.
"""

from __future__ import annotations

import functools
import json
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .compare import compare
from .demo import record_pair
from .doctor import DEFAULT_STEPS, doctor
from .errors import BisectReproError
from .recipe import build, parse_settings, recipe_file
from .recorder import RecordingWarning, RecordOptions, record
from .report import render_comparison, render_doctor, render_summary, run_summary
from .store import Run

app = typer.Typer(
    help="Find where, and why, two training runs that should match part ways.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
stdout = Console()
stderr = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])


def _warn_line(message: Warning | str) -> None:
    stderr.print(f"[bold yellow]warning:[/] {message}", markup=True, highlight=False, soft_wrap=True)


def _exits_cleanly(command: F) -> F:
    """Turn a BisectReproError into one line on stderr and exit code 2; warnings into one line each."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("default", RecordingWarning)
                warnings.showwarning = lambda message, *_, **__: _warn_line(message)  # one line, not a source excerpt
                return command(*args, **kwargs)
        except BisectReproError as error:
            stderr.print(f"[bold red]error:[/] {error}", markup=True, highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


Settings = Annotated[list[str], typer.Option("--set", help="KEY=VALUE passed to the recipe; VALUE read as JSON when it parses as JSON.")]


def _progress(console: Console, *, transient: bool = False) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[extra]}"),
        TimeElapsedColumn(),
        console=console,
        transient=transient,
    )


@app.command("record")
@_exits_cleanly
def record_command(
    target: Annotated[str, typer.Argument(help="The recipe: path/to/file.py:function or package.module:function.")],
    out: Annotated[Path, typer.Option("--out", help="The run directory to write.")],
    steps: Annotated[int, typer.Option(help="Number of training steps.")] = 100,
    every: Annotated[int, typer.Option(help="Snapshot every K steps (and at the first and last).")] = 10,
    checkpoint_every: Annotated[int, typer.Option(help="Full checkpoint every C steps (and at step 0).")] = 100,
    settings: Settings = [],  # noqa: B006 - typer reads the default
    force: Annotated[bool, typer.Option(help="Overwrite an existing run.")] = False,
    quiet: Annotated[bool, typer.Option(help="No progress bar.")] = False,
    resume: Annotated[bool, typer.Option(help="Continue the interrupted run in --out from its last checkpoint (same options).")] = False,
    on_error: Annotated[
        str, typer.Option("--on-error", help="On a failed write: 'raise' stops training, 'warn' warns once and trains on unrecorded.")
    ] = "raise",
) -> None:
    """Run a recipe under the recorder and write a run directory."""
    if resume and force:
        raise BisectReproError(f"{out}: give --resume (continue the run) or --force (record it again), not both")
    options = RecordOptions(steps=steps, every=every, checkpoint_every=checkpoint_every, force=force, on_error=on_error)  # type: ignore[arg-type]
    config = parse_settings(settings)
    trainee = build(target, config)
    console = Console(stderr=True, quiet=quiet)
    started = time.perf_counter()
    with _progress(console) as progress:
        task = progress.add_task("recording", total=steps, extra="")

        def on_step(step: int, loss: float | None) -> None:
            rate = step / max(time.perf_counter() - started, 1e-9)
            shown = f"loss {loss:.4g}  " if loss is not None else ""
            progress.update(task, completed=step, extra=f"{shown}{rate:.1f} steps/s")

        record(trainee, out, options, target=target, config=config, on_step=on_step, resume=resume)
    run = Run.open(out)
    status = "" if run.complete else f" (incomplete: last complete step {run.last_step})"
    console.print(f"wrote {out}: {len(run.steps)} steps, {len(run.snapshots)} snapshots, {len(run.checkpoints)} checkpoints{status}")


@app.command("show")
@_exits_cleanly
def show_command(
    run: Annotated[Path, typer.Argument(help="A run directory.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    verify: Annotated[bool, typer.Option(help="Read and check every snapshot and checkpoint, not only the last snapshot.")] = False,
) -> None:
    """What a run holds: steps, snapshots, checkpoints, config, environment, streams, losses."""
    summary = run_summary(Run.open(run), verify=verify)
    if as_json:
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    else:
        render_summary(summary, stdout)


@app.command("compare")
@_exits_cleanly
def compare_command(
    run_a: Annotated[Path, typer.Argument(help="The first run directory.")],
    run_b: Annotated[Path, typer.Argument(help="The second run directory.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (schema bisect-repro/compare/1).")] = False,
    no_replay: Annotated[bool, typer.Option("--no-replay", help="Compare the records only; import and run nothing.")] = False,
) -> None:
    """Find the first step, layer and op where two runs diverge, with the cause and the fix.

    Exit code 0: identical; 1: they diverge; 2: bad input.
    """
    result = _compare(run_a, run_b, replay=not no_replay, quiet=as_json)
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    else:
        render_comparison(result, stdout)
    raise typer.Exit(0 if result["identical"] else 1)


def _compare(run_a: Path, run_b: Path, *, replay: bool, quiet: bool) -> dict[str, Any]:
    console = Console(stderr=True, quiet=quiet)
    if replay:
        for run in (run_a, run_b):
            target = Run.open(run).meta.get("target")
            path = recipe_file(target) if target else None
            console.print(f"[dim]replay of {run} may import {path or target}[/]", highlight=False)
    with _progress(console, transient=True) as progress:
        task = progress.add_task("comparing", total=None, extra="")

        def on_progress(stage: str, done: int, total: int) -> None:
            progress.update(task, description=stage, completed=done, total=total)

        return compare(run_a, run_b, replay=replay, progress=on_progress)


@app.command("demo")
@_exits_cleanly
def demo_command(
    out: Annotated[Path | None, typer.Option("--out", help="Where to keep the two runs (default: a temporary folder).")] = None,
    steps: Annotated[int, typer.Option(help="Steps per run.")] = 20,
) -> None:
    """Record a recipe that really diverges on a CPU twice, and compare the two runs."""
    console = Console(stderr=True)
    console.print("Recording two runs of a fully seeded embedding model (table\\[idx], two threads)...")
    run_a, run_b = record_pair(out, steps=steps)
    console.print(f"Recorded {run_a} and {run_b}. Comparing them...")
    result = _compare(run_a, run_b, replay=True, quiet=False)
    render_comparison(result, stdout)
    stdout.print(f"\nTry it yourself: bisect-repro compare {run_a} {run_b} --json")


@app.command("doctor")
@_exits_cleanly
def doctor_command(
    target: Annotated[str | None, typer.Argument(help="The recipe: path/to/file.py:function or package.module:function.")] = None,
    steps: Annotated[int, typer.Option(help="Steps to train and re-run.")] = DEFAULT_STEPS,
    settings: Settings = [],  # noqa: B006 - typer reads the default
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (schema bisect-repro/doctor/1).")] = False,
) -> None:
    """Audit a recipe for every known source of irreproducibility, proving each finding by a run.

    Without TARGET, audit this environment and process. Exit code 0: reproducible on this machine
    (warnings may remain); 1: not; 2: bad input.
    """
    console = Console(stderr=True, quiet=as_json)
    with console.status("doctor") as status:
        result = doctor(target, parse_settings(settings), steps=steps, progress=lambda stage: status.update(stage))
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    else:
        render_doctor(result, stdout)
    raise typer.Exit(0 if result["reproducible"] else 1)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
