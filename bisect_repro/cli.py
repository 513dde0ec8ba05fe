"""The command line: parse, call the Python API, map errors to exit codes.

Exit codes: 0 success (runs identical, recipe reproducible), 1 a divergence was found, 2 bad
input or an error, reported as one line naming the file and the problem, never a traceback.

``--verbose`` (``-v``) turns on the ``bisect_repro`` logger on stderr: the processes a replay
starts and where their output goes, the course of the replay, the last output of a process that
failed; ``-vv`` also every request sent to a replaying process. Each line is made printable
(control characters escaped), since it may quote a run's fields or a process's output.

The results stay typed up to here (``RunSummary``, ``CompareResult``, ``DoctorReport``): the text
and HTML reports render the objects, and only ``--json`` turns them into JSON (``to_json()``).
"""

from __future__ import annotations

import functools
import gc
import json
import logging
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from .diagnose.doctor.steps import DEFAULT_STEPS
from .diagnose.stages import run_stage, timed
from .errors import BisectReproError, RecordingWarning
from .record.options import RecordOptions
from .record.script import (
    ScriptCommand,
    is_interpreter,
    is_launcher,
    launcher_options,
    parse_command,
    record_script,
)
from .report.safe import safe_text
from .store.printable import printable

if TYPE_CHECKING:
    from .diagnose.compare.verdict import CompareResult
    from .record.against import Against
    from .replay.launch import Consent, LaunchSpec

# What a command needs is imported where it runs: recording an unchanged script parses its command
# and starts its process without importing torch here.

app = typer.Typer(
    help="Find where, and why, two training runs that should match part ways.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
stdout = Console()
stderr = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])


class _PrintableFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record))


@app.callback()
def _options(
    verbose: Annotated[
        int,
        typer.Option(
            "--verbose",
            "-v",
            count=True,
            help="Log to stderr what runs and how a replay goes (-vv: each request to a replaying "
            "process).",
        ),
    ] = 0,
) -> None:
    """Find where, and why, two training runs that should match part ways."""
    if verbose:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_PrintableFormatter("%(levelname)s %(name)s: %(message)s"))
        logger = logging.getLogger("bisect_repro")
        logger.handlers[:] = [handler]
        logger.setLevel(logging.DEBUG if verbose > 1 else logging.INFO)


def _line(label: str, style: str, message: object) -> None:
    """One line on stderr: a styled label, then the message as plain text (no markup, control
    characters escaped)."""
    stderr.print(
        Text(label, style=style), Text(printable(message)), highlight=False, soft_wrap=True
    )


def _warn_line(message: Warning | str) -> None:
    _line("warning:", "bold yellow", message)


