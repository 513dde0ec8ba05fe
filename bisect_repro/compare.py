"""Comparing two runs: where they first differ, and why, established by experiment.

1. The records: model structure, config, environment, the step logs (data order, batch content,
   loss) and the snapshots, which bound the divergence between the last equal snapshot and the
   first divergent one.
2. The replay: both runs rebuilt in this process, restored from the last checkpoint at or before
   the last equal snapshot, and stepped in lockstep with every tensor traced (see ``trace.py``).
   The first traced tensor that differs names the step, the phase and the layer; the replayed
   states are checked against the recorded hashes along the way.
3. The experiments, each a re-run of that one step from the state both runs started it with:
   each run against itself (a difference means a nondeterministic op), run B with run A's random
   streams (the difference vanishes: an unseeded stream), run B with run A's environment settings
   (vanishes: the environment). An op-level trace of the step names the first op whose inputs
   match and whose output differs, and the two copies of the first divergent tensor give the size
   of the difference.

``compare`` returns the ``bisect-repro/compare/1`` JSON object documented in the README.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from . import causes, env
from .errors import BisectReproError, RecipeError, RunFormatError
from .replay import Replica, StepStart, StepTrace, streams_deciding_init
from .rng import stream_digest
from .store import Run
from .trace import first_difference, first_divergent_op

__all__ = ["compare", "difference_stats"]

Progress = Callable[[str, int, int], None]
_RERUNS = 4  # a nondeterministic kernel may agree with itself by chance: try a few times
_SELF_CHECKS = 2  # re-runs of each run against itself; a deterministic step pays for all of them


def difference_stats(a: torch.Tensor, b: torch.Tensor) -> dict[str, float | int | None]:
    """Max absolute difference, max distance in units of the last place, fraction of elements that differ."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return {"max_abs_diff": None, "max_ulp": None, "fraction_differing": 1.0}
    differing = a != b if not a.dtype.is_floating_point else ~((a == b) | (a.isnan() & b.isnan()))
    fraction = float(differing.float().mean()) if a.numel() else 0.0
    max_abs = float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
    max_ulp = None
    ints = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}
    if a.dtype in ints and a.numel():

        def ordered(t: torch.Tensor) -> torch.Tensor:
            bits = t.contiguous().view(ints[t.dtype]).to(torch.int64)
            top = 1 << (t.element_size() * 8 - 1)
            return torch.where(bits < 0, -(bits + top), bits)  # sign-magnitude to a monotone integer line

        max_ulp = int((ordered(a) - ordered(b)).abs().max())
    return {"max_abs_diff": max_abs, "max_ulp": max_ulp, "fraction_differing": round(fraction, 6)}


def _verdict(**fields: Any) -> dict[str, Any]:
    base = dict.fromkeys(
        ("step", "phase", "layer", "tensor", "op", "cause", "max_abs_diff", "max_ulp", "fraction_differing", "explanation", "fix")
    )
    return {**base, "rng": [], **fields}


