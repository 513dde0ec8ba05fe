"""A corpus of training scripts in the styles of well-known public ones (``tests/e2e/corpus/``),
recorded unchanged with ``bisect-repro record --out DIR -- python script.py ARGS`` and compared
with ``bisect-repro compare A B --json``, each with one bug planted the way a user hits it: a
flag, a reseed at an epoch's end, an edited data file, the second optimizer's setting, a worker
count, an unseeded split, a seed drawn at random, an edited config file.

Every case states the verdict derived from the planted bug (the truth), not from what the tool
prints. A case where the tool's verdict is wrong is marked ``xfail(strict=True)`` with what the
tool says instead, so the mark has to go when the tool is fixed. Every verdict is also checked
against the precondition of the cause it names (:func:`precondition_violations`): what the
records must show for that cause to be named at all.

Each distinct run is recorded once per module and each pair compared once; the recordings and
reports are shared by the tests that read them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import RandomSampler

from tests.rules_check import assert_rules_hold

CORPUS = Path(__file__).resolve().parent / "corpus"
CHAR_ARGS = ("--max-iters", "6")  # char_rnn.py: block 16, batch 8, seed 3407 (its defaults)


@dataclass(frozen=True)
class Run:
    """One recording: the command after ``--``, the copy of the corpus it runs in, extra environment."""

    command: tuple[str, ...]
    tree: str = "pristine"
    env: tuple[tuple[str, str], ...] = ()
    copy: int = 0  # a second recording of the same command (run A2)


@dataclass(frozen=True)
class Expected:
    """The truth about a pair. ``None`` leaves a field unchecked (where nothing in the bug fixes it)."""

    identical: bool = False
    step: int | None = None
    phase: str | None = None
    layer: str | None = None
    cause: str | None = None
    rng: tuple[str, ...] | None = None
    flag: str | None = None  # a config verdict names the flag (or key) that differs
    reseeded_at: str | None = None  # a reseed's call site: the text of its line in the script


@dataclass(frozen=True)
class Case:
    name: str
    a: Run
    b: Run
    expected: Expected
    why: str
    wrong: str | None = None  # what the tool says instead, while it is wrong
    precondition_broken: str | None = None  # what the verdict claims that its records contradict
    extra: dict[str, Any] = field(default_factory=dict)


def py(*args: str) -> tuple[str, ...]:
    return ("python", *args)


CASES = [
    Case(
        "classifier_gamma_flag",
        Run(py("mnist_classifier.py", "--epochs", "2")),
        Run(py("mnist_classifier.py", "--epochs", "2", "--gamma", "0.5")),
        Expected(step=6, phase="optimizer", cause="config", flag="--gamma"),
        "96 samples in batches of 16: 6 steps an epoch; StepLR lowers the lr after epoch 1, so Adadelta's update of "
        "step 6 (epoch 2's first) is the first to use 1.0*0.5 instead of 1.0*0.7; nothing else differs",
    ),
    Case(
        "vae_reseeded_after_sampling",
        Run(py("vae.py", "--epochs", "2")),
        Run(py("vae.py", "--epochs", "2", "--sample-seed", "-1")),
        Expected(step=5, phase="data", cause="rng_state", rng=("torch",), reseeded_at="torch.seed()"),
        "80 samples in batches of 16: 5 steps an epoch; sample() calls torch.seed() after epoch 1's evaluation, so "
        "epoch 2's shuffle, drawn from the global stream when its loader is iterated, is the first thing that differs",
    ),
    Case(
        "gan_generator_lr",
        Run(py("dcgan.py", "--niter", "1", "--manualSeed", "7")),
        Run(py("dcgan.py", "--niter", "1", "--manualSeed", "7", "--lrG", "0.0004")),
        Expected(step=0, phase="optimizer", cause="config", flag="--lrG"),
        "iteration 0 steps the discriminator's Adam (same lr) and then the generator's (0.0002 vs 0.0004): the "
        "generator's first update is the first difference",
        wrong="step 1, data, config (--lrG), inferred: the generator's optimizer is not followed, so its update at step 0 "
        "is seen only in the discriminator's input at step 1",
    ),
    Case(
        "gan_seed_flag_missing",
        Run(py("dcgan.py", "--niter", "1", "--manualSeed", "7")),
        Run(py("dcgan.py", "--niter", "1")),
        Expected(step=0, phase="init", cause="config", flag="--manualSeed"),
        "without --manualSeed the script seeds torch from random.randint(1, 10000): the weights differ at init",
    ),
    Case(
        "char_rnn_data_file_edited",
        Run(py("char_rnn.py", *CHAR_ARGS)),
        Run(py("char_rnn.py", *CHAR_ARGS), tree="edited_text"),
        Expected(step=2, phase="data", cause="data_content"),
        "run B's input.txt has one word reversed (same length, same characters, same vocabulary); the sampler is "
        "seeded, so the sample indices are equal and the first batch whose windows cover the word differs: the word is chosen to be "
        "first read by step 2",
    ),
    Case(
        "char_rnn_worker_count",
        Run(py("char_rnn.py", *CHAR_ARGS)),
        Run(py("char_rnn.py", *CHAR_ARGS, "--num-workers", "2")),
        Expected(identical=True),
        "the sampler has its own seeded generator and the dataset draws nothing: 4 or 2 workers load the same batches",
    ),
    Case(
        "seq2seq_worker_count",
        Run(py("seq2seq.py", "--epochs", "1")),
        Run(py("seq2seq.py", "--epochs", "1", "--workers", "2")),
        Expected(step=0, phase="data", cause="data_content"),
        "the dataset's token dropout draws from Python's random: in the main process (seeded by --seed) with 0 "
        "workers, in each worker (seeded by the loader's base seed) with 2; the shuffle is the same",
    ),
    Case(
        "regression_eval_draws_from_the_training_stream",
        Run(py("regression.py", "--steps", "6")),
        Run(py("regression.py", "--steps", "6", "--eval-every", "2")),
        Expected(step=2, phase="data", cause="config", flag="--eval-every"),
        "get_batch() draws from torch's global stream; with --eval-every 2 the evaluation after step 1 draws a batch "
        "of 256 from it, so step 2's training batch differs",
        wrong="step 1, optimizer: the evaluation inside step 1 draws 256 instead of 32 values from torch, and the replay "
        "places the difference there",
    ),
    Case(
        "random_split_seed_flag",
        Run(py("split_seeded.py", "--epochs", "1")),
        Run(py("split_seeded.py", "--epochs", "1", "--split-seed", "7")),
        Expected(step=0, phase="data", cause="config", flag="--split-seed"),
        "random_split's generator is seeded from --split-seed: another training subset from the first batch on "
        "(the loader's indices into the subset are the same)",
        wrong="step 0, data, data_content (inferred): the order is equal and the batch differs; the flag is not proven in the data path",
    ),
    Case(
        "numpy_split_unseeded",
        Run(py("tabular_numpy_split.py", "--epochs", "1")),
        Run(py("tabular_numpy_split.py", "--epochs", "1"), copy=1),
        Expected(step=0, phase="data", cause="rng_state", rng=("numpy",)),
        "set_seed() seeds random and torch, not NumPy; the hold-out split is np.random.permutation, so each run "
        "trains on other rows (standardised with other statistics) from the first batch",
        wrong="step 0, data, data_content: the order is equal and the batch differs; numpy is not named as the cause",
    ),
    Case(
        "seed_defaults_to_a_random_value",
        Run(py("bow_sentiment.py", "--epochs", "1")),
        Run(py("bow_sentiment.py", "--epochs", "1"), copy=1),
        Expected(step=0, phase="init", cause="config", flag="--seed"),
        "--seed defaults to random.randint(...) drawn from entropy: the parsed seed differs and the weights differ at init",
    ),
    Case(
        "config_file_edited",
        Run(py("config_train.py", "--config", "configs/base.json")),
        Run(py("config_train.py", "--config", "configs/base.json"), tree="edited_config"),
        Expected(step=0, phase="optimizer", cause="config", flag="weight_decay"),
        "run B's configs/base.json has weight_decay 0.05 instead of 0.01; AdamW's decay is applied in its first step",
    ),
    Case(
        "package_module_dropout_flag",
        Run(py("-m", "imgclf.train", "--epochs", "1")),
        Run(py("-m", "imgclf.train", "--epochs", "1", "--dropout", "0.3")),
        Expected(step=0, phase="forward", layer="drop", cause="config", flag="--dropout"),
        "the dropout probability is a flag of `python -m imgclf.train`: the first mask (and its scale) differs",
    ),
    Case(
        "accumulation_gradient_clipping_flag",
        Run(py("accumulate_ema.py", "--steps", "3")),
        Run(py("accumulate_ema.py", "--steps", "3", "--clip-grad", "0.5")),
        Expected(step=0, phase="optimizer", cause="config", flag="--clip-grad"),
        "two micro-batches accumulate the same gradients; their norm (about 370) is clipped to 0.5 before AdamW's first step in run B only",
    ),
]

SAME_TWICE = {  # the same command recorded twice (run A2)
    "classifier": Run(py("mnist_classifier.py", "--epochs", "2")),
    "gan_with_two_optimizers_and_workers": Run(py("dcgan.py", "--niter", "1", "--manualSeed", "7")),
    "package_module": Run(py("-m", "imgclf.train", "--epochs", "1")),
}


# --- the trees the runs execute in --------------------------------------------------------------


def window_batches(length: int, steps: int, block: int = 16, batch: int = 8, seed: int = 3407) -> list[set[int]]:
    """The text positions each of char_rnn.py's first batches reads: its sampler, rebuilt with the same seed."""
    generator = torch.Generator().manual_seed(seed)
    sampler = iter(RandomSampler(range(length - block), replacement=True, num_samples=int(1e10), generator=generator))
    batches = [[next(sampler) for _ in range(batch)] for _ in range(steps)]
    return [{p for start in starts for p in range(start, start + block + 1)} for starts in batches]