def _exits_cleanly(command: F) -> F:
    """Turn a BisectReproError into one line on stderr and exit code 2; warnings into one line
    each."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("default", RecordingWarning)
                # one line, not a source excerpt
                warnings.showwarning = lambda message, *_, **__: _warn_line(message)
                return command(*args, **kwargs)
        except BisectReproError as error:
            _line("error:", "bold red", error)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


Settings = Annotated[
    list[str],
    typer.Option(
        "--set", help="KEY=VALUE passed to the recipe; VALUE read as JSON when it parses as JSON."
    ),
]
NNodes = Annotated[
    str | None,
    typer.Option(
        "--nnodes", help="Nodes of a run of several (each runs the same command): torchrun's."
    ),
]
NodeRank = Annotated[
    str | None,
    typer.Option("--node-rank", help="This node's rank, torchrun's (with --rdzv-backend static)."),
]
Backend = Annotated[
    str | None,
    typer.Option("--rdzv-backend", help="torchrun's rendezvous backend on several nodes (c10d)."),
]
Endpoint = Annotated[
    str | None, typer.Option("--rdzv-endpoint", help="HOST:PORT where the nodes meet, torchrun's.")
]
Html = Annotated[
    Path | None,
    typer.Option(
        "--html", help="Also write a self-contained HTML report (plots included) to this file."
    ),
]


def _given(**options: str | None) -> list[str]:
    """The torchrun options given, as words (``--nnodes=2``)."""
    return [
        f"--{name.replace('_', '-')}={value}"
        for name, value in options.items()
        if value is not None
    ]


def _write_html(path: Path, document: str) -> None:
    from .report.html import write_html

    write_html(path, document)
    stderr.print(f"wrote {safe_text(path)}", highlight=False, soft_wrap=True)


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


@app.command("record", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@_exits_cleanly
def record_command(
    context: typer.Context,
    target: Annotated[
        str | None,
        typer.Argument(
            help="The recipe (path/to/file.py:function or package.module:function), "
            "or after -- a command: python train.py ARGS, torchrun ... train.py ARGS."
        ),
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", help="The run directory to write.")] = None,
    steps: Annotated[
        int | None,
        typer.Option(
            help="Number of training steps (a recipe: 100 by default; a script: all it takes)."
        ),
    ] = None,
    every: Annotated[
        int, typer.Option(help="Snapshot every K steps (and at the first and last).")
    ] = 10,
    checkpoint_every: Annotated[
        int, typer.Option(help="Full checkpoint every C steps (and at step 0).")
    ] = 100,
    settings: Settings = [],  # noqa: B006 - typer reads the default
    force: Annotated[bool, typer.Option(help="Overwrite an existing run.")] = False,
    quiet: Annotated[bool, typer.Option(help="No progress bar.")] = False,
    resume: Annotated[
        bool,
        typer.Option(
            help="Continue the interrupted run in --out from its last checkpoint (same options)."
        ),
    ] = False,
    on_error: Annotated[
        str,
        typer.Option(
            "--on-error",
            help="On a failed write: 'raise' stops training, 'warn' warns once and trains on "
            "unrecorded.",
        ),
    ] = "raise",
    nproc_per_node: Annotated[
        int | None,
        typer.Option(
            "--nproc-per-node",
            help="Record on N ranks, launched by torch.distributed.run (gloo on CPU, NCCL on "
            "CUDA).",
        ),
    ] = None,
    nnodes: NNodes = None,
    node_rank: NodeRank = None,
    rdzv_backend: Backend = None,
    rdzv_endpoint: Endpoint = None,
    against: Annotated[
        Path | None,
        typer.Option(
            "--against",
            help="Check each record against this run as it is written; stop at the first "
            "difference and compare (exit 1), or exit 0 when it matches.",
        ),
    ] = None,
    against_continue: Annotated[
        bool,
        typer.Option(
            "--against-continue",
            help="With --against: record the whole run, and compare at the end.",
        ),
    ] = False,
    stop_at_end: Annotated[
        bool,
        typer.Option(
            "--stop-at-end", help="With --against: stop at the last step of the --against run."
        ),
    ] = False,
    verdict: Annotated[
        bool,
        typer.Option(
            "--verdict/--no-verdict",
            help="With --against: compare the runs once the recording stops (--no-verdict: "
            "only stop).",
        ),
    ] = True,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="With --against: print the comparison as compare --json (the script's own "
            "output goes to stderr).",
        ),
    ] = False,
) -> None:
    """Run a recipe under the recorder and write a run directory (one folder per rank with
    --nproc-per-node); or record a script unchanged: bisect-repro record --out DIR -- python
    train.py ARGS. With --against A: stop at the first difference from A and compare."""
    if out is None:
        raise BisectReproError("record: give the run directory to write with --out DIR")
    _check_against_flags(
        against,
        given=against_continue or stop_at_end or as_json or not verdict,
        ranks=resume or nproc_per_node is not None,
    )
    if resume and force:
        raise BisectReproError(
            f"{out}: give --resume (continue the run) or --force (record it again), not both"
        )
    if target is None:
        raise BisectReproError(
            "record: give a recipe (path/to/file.py:function), or after -- the command to record: "
            "python train.py ARGS"
        )
    nodes = _given(
        nnodes=nnodes, node_rank=node_rank, rdzv_backend=rdzv_backend, rdzv_endpoint=rdzv_endpoint
    )
    if nodes and nproc_per_node is None:
        raise BisectReproError(
            "record: --nnodes and --rdzv-* launch ranks: give --nproc-per-node N with them"
        )
    if context.args or is_interpreter(target) or is_launcher([target]):  # a command, not a recipe
        command = parse_command([target, *context.args])
        if resume or nproc_per_node is not None or settings or nodes:
            raise BisectReproError(
                "record: --resume, --nproc-per-node, --nnodes, --rdzv-* and --set are for recipes; "
                "a script takes its own arguments "
                "(ranks: -- torchrun --nproc-per-node N train.py)"
            )
        _check_against_flags(against, given=False, ranks=command.nproc is not None)
        options = RecordOptions(
            steps=steps,
            every=every,
            checkpoint_every=checkpoint_every,
            force=force,
            on_error=on_error,  # type: ignore[arg-type]
        )
        plan = (
            _against(against, out, _command_code(command), against_continue, stop_at_end)
            if against is not None
            else None
        )
        code = record_script(command, out, options, plan, quiet=quiet, output_to_stderr=as_json)
        raise typer.Exit(
            _verdict_against(plan, out, as_json) if plan and verdict and not code else code
        )
    from .record.provenance import launch_info
    from .record.recipe import build, parse_settings
    from .record.recorder import record
    from .record.torchrun import record_ranks

    steps = 100 if steps is None else steps
    options = RecordOptions(
        steps=steps,
        every=every,
        checkpoint_every=checkpoint_every,
        force=force,
        on_error=on_error,  # type: ignore[arg-type]
    )
    config = parse_settings(settings)
    matched: list[int] = []
    plan = (
        _against(
            against,
            out,
            launch_info(target).get("code"),
            against_continue,
            stop_at_end,
            on_progress=matched.append,
        )
        if against is not None
        else None
    )
    trainee = build(target, config) if nproc_per_node is None else None  # the ranks build their own
    console = Console(stderr=True, quiet=quiet)
    started = time.perf_counter()
    with _progress(console) as progress:
        task = progress.add_task("recording", total=steps, extra="")

        def on_step(step: int, loss: float | None = None) -> None:
            rate = step / max(time.perf_counter() - started, 1e-9)
            shown = f"loss {loss:.4g}  " if loss is not None else ""
            if matched:
                shown += f"matches {against} up to step {matched[-1]}  "
            progress.update(task, completed=step, extra=f"{shown}{rate:.1f} steps/s")

        if trainee is not None:
            record(
                trainee,
                out,
                options,
                target=target,
                config=config,
                on_step=on_step,
                resume=resume,
                against=plan,
            )
        elif nproc_per_node is not None:  # the case left: the ranks build their own trainees
            launcher = launcher_options(nodes)
            record_ranks(
                target,
                out,
                options,
                config,
                nproc_per_node,
                resume=resume,
                on_progress=on_step,
                on_warning=_warn_line,
                nodes=launcher,
            )
    _print_written(console, out)
    if plan is not None and verdict:
        raise typer.Exit(_verdict_against(plan, out, as_json))


def _print_written(console: Console, out: Path) -> None:
    """What a recording wrote, in one line: steps, snapshots, checkpoints, and where it stopped
    when it is incomplete."""
    from .store.run import Run

    run = Run.open(out)
    ranks = [run.open_rank(r) for r in range(run.world_size)]
    incomplete = [
        f"rank {r.rank} at step {r.last_step}"
        if run.distributed
        else f"last complete step {r.last_step}"
        for r in ranks
        if not r.complete
    ]
    status = f" (incomplete: {', '.join(incomplete)})" if incomplete else ""
    where = f" on {run.world_size} ranks" if run.distributed else ""
    counts = (
        f"{len(run.steps)} steps, {len(run.snapshots)} snapshots, {len(run.checkpoints)} "
        "checkpoints"
    )
    console.print(f"wrote {safe_text(out)}{where}: {counts}{status}")


def _check_against_flags(against: Path | None, *, given: bool, ranks: bool) -> None:
    """The options that go with ``--against`` (``given``) need it; ranks (or a resume) refuse
    it."""
    if against is None and given:
        raise BisectReproError(
            "record: --against-continue, --stop-at-end, --no-verdict and --json go with "
            "--against A; give the run to record against"
        )
    if against is not None and ranks:
        raise BisectReproError(
            f"record: --against {against} records a new run of one process; drop --resume, "
            "--nproc-per-node and torchrun"
        )


def _command_code(command: ScriptCommand) -> dict[str, Any]:
    """The code a command runs, as its run's ``launch.code`` will name it."""
    if command.module is not None:
        return {"kind": "module", "module": command.module}
    return {"kind": "script", "path": command.path}