def _structure_difference(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    for kind in ("parameters", "buffers"):
        ta, tb = a.get(kind, {}), b.get(kind, {})
        for name in dict.fromkeys([*ta, *tb]):
            if ta.get(name) != tb.get(name):
                return name
    return None


def _described(model: dict[str, Any], name: str) -> Any:
    return model.get("parameters", {}).get(name) or model.get("buffers", {}).get(name) or "absent"


def _timeline(a: Run, b: Run) -> list[dict[str, Any]]:
    rows = []
    for step in sorted(set(a.snapshots) & set(b.snapshots)):
        sa, sb = a.snapshot(step), b.snapshot(step)
        differing = [n for n in dict.fromkeys([*sa["hashes"], *sb["hashes"]]) if sa["hashes"].get(n) != sb["hashes"].get(n)]
        streams = sorted(
            n for n in set(sa["streams"]) & set(sb["streams"]) if stream_digest(sa["streams"][n]) != stream_digest(sb["streams"][n])
        )
        rows.append(
            {
                "step": step,
                "equal": not differing,
                "differing_tensors": len(differing),
                "first_tensor": differing[0] if differing else None,
                "streams": streams,
            }
        )
    return rows


def _first_log_differences(a: Run, b: Run) -> dict[str, int | None]:
    found: dict[str, int | None] = {"order": None, "batch": None, "loss": None}
    for step in sorted(set(a.steps) & set(b.steps)):
        for key in found:
            if found[key] is None and a.steps[step].get(key) != b.steps[step].get(key):
                found[key] = step
    return found


def _stream_diff(sa: dict[str, Any], sb: dict[str, Any]) -> list[str]:
    return sorted(n for n in set(sa) & set(sb) if stream_digest(sa[n]) != stream_digest(sb[n]))


class _Bisection:
    """The replay and the experiments, on two replicas."""

    def __init__(self, a: Run, b: Run, result: dict[str, Any], progress: Progress | None) -> None:
        self.a, self.b, self.result = a, b, result
        self.progress = progress or (lambda *args: None)

    def run(self, last_equal: int, end: int) -> dict[str, Any] | None:
        started = time.perf_counter()
        ca = max((s for s in self.a.checkpoints if s <= last_equal), default=None)
        cb = max((s for s in self.b.checkpoints if s <= last_equal), default=None)
        info = self.result["replay"]
        if ca is None or cb is None:
            info["note"] = f"no checkpoint at or before step {last_equal} in {self.a.path if ca is None else self.b.path}"
            return None
        try:
            replica_a, replica_b = Replica(self.a, "A"), Replica(self.b, "B")
        except RecipeError as error:
            info["note"] = str(error)
            self.result["notes"].append(f"no replay: {error}")
            return None
        try:
            info.update(performed=True, from_step=min(ca, cb), faithful=True)
            total = end + 1 - min(ca, cb)
            lockstep_from = self._fast_forward(replica_a, replica_b, ca, cb, last_equal)
            verdict = None
            for step in range(lockstep_from, end + 1):
                self.progress("replaying", step + 1 - min(ca, cb), total)
                self._check_faithful(replica_a)
                self._check_faithful(replica_b)
                start_a, start_b = replica_a.fetch(), replica_b.fetch()
                trace_a, trace_b = replica_a.advance(start_a), replica_b.advance(start_b)
                if first_difference(trace_a.entries, trace_b.entries) is not None:
                    verdict = self._explain(
                        replica_a, replica_b, start_a, start_b, *self._full_traces(replica_a, replica_b, start_a, start_b, trace_a, trace_b)
                    )
                    break
            info["replayed_steps"] = replica_a.step - min(ca, cb)
            return verdict
        finally:
            info["seconds"] = round(time.perf_counter() - started, 3)
            replica_a.close()
            replica_b.close()

    def _fast_forward(self, ra: Replica, rb: Replica, ca: int, cb: int, last_equal: int) -> int:
        """Restore both replicas and run them, untraced, to the last step the records say they share.

        Returns the step the lockstep comparison starts from: ``last_equal``; or, when the replayed
        states already differ there (the replay parted earlier than the recorded runs did), the
        later of the two checkpoints, after restoring both again.
        """
        for target in (last_equal, max(ca, cb)):
            ra.restore(ca)
            rb.restore(cb)
            for replica in (ra, rb):
                while replica.step < target:
                    self._check_faithful(replica)
                    replica.skip()
            if target == max(ca, cb) or ra.state_hashes() == rb.state_hashes():
                return target
            self.result["notes"].append(
                f"the replayed runs already differ at step {last_equal}, where the records agree; replaying step by step from {max(ca, cb)}"
            )
        return max(ca, cb)

    def _full_traces(
        self, ra: Replica, rb: Replica, sa: StepStart, sb: StepStart, la: StepTrace, lb: StepTrace
    ) -> tuple[StepTrace, StepTrace, int]:
        """Trace the divergent step in full; a nondeterministic kernel may need a few tries to differ again."""
        for _ in range(_RERUNS):
            ta, tb = ra.run_step(sa), rb.run_step(sb)
            index = first_difference(ta.entries, tb.entries)
            if index is not None:
                return ta, tb, index
        self.result["notes"].append(f"the full trace of step {sa.step} did not differ again; the step is located by the state after it")
        index = first_difference(la.entries, lb.entries)
        assert index is not None
        return la, lb, index

    def _check_faithful(self, replica: Replica) -> None:
        if replica.faithful_at(replica.step) is False:
            self.result["replay"]["faithful"] = False
            self.result["notes"].append(
                f"replay of {replica.run.path} does not reproduce its recorded state at step {replica.step}: "
                "its environment cannot be reproduced here, or the recipe is nondeterministic"
            )

    def _explain(self, ra: Replica, rb: Replica, sa: StepStart, sb: StepStart, ta: StepTrace, tb: StepTrace, index: int) -> dict[str, Any]:
        entry = ta.entries[index] if index < len(ta.entries) else tb.entries[index]
        fields: dict[str, Any] = {"step": sa.step, "phase": entry.phase, "layer": entry.layer, "tensor": entry.tensor}
        self.progress("experimenting", 0, 1)
        if entry.phase == "data":
            cause = "data_order" if entry.tensor == "batch.indices" else "data_content"
            fields.update(cause=cause, fix=causes.data_fix(cause, self.a.meta.get("loader", {})))
            fields["explanation"] = (
                f"the runs fed different samples at step {sa.step}"
                if cause == "data_order"
                else f"the same samples gave different batch contents at step {sa.step}"
            )
            return fields
        environment_diff = self.result["environment_diff"]
        if self._differs_from_itself(ra, sa, ta) or self._differs_from_itself(rb, sb, tb):
            determinism = [k for k in environment_diff if "determinis" in k or "cudnn" in k or "CUBLAS" in k]
            cause = "environment" if determinism else "nondeterministic_op"
        else:
            cause = self._experiment(ra, rb, sa, sb, ta, fields)
        op, inputs_match, stats = self._locate(ra, rb, sa, sb, index)
        fields.update(op=op, **stats, cause=cause)
        self._advise(fields, inputs_match)
        return fields

    def _differs_from_itself(self, replica: Replica, start: StepStart, trace: StepTrace) -> bool:
        return any(first_difference(trace.entries, replica.run_step(start).entries) is not None for _ in range(_SELF_CHECKS))

    def _experiment(self, ra: Replica, rb: Replica, sa: StepStart, sb: StepStart, ta: StepTrace, fields: dict[str, Any]) -> str:
        streams = _stream_diff(sa.streams, sb.streams)
        if streams and first_difference(ta.entries, rb.run_step(sb, streams=sa.streams).entries) is None:
            culprits = [
                n
                for n in streams
                if first_difference(ta.entries, rb.run_step(sb, streams={**sb.streams, n: sa.streams[n]}).entries) is None
            ]
            fields["rng"] = culprits if len(streams) > 1 and culprits else streams
            return "rng_state"
        if self.result["environment_diff"] and first_difference(ta.entries, rb.run_step(sb, environment=ra.environment).entries) is None:
            return "environment"
        return "config" if self.result["config_diff"] else "unknown"

    def _locate(self, ra: Replica, rb: Replica, sa: StepStart, sb: StepStart, index: int) -> tuple[str | None, bool, dict[str, Any]]:
        op, inputs_match, stats = None, False, {}
        for _ in range(_RERUNS):
            xa, xb = ra.run_step(sa, keep={index}, ops=True), rb.run_step(sb, keep={index}, ops=True)
            if index in xa.kept and index in xb.kept:
                stats = difference_stats(xa.kept[index], xb.kept[index])
            found = first_divergent_op(xa.ops or [], xb.ops or [])
            if found is not None:
                op, inputs_match = found[0].op, found[1]
            if found is not None and stats.get("fraction_differing"):
                break
        return op, inputs_match, stats

    def _advise(self, fields: dict[str, Any], inputs_match: bool) -> None:
        cause, where = fields["cause"], f"step {fields['step']}, {fields['phase']} pass, {fields['tensor']}"
        op = f" (op {fields['op']})" if fields["op"] else ""
        if cause == "nondeterministic_op":
            fields["explanation"] = f"the run differs from itself when replayed: {where}{op} gives different results on identical inputs"
            fields["fix"] = causes.op_fix(fields["op"])
        elif cause == "rng_state":
            fields["explanation"] = (
                f"the runs draw from random streams in different states ({', '.join(fields['rng'])}): "
                f"{where}{op} differs, and with run A's streams run B matches"
            )
            fields["fix"] = causes.stream_fix(fields["rng"], resumed=bool((self.b.meta.get("options") or {}).get("resumed_from")))
        elif cause == "environment":
            keys = list(self.result["environment_diff"])
            fields["explanation"] = (
                f"the runs' settings differ ({', '.join(keys)}): {where}{op} differs, and under run A's settings run B matches"
            )
            fields["fix"] = causes.environment_fix(keys)
        elif cause == "config":
            diff = self.result["config_diff"]
            fields["explanation"] = f"the runs were built with different settings ({', '.join(diff)}): first visible at {where}{op}"
            fields["fix"] = "record both runs with the same --set values: " + ", ".join(
                f"{k}: {v[0]!r} vs {v[1]!r}" for k, v in diff.items()
            )
        else:
            fields["explanation"] = f"{where}{op} differs, yet neither the streams, the environment nor the config explain it"
            fields["fix"] = (
                "look for state the recipe keeps outside the model and optimizer (module globals, caches, time- or entropy-based values)"
            )
        if fields["op"] and not inputs_match and cause != "nondeterministic_op":
            fields["explanation"] += "; the op's inputs already differed (state outside the traced tensors)"


def compare(path_a: Path | str, path_b: Path | str, *, replay: bool = True, progress: Progress | None = None) -> dict[str, Any]:
    """Compare two runs; the ``bisect-repro/compare/1`` object (see the module docstring)."""
    a, b = Run.open(path_a), Run.open(path_b)
    if a.meta["format"] != b.meta["format"]:
        raise RunFormatError(
            b.path / "run.json",
            f"format {b.meta['format']} differs from {a.path}'s format {a.meta['format']}",
            "re-record both runs with one bisect-repro version",
        )
    config_a, config_b = a.meta.get("config", {}), b.meta.get("config", {})
    result: dict[str, Any] = {
        "schema": "bisect-repro/compare/1",
        "runs": [str(a.path), str(b.path)],
        "identical": False,
        "verdict": None,
        "config_diff": {
            k: [config_a.get(k), config_b.get(k)] for k in dict.fromkeys([*config_a, *config_b]) if config_a.get(k) != config_b.get(k)
        },
        "environment_diff": env.diff(a.meta.get("environment", {}), b.meta.get("environment", {})),
        "snapshots": {"last_equal": None, "first_divergent": None},
        "replay": {"performed": False, "from_step": None, "replayed_steps": 0, "faithful": None, "seconds": 0.0},
        "timeline": [],
        "first_log_difference": {},
        "notes": [],
    }
    moved = _structure_difference(a.meta.get("model", {}), b.meta.get("model", {}))
    if moved is not None:
        layer = moved.rpartition(".")[0] or None
        shape_a, shape_b = (_described(run.meta["model"], moved) for run in (a, b))
        advice = "record both with the same --set values" if result["config_diff"] else "check the recipe's code and versions"
        result["verdict"] = _verdict(
            step=0, phase="init", layer=layer, tensor=moved, cause="structure",
            explanation=f"the models differ in structure: {moved} is {shape_a} in run A and {shape_b} in run B",
            fix=f"compare runs of the same model: {advice}",
        )  # fmt: skip
        return result
    timeline = result["timeline"] = _timeline(a, b)
    if not timeline:
        raise BisectReproError(f"{b.path}: has no snapshot at a step that {a.path} has; the runs cannot be compared")
    logs = result["first_log_difference"] = _first_log_differences(a, b)
    divergent = next((row for row in timeline if not row["equal"]), None)
    equal_rows = [row for row in timeline if row["equal"] and (divergent is None or row["step"] < divergent["step"])]
    result["snapshots"] = {
        "last_equal": equal_rows[-1]["step"] if equal_rows else None,
        "first_divergent": divergent["step"] if divergent else None,
    }
    log_steps = [s for s in logs.values() if s is not None]
    if divergent is None and not log_steps:
        result["identical"] = True
        if any(row["streams"] for row in timeline):
            result["notes"].append(
                "the runs' tensors match, but some random streams differ: " + ", ".join(sorted({s for r in timeline for s in r["streams"]}))
            )
        return result
    if not equal_rows:
        result["verdict"] = _init_verdict(a, b, timeline[0], result, replay)
        return result
    end = min([*(s for s in log_steps), *([divergent["step"] - 1] if divergent else [])])
    verdict = _Bisection(a, b, result, progress).run(equal_rows[-1]["step"], end) if replay else None
    if verdict is None and replay and result["replay"]["performed"]:
        result["notes"].append("the replay did not reproduce the divergence; the verdict below is from the records alone")
    result["verdict"] = _verdict(**verdict) if verdict else _records_verdict(a, b, result, end)
    return result


def _init_verdict(a: Run, b: Run, row: dict[str, Any], result: dict[str, Any], replay: bool) -> dict[str, Any]:
    step, tensor = row["step"], row["first_tensor"]
    fields: dict[str, Any] = {
        "step": step,
        "phase": "init",
        "tensor": tensor,
        "layer": tensor.rpartition(".")[0] or None if tensor else None,
    }
    if step in a.checkpoints and step in b.checkpoints and tensor in a.meta["model"]["parameters"]:
        fields.update(difference_stats(a.checkpoint(step)["model"][tensor], b.checkpoint(step)["model"][tensor]))
    if row["streams"]:
        resumed = bool((b.meta.get("options") or {}).get("resumed_from"))
        streams = row["streams"]
        fields["explanation"] = (
            f"the runs start from different states ({tensor} differs at step {step}) and their random streams differ: "
            "the initialisation is not seeded alike"
        )
        if replay and not resumed and a.meta.get("target"):
            deciding = streams_deciding_init(a, streams)
            if deciding:
                streams = deciding
                fields["explanation"] += f"; rebuilding the recipe with {', '.join(deciding)} fixed gives equal parameters"
            elif deciding is None:
                fields["explanation"] += (
                    "; the recipe's parameters differ even with every global stream fixed: it draws from the OS or the clock"
                )
        fields.update(cause="rng_state", rng=streams, fix=causes.stream_fix(streams, resumed=resumed))
    elif result["config_diff"]:
        fields.update(
            cause="config",
            explanation=f"{tensor} differs at step {step}; the runs were built with different settings",
            fix="record both runs with the same --set values",
        )
    elif result["environment_diff"]:
        keys = list(result["environment_diff"])
        fields.update(
            cause="environment", explanation=f"{tensor} differs at step {step}; the environments differ", fix=causes.environment_fix(keys)
        )
    else:
        fields.update(
            cause="unknown",
            explanation=f"{tensor} differs at step {step} while the streams, config and environment match",
            fix="look for initialisation from entropy (time, os.urandom, torch.seed())",
        )
    return _verdict(**fields)


def _records_verdict(a: Run, b: Run, result: dict[str, Any], end: int) -> dict[str, Any]:
    logs, timeline = result["first_log_difference"], result["timeline"]
    last = result["snapshots"]["last_equal"]
    streams = next((row["streams"] for row in timeline if row["step"] == last), [])
    if logs["order"] is not None and logs["order"] <= end:
        cause, step, phase = "data_order", logs["order"], "data"
    elif logs["batch"] is not None and logs["batch"] <= end:
        cause, step, phase = "data_content", logs["batch"], "data"
    else:
        step, phase = end, None
        cause = (
            "rng_state" if streams else "environment" if result["environment_diff"] else "config" if result["config_diff"] else "unknown"
        )
    fixes = {
        "data_order": lambda: causes.data_fix("data_order", a.meta.get("loader", {})),
        "data_content": lambda: causes.data_fix("data_content", a.meta.get("loader", {})),
        "rng_state": lambda: causes.stream_fix(streams),
        "environment": lambda: causes.environment_fix(list(result["environment_diff"])),
        "config": lambda: "record both runs with the same --set values",
        "unknown": lambda: "replay the runs (without --no-replay) to find the op",
    }
    explanation = f"from the records alone: the runs first differ at or before step {step} (last equal snapshot {last})"
    return _verdict(
        step=step, phase=phase, cause=cause, rng=streams if cause == "rng_state" else [], explanation=explanation, fix=fixes[cause]()
    )