def reverse_a_word_first_read_at(text: str, step: int) -> tuple[str, int]:
    """``text`` with one word reversed whose changed characters are first read by batch ``step``."""
    covered = window_batches(len(text), step + 1)
    for match in re.finditer(r"[a-z]{4,}", text):
        word = match.group()
        changed = {match.start() + i for i in range(len(word)) if word[i] != word[::-1][i]}
        first = next((k for k, positions in enumerate(covered) if changed & positions), None)
        if first == step:
            return text[: match.start()] + word[::-1] + text[match.end() :], step
    raise AssertionError(f"no word of input.txt is first read at step {step}")


def _tree(root: Path, name: str) -> Path:
    folder = root / name
    if folder.exists():
        return folder
    shutil.copytree(CORPUS, folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(folder / "data" / "input.txt", folder / "input.txt")
    if name == "edited_text":
        edited, _ = reverse_a_word_first_read_at((folder / "input.txt").read_text(), step=2)
        (folder / "input.txt").write_text(edited)
    if name == "edited_config":
        config = json.loads((folder / "configs" / "base.json").read_text())
        config["optimizer"]["weight_decay"] = 0.05
        (folder / "configs" / "base.json").write_text(json.dumps(config, indent=2))
    return folder


# --- recording and comparing through the CLI, each once -----------------------------------------


def _cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bisect_repro.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )  # fmt: skip