def _against(
    against: Path,
    out: Path,
    code: dict[str, Any] | None,
    keep_going: bool,
    stop_at_end: bool,
    *,
    on_progress: Callable[[int], None] | None = None,
) -> Against:
    """The reference of ``record --against``, checked before anything trains (a one-line error
    otherwise)."""
    from .record.against import Against
    from .record.reference import open_reference

    open_reference(against, out, code)
    return Against(
        run=against,
        keep_going=keep_going,
        stop_at_end=stop_at_end,
        on_progress=on_progress,
        on_note=lambda message: _line("note:", "bold", message),
    )


def _verdict_against(plan: Against, out: Path, as_json: bool) -> int:
    """``compare A B`` on the reference and the run just recorded: its verdict, its exit code."""
    from .store.run import Run

    if not Run.open(out).complete:
        raise BisectReproError(
            f"{out}: the recording did not finish, so it is not compared; run compare "
            f"{plan.run} {out} once it is complete"
        )
    result = _compare(Path(plan.run), out, replay=True, quiet=as_json)
    _show(result, as_json)
    return 0 if result.identical else 1


def _show(result: CompareResult, as_json: bool) -> None:
    """A comparison's verdict on stdout: one JSON object, or the text report."""
    if as_json:
        with timed("report"):
            sys.stdout.write(json.dumps(result.to_json(), indent=2) + "\n")
    else:
        _report(result)


