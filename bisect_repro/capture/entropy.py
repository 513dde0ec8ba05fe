"""What a seeding call from entropy produced, and feeding it back to the same call in a replay.

A call that seeds a stream from the OS or the clock (see :mod:`bisect_repro.capture.seeding`)
produces a value, recorded in the step log with the call (``value``):

=========================  ===========================================
============================== call                       value
given back in a replay by =========================  ===========================================
============================== ``torch.seed()``           the seed it returned (0 to 2**64 - 1)
``torch.manual_seed(value)`` ``torch.cuda.seed()``,     ``torch.cuda.initial_seed()`` after it,
``torch.cuda.manual_seed`` / ``torch.cuda.seed_all()``  where CUDA is initialised
``manual_seed_all(value)`` ``random.seed()``,         the generator's state after it
``setstate`` ``random.Random.seed()``   (:func:`mt_state`)
``np.random.seed()``       the legacy generator's state after it        ``np.random.set_state``
``np.random.default_rng()``  the entropy of its ``SeedSequence``        ``default_rng(value)``
                           (0 to 2**128 - 1)
=========================  ===========================================
==============================

:class:`EntropyFeed` holds, in a replaying process, the calls a run recorded from the step it was
restored at on, in order. A call made while step ``s`` runs takes the first recorded call of step
``s`` not yet given, when that call was the same (the same call as written, at the same call site):
the stream is then seeded with the recorded value, and the run replays exactly. Each recorded value
is given once: a step run again in the same process (an experiment) draws from entropy as usual,
unless the process is rewound to the step (:meth:`EntropyFeed.give_again`).

Where the guarantees stop: a call of another kind or call site than the recorded one, and a call
beyond those recorded (a replay that goes further, or makes a call the run did not), draws as
usual; the call says which (``replayed``). CUDA's seed is seen only where CUDA was initialised
when the call was made. Calls made before the Recorder was built are not recorded: the replay
restores every stream from the checkpoint instead.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

__all__ = ["FEED_OUTCOMES", "EntropyFeed", "RecordedEntropy", "check_value", "give", "produced"]

_MT_WORDS = 624
_MT_HEX = _MT_WORDS * 8

FEED_OUTCOMES = {
    "recorded": "given the value the run recorded",
    "beyond": "beyond what the run recorded: drew from entropy as usual",
    "other": "the run recorded another call there (another kind or call site): drew from entropy "
    "as usual",
    "kept": "left its stream as it was (an experiment)",
}
"""What a replay did with an entropy call (the call's ``replayed``), in words."""


def mt_state(words: Any, pos: int, gauss: float | None) -> dict[str, Any]:
    """A Mersenne Twister's state as JSON: its 624 words as hex, its position, a cached Gaussian."""
    return {
        "mt19937": np.asarray(words, dtype=">u4").tobytes().hex(),
        "pos": int(pos),
        "gauss": None if gauss is None else float(gauss),
    }


def _words(value: Mapping[str, Any]) -> list[int]:
    return [int(w) for w in np.frombuffer(bytes.fromhex(value["mt19937"]), dtype=">u4")]


def _python_state(value: Mapping[str, Any]) -> tuple[Any, ...]:
    return (3, (*_words(value), value["pos"]), value["gauss"])


def _numpy_state(value: Mapping[str, Any]) -> tuple[Any, ...]:
    gauss = value["gauss"]
    return (
        "MT19937",
        np.array(_words(value), dtype=np.uint32),
        value["pos"],
        int(gauss is not None),
        gauss or 0.0,
    )


def _of_python(generator: random.Random) -> dict[str, Any]:
    _, internal, gauss = generator.getstate()
    return mt_state(internal[:-1], internal[-1], gauss)


def _cuda_seed() -> int | None:
    return int(torch.cuda.initial_seed()) if torch.cuda.is_initialized() else None


def produced(label: str, result: Any, args: tuple[Any, ...]) -> Any:
    """The value a call from entropy produced (``None`` where it cannot be seen)."""
    if label == "torch.seed":
        return int(result)
    if label in ("torch.cuda.seed", "torch.cuda.seed_all"):
        return _cuda_seed()
    if label == "random.seed":
        return _of_python(random._inst)
    if label == "random.Random.seed":
        return _of_python(args[0])
    if label == "np.random.seed":
        _, words, pos, has_gauss, gauss = np.random.get_state(legacy=True)
        return mt_state(words, int(pos), float(gauss) if has_gauss else None)
    if label == "np.random.default_rng":
        entropy = getattr(getattr(result.bit_generator, "seed_seq", None), "entropy", None)
        return int(entropy) if isinstance(entropy, int) else None
    return None


def give(label: str, value: Any, original: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """Make the call ``label`` seed its stream with a recorded ``value``; what the call returns."""
    if label == "torch.seed":
        torch.random.manual_seed(value)  # not the watched name: not a call of the code's
        return value
    if label == "torch.cuda.seed":
        torch.cuda.manual_seed(value)
        return None
    if label == "torch.cuda.seed_all":
        torch.cuda.manual_seed_all(value)
        return None
    if label == "random.seed":
        random.setstate(_python_state(value))
        return None
    if label == "random.Random.seed":
        args[0].setstate(_python_state(value))
        return None
    if label == "np.random.seed":
        np.random.set_state(_numpy_state(value))
        return None
    return original(value)  # np.random.default_rng


def _is_int(value: Any, bits: int) -> bool:
    return type(value) is int and 0 <= value < 1 << bits


def _is_mt(value: Any) -> bool:
    if not isinstance(value, dict) or set(value) != {"mt19937", "pos", "gauss"}:
        return False
    words, pos, gauss = value["mt19937"], value["pos"], value["gauss"]
    try:
        hex_ok = (
            isinstance(words, str) and len(words) == _MT_HEX and bytes.fromhex(words) is not None
        )
    except ValueError:
        hex_ok = False
    gauss_ok = gauss is None or (isinstance(gauss, float) and abs(gauss) < float("inf"))
    return hex_ok and _is_int(pos, 10) and pos <= _MT_WORDS and gauss_ok


_VALID: dict[str, tuple[Callable[[Any], bool], str]] = {
    "torch.seed": (lambda v: _is_int(v, 64), "an integer from 0 to 2**64 - 1"),
    "torch.cuda.seed": (lambda v: _is_int(v, 64), "an integer from 0 to 2**64 - 1"),
    "torch.cuda.seed_all": (lambda v: _is_int(v, 64), "an integer from 0 to 2**64 - 1"),
    "random.seed": (
        _is_mt,
        "a Mersenne Twister state (mt19937: 4992 hex digits, pos: 0 to 624, gauss: a number or "
        "null)",
    ),
    "random.Random.seed": (
        _is_mt,
        "a Mersenne Twister state (mt19937: 4992 hex digits, pos: 0 to 624, gauss: a number or "
        "null)",
    ),
    "np.random.seed": (
        _is_mt,
        "a Mersenne Twister state (mt19937: 4992 hex digits, pos: 0 to 624, gauss: a number or "
        "null)",
    ),
    "np.random.default_rng": (lambda v: _is_int(v, 128), "an integer from 0 to 2**128 - 1"),
}


def label_of(call: str) -> str:
    """``torch.seed`` of ``torch.seed()``."""
    return call.partition("(")[0]


def check_value(call: str, value: Any) -> str | None:
    """What is wrong with a recorded ``value`` of ``call`` (``None``: nothing, or no value)."""
    if value is None:
        return None
    valid = _VALID.get(label_of(call))
    if valid is None:
        return f"{call} records no value"
    return None if valid[0](value) else f"is not {valid[1]}"


@dataclass(frozen=True)
class RecordedEntropy:
    """One recorded call from entropy with its value."""

    step: int
    call: str
    where: str | None
    value: Any


@dataclass
class EntropyFeed:
    """The recorded calls of a run, given back in order (see the module docstring)."""

    recorded: list[RecordedEntropy]
    step: Callable[[], int]
    """The step running now."""
    kept_from: int | None = None
    """From this step on, every call leaves its stream as it is (``kept``): the experiment that
    shows what a run computes without its reseeds."""
    given: set[int] = field(default_factory=set)

    @classmethod
    def of_steps(
        cls,
        steps: Mapping[int, Mapping[str, Any]],
        start: int,
        step: Callable[[], int],
        *,
        kept_from: int | None = None,
    ) -> EntropyFeed:
        """The calls with a value in a run's step records (``steps.jsonl``) from ``start`` on."""
        recorded = [
            RecordedEntropy(s, c["call"], c.get("where"), c["value"])
            for s in sorted(steps)
            if s >= start
            for c in steps[s].get("seeded") or []
            if c.get("entropy") is True and c.get("value") is not None
        ]
        return cls(recorded, step, kept_from)

    def take(self, call: str, where: str | None) -> tuple[Any, str]:
        """The recorded value for this call now, and what is done (a key of
        :data:`FEED_OUTCOMES`)."""
        now = self.step()
        if self.kept_from is not None and now >= self.kept_from:
            return None, "kept"
        index = next(
            (i for i, r in enumerate(self.recorded) if r.step == now and i not in self.given), None
        )
        if index is None:
            return None, "beyond"
        found = self.recorded[index]
        if (found.call, found.where) != (call, where):
            return None, "other"
        self.given.add(index)
        return found.value, "recorded"

    def give_again(self, step: int) -> None:
        """Give the calls recorded from ``step`` on once more (a step run again as a fresh
        process replayed to it would run it)."""
        self.given = {i for i in self.given if self.recorded[i].step < step}