class Corpus:
    """Records each distinct run and compares each pair once, on first use."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.runs: dict[Run, Path] = {}
        self.reports: dict[tuple[Run, Run], tuple[int, dict[str, Any], str]] = {}

    def recorded(self, run: Run) -> Path:
        if run not in self.runs:
            tree = _tree(self.root, run.tree)
            out = self.root / "runs" / f"r{len(self.runs)}"
            env = {**os.environ, **dict(run.env)}
            done = _cli("record", "--quiet", "--out", str(out), "--", *run.command, cwd=tree, env=env)
            assert done.returncode == 0, (run, done.stderr[-2000:])
            self.runs[run] = out
        return self.runs[run]

    def compared(self, a: Run, b: Run) -> tuple[int, dict[str, Any], str]:
        if (a, b) not in self.reports:
            first, second = self.recorded(a), self.recorded(b)
            done = _cli("compare", str(first), str(second), "--json", cwd=self.root)
            assert done.returncode in (0, 1), done.stderr[-2000:]
            self.reports[a, b] = (done.returncode, json.loads(done.stdout), done.stderr)
        return self.reports[a, b]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    return Corpus(tmp_path_factory.mktemp("corpus"))


# --- what a verdict must satisfy -----------------------------------------------------------------


def _at_or_before(value: int | None, step: int) -> bool:
    return value is not None and value <= step


def _moved_streams_differ(report: dict[str, Any]) -> bool:
    verdict = report["verdict"]
    named, unused = set(verdict["rng"]), set(report.get("unused_streams", []))
    seen = {stream for entry in report["timeline"] for stream in entry["streams"]}
    return bool(named) and not named & unused and (bool(verdict["reseeded"]) or named <= seen)


PRECONDITIONS: dict[str, tuple[str, Any]] = {
    "data_order": ("the sample indices differ at or before the step",
                   lambda r: _at_or_before(r["first_log_difference"]["order"], r["verdict"]["step"])),
    "data_content": ("the sample indices are equal up to the step and the batch differs at or before it",
                     lambda r: not _at_or_before(r["first_log_difference"]["order"], r["verdict"]["step"])
                     and _at_or_before(r["first_log_difference"]["batch"], r["verdict"]["step"])),
    "config": ("a config value, an argument of the command line or an optimizer setting differs, and is named",
               lambda r: bool(r["config_diff"]) or bool(r["verdict"]["config_keys"])),
    "rng_state": ("a stream the run draws from differs or was reseeded",
                  _moved_streams_differ),
    "environment": ("an environment setting or variable differs",
                    lambda r: bool(r["environment_diff"]) or bool(r["verdict"]["environment_keys"])),
    "nondeterministic_op": ("a run differs from itself",
                            lambda r: any(e["experiment"] == "self_rerun" and e["outcome"] == "differs" for e in r["verdict"]["evidence"])),
}  # fmt: skip


def precondition_violations(report: dict[str, Any]) -> list[str]:
    """What a compare report's verdict claims that its own records contradict (empty: none)."""
    verdict = report["verdict"]
    if verdict is None:
        return []
    problems = []
    rule = PRECONDITIONS.get(verdict["cause"])
    if rule is not None and not rule[1](report):
        problems.append(f"cause {verdict['cause']} needs: {rule[0]}")
    if verdict["phase"] == "data":
        first = report["first_log_difference"]
        if not (_at_or_before(first["order"], verdict["step"]) or _at_or_before(first["batch"], verdict["step"])):
            problems.append("phase data needs the sample indices or the batch to differ at or before the step")
    lines = [verdict["explanation"], verdict["fix"], *(e["detail"] for e in verdict["evidence"])]
    problems += [f"prints None: {line}" for line in lines if re.search(r"\bNone\b", line)]
    return problems