@app.command("show")
@_exits_cleanly
def show_command(
    run: Annotated[Path, typer.Argument(help="A run directory.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    verify: Annotated[
        bool,
        typer.Option(
            help="Read and check every snapshot and checkpoint, not only the last snapshot."
        ),
    ] = False,
    html: Html = None,
) -> None:
    """What a run holds: steps, snapshots, checkpoints, config, environment, streams, losses."""
    from .diagnose.show.summary import run_summary
    from .report.html import check_html_path, run_losses, summary_html
    from .report.text import render_summary
    from .store.run import Run

    if html is not None:
        check_html_path(html)
    summary = run_summary(Run.open(run), verify=verify)
    if as_json:
        sys.stdout.write(json.dumps(summary.to_json(), indent=2) + "\n")
    else:
        render_summary(summary, stdout)
    if html is not None:
        _write_html(html, summary_html(summary, run_losses([run])[0]))


@app.command("compare")
@_exits_cleanly
def compare_command(
    run_a: Annotated[Path, typer.Argument(help="The first run directory.")],
    run_b: Annotated[Path, typer.Argument(help="The second run directory.")],
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object (schema bisect-repro/compare/2).")
    ] = False,
    no_replay: Annotated[
        bool, typer.Option("--no-replay", help="Compare the records only; import and run nothing.")
    ] = False,
    accept_changed_code: Annotated[
        bool,
        typer.Option(
            "--accept-changed-code",
            help="Replay a script or recipe even if it changed since it was recorded.",
        ),
    ] = False,
    trust: Annotated[
        bool,
        typer.Option(
            "--trust",
            help="Replay runs you did not record on this machine (their code runs here); read what "
            "runs first.",
        ),
    ] = False,
    html: Html = None,
    numerics: Annotated[
        bool,
        typer.Option(
            "--numerics",
            help="Measure run A's rounding envelope (another training of run A) even where the "
            "records explain the divergence.",
        ),
    ] = False,
) -> None:
    """Find the first step, layer and op where two runs diverge, with the cause, the evidence and
    the fix.

    The replay runs each run's own script or recipe again (what it runs is printed first). A run
    you did not record on this machine is replayed only with --trust or your yes at the prompt.
    Exit code 0: identical; 1: they diverge; 2: bad input.
    """
    from .report.html import check_html_path, comparison_html, run_losses

    if html is not None:
        check_html_path(html)
    result = _compare(
        run_a,
        run_b,
        replay=not no_replay,
        quiet=as_json,
        accept_changed_code=accept_changed_code,
        trust=trust,
        numerics=numerics,
    )
    _show(result, as_json)
    if html is not None:
        notes: list[str] = []
        page = run_stage(
            "HTML report",
            notes,
            lambda: comparison_html(result, run_losses([run_a, run_b])),
            None,
            f"{html} is not written",
        )
        if page is not None:
            _write_html(html, page)
        for note in notes:
            _warn_line(note)
    raise typer.Exit(0 if result.identical else 1)


def _report(result: CompareResult) -> None:
    """The text report; where rendering it fails, the verdict in plain lines and a note."""
    from .report.text import plain_verdict, render_comparison

    notes: list[str] = []
    run_stage(
        "report",
        notes,
        lambda: render_comparison(result, stdout),
        None,
        "the verdict follows in plain lines",
    )
    if notes:
        for line in plain_verdict(result):
            sys.stdout.write(line + "\n")
        for note in notes:
            _warn_line(note)


def _announce(prefix: str, spec: LaunchSpec) -> None:
    """What a replay runs, on stderr, as plain text (the spec escapes control characters)."""
    command, *details = spec.announcement()
    stderr.print(Text(f"{prefix}: {command}", style="dim"), highlight=False, soft_wrap=True)
    for detail in details:
        stderr.print(Text(f"  {detail}", style="dim"), highlight=False, soft_wrap=True)


def _consent(trust: bool) -> Consent:
    """Runs this user did not record here: replayed with --trust, or after a yes at a terminal."""

    def ask(foreign: Sequence[tuple[str, LaunchSpec]]) -> bool:
        if trust:
            return True
        if not (sys.stdin.isatty() and sys.stderr.isatty()):
            return False
        for label, spec in foreign:
            stderr.print(
                Text(f"Run {label} was not recorded by you on this machine.", style="bold yellow"),
                highlight=False,
            )
            _announce(f"replaying run {label} would run", spec)
        return typer.confirm("Run this code here to replay it?", default=False, err=True)

    return ask


def _compare(
    run_a: Path,
    run_b: Path,
    *,
    replay: bool,
    quiet: bool,
    accept_changed_code: bool = False,
    trust: bool = False,
    numerics: bool = False,
) -> CompareResult:
    from .diagnose.compare.compare import compare

    console = Console(stderr=True, quiet=quiet)

    # always, even with --json: nothing runs unannounced
    def announce(specs: list[LaunchSpec]) -> None:
        for label, spec in zip("AB", specs, strict=True):
            _announce(f"replaying run {label} by running", spec)

    with _progress(console, transient=True) as progress:
        task = progress.add_task("comparing", total=None, extra="")

        def on_progress(stage: str, done: int, total: int) -> None:
            progress.update(task, description=stage, completed=done, total=total)

        ask = _consent(trust)

        # no progress bar over the prompt
        def consent(foreign: Sequence[tuple[str, LaunchSpec]]) -> bool:
            progress.stop()
            try:
                return ask(foreign)
            finally:
                progress.start()

        result = compare(
            run_a,
            run_b,
            replay=replay,
            accept_changed_code=accept_changed_code,
            consent=consent,
            progress=on_progress,
            announce=announce,
            numerics=numerics,
        )
    return result


@app.command("demo")
@_exits_cleanly
def demo_command(
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Where to keep the two runs (default: a temporary folder)."),
    ] = None,
    steps: Annotated[int, typer.Option(help="Steps per run.")] = 20,
) -> None:
    """Record a recipe that really diverges on a CPU twice, and compare the two runs."""
    from .demo import record_pair
    from .report.text import render_comparison

    console = Console(stderr=True)
    console.print(
        "Recording two runs of a fully seeded embedding model (table\\[idx], four threads)..."
    )
    run_a, run_b = record_pair(out, steps=steps)
    console.print(f"Recorded {run_a} and {run_b}. Comparing them...")
    result = _compare(run_a, run_b, replay=True, quiet=False)
    render_comparison(result, stdout)
    stdout.print(f"\nTry it yourself: bisect-repro compare {run_a} {run_b} --json")


@app.command("doctor", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@_exits_cleanly
def doctor_command(
    context: typer.Context,
    target: Annotated[
        str | None,
        typer.Argument(
            help="The recipe (path/to/file.py:function or package.module:function), or after -- a "
            "script: python train.py ARGS."
        ),
    ] = None,
    steps: Annotated[int, typer.Option(help="Steps to train and re-run.")] = DEFAULT_STEPS,
    settings: Settings = [],  # noqa: B006 - typer reads the default
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object (schema bisect-repro/doctor/1).")
    ] = False,
) -> None:
    """Audit a recipe, or a script run unchanged (-- python train.py ARGS), for every known source
    of irreproducibility, proving each finding by a run.

    Without TARGET, audit this environment and process. Exit code 0: reproducible on this machine
    (warnings may remain); 1: not; 2: bad input.
    """
    from .diagnose.doctor.doctor import doctor
    from .record.recipe import parse_settings
    from .report.text import render_doctor

    console = Console(stderr=True, quiet=as_json)
    command = (
        [target, *context.args]
        if target is not None and (context.args or is_interpreter(target) or is_launcher([target]))
        else None
    )
    with console.status("doctor") as status:
        report = doctor(
            None if command else target,
            parse_settings(settings),
            steps=steps,
            progress=lambda stage: status.update(stage),
            command=command,
        )
    if as_json:
        sys.stdout.write(json.dumps(report.to_json(), indent=2) + "\n")
    else:
        render_doctor(report, stdout)
    raise typer.Exit(0 if report.reproducible else 1)


def main() -> None:
    """The console script. When the command is done, the objects alive are frozen out of the
    garbage collector (:func:`gc.freeze`): the interpreter's exit then skips collecting torch's
    and the records' objects; ``atexit`` handlers still run."""
    try:
        app()
    finally:
        gc.freeze()


if __name__ == "__main__":
    main()