def _line_of(script: Path, text: str) -> int:
    return next(number for number, line in enumerate(script.read_text().splitlines(), 1) if text in line)


def check_verdict(case: Case, corpus: Corpus) -> None:
    code, report, stderr = corpus.compared(case.a, case.b)
    expected, verdict = case.expected, report["verdict"]
    if expected.identical:
        assert code == 0 and report["identical"] and verdict is None, (verdict, report["notes"])
        return
    assert code == 1 and verdict is not None, stderr[-2000:]
    got = (verdict["step"], verdict["phase"], verdict["cause"])
    assert got == (expected.step, expected.phase, expected.cause), (verdict, report["notes"])
    if expected.layer is not None:
        assert verdict["layer"] == expected.layer, verdict
    if expected.rng is not None:
        assert tuple(verdict["rng"]) == expected.rng, verdict
    if expected.flag is not None:
        named = " ".join([verdict["explanation"], *verdict["config_keys"]])
        assert expected.flag.lstrip("-") in named, verdict
    if expected.reseeded_at is not None:
        script = _tree(corpus.root, case.b.tree) / case.b.command[1]
        assert verdict["reseeded"][0]["where"] == f"{script}:{_line_of(script, expected.reseeded_at)}", verdict


def _marked(case: Case, reason: str | None) -> Any:
    marks = [pytest.mark.slow]
    if reason is not None:
        marks.append(pytest.mark.xfail(strict=True, reason=reason))
    return pytest.param(case, id=case.name, marks=marks)


# --- the tests -----------------------------------------------------------------------------------


@pytest.mark.parametrize("case", [_marked(case, case.wrong) for case in CASES])
def test_the_verdict_on_a_corpus_script_is_the_planted_bug(case: Case, corpus: Corpus) -> None:
    check_verdict(case, corpus)


@pytest.mark.parametrize("case", [_marked(case, case.precondition_broken) for case in CASES])
def test_every_corpus_verdict_satisfies_its_causes_precondition(case: Case, corpus: Corpus) -> None:
    _, report, _ = corpus.compared(case.a, case.b)
    assert precondition_violations(report) == [], (report["verdict"], report["first_log_difference"], report["config_diff"])
    assert_rules_hold(report)  # the package's own rule table (bisect_repro/diagnose/rules.py) agrees


@pytest.mark.slow
@pytest.mark.parametrize("run", list(SAME_TWICE.values()), ids=list(SAME_TWICE))
def test_the_same_command_recorded_twice_is_identical(run: Run, corpus: Corpus) -> None:
    code, report, stderr = corpus.compared(run, Run(run.command, run.tree, run.env, copy=1))
    assert code == 0 and report["identical"] and report["verdict"] is None, (report["verdict"], stderr[-2000:])


def test_the_planted_word_is_first_read_by_the_step_the_case_expects() -> None:
    text = (CORPUS / "data" / "input.txt").read_text()
    edited, step = reverse_a_word_first_read_at(text, step=2)
    changed = {i for i, (x, y) in enumerate(zip(text, edited, strict=True)) if x != y}
    batches = window_batches(len(text), 3)
    assert len(edited) == len(text) and sorted(set(edited)) == sorted(set(text)) and changed
    assert [bool(changed & batch) for batch in batches] == [False, False, True] and step == 2


def _fake_report(cause: str, **records: Any) -> dict[str, Any]:
    verdict = {"step": 5, "phase": "data", "cause": cause, "rng": [], "reseeded": [], "config_keys": [], "environment_keys": [],
               "explanation": "step 5 differs", "fix": "seed it", "evidence": []}  # fmt: skip
    report = {"verdict": verdict, "first_log_difference": {"order": None, "batch": 5, "loss": None}, "config_diff": {},
              "environment_diff": {}, "timeline": [], "unused_streams": []}  # fmt: skip
    for key, value in records.items():
        (verdict if key in verdict else report)[key] = value
    return report


@pytest.mark.parametrize(
    ("report", "broken"),
    [
        (_fake_report("data_order"), "cause data_order needs"),  # the GAN's verdict: order None
        (_fake_report("data_order", first_log_difference={"order": 5, "batch": 5, "loss": None}), None),
        (_fake_report("data_content", first_log_difference={"order": 5, "batch": 5, "loss": None}), "cause data_content needs"),
        (_fake_report("data_content"), None),
        (_fake_report("config"), "cause config needs"),
        (_fake_report("config", config_diff={"--gamma": [0.7, 0.5]}, config_keys=["--gamma"]), None),
        (_fake_report("config", config_keys=["--gamma"]), None),
        (_fake_report("rng_state", rng=["numpy"], unused_streams=["numpy"], timeline=[{"streams": ["numpy"]}]), "cause rng_state needs"),
        (_fake_report("rng_state", rng=["torch"], reseeded=[{"where": "vae.py:9"}]), None),
        (_fake_report("unknown", first_log_difference={"order": None, "batch": None, "loss": None}), "phase data needs"),
        (_fake_report("unknown", explanation="equal up to step None"), "prints None"),
    ],
)
def test_the_precondition_check_catches_a_verdict_its_records_contradict(report: dict[str, Any], broken: str | None) -> None:
    problems = precondition_violations(report)
    assert (broken is None and problems == []) or (broken is not None and any(broken in p for p in problems)), problems


DOCTOR_REASON = "doctor takes no command: `doctor -- python script.py ARGS` exits 2, got unexpected extra arguments"


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=DOCTOR_REASON)
@pytest.mark.parametrize(
    "command",
    [py("mnist_classifier.py", "--epochs", "1"), py("-m", "imgclf.train", "--epochs", "1")],
    ids=["classifier", "package_module"],
)
def test_doctor_on_a_seeded_corpus_script_finds_it_reproducible(command: tuple[str, ...], corpus: Corpus) -> None:
    done = _cli("doctor", "--json", "--", *command, cwd=_tree(corpus.root, "pristine"))
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    report = json.loads(done.stdout)
    assert report["reproducible"] and not [f for f in report["findings"] if f["severity"] == "error"], report


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=DOCTOR_REASON)
def test_doctor_on_a_corpus_script_with_an_unseeded_split_finds_numpy(corpus: Corpus) -> None:
    done = _cli("doctor", "--json", "--", *py("tabular_numpy_split.py", "--epochs", "1"), cwd=_tree(corpus.root, "pristine"))
    assert done.returncode == 1, (done.stdout[-2000:], done.stderr[-2000:])
    report = json.loads(done.stdout)
    found = [f for f in report["findings"] if f["severity"] == "error"]
    assert not report["reproducible"] and any("numpy" in json.dumps(f) for f in found), report
