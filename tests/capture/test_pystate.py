"""The Python counters a step reads: found in a module's globals and its functions' closures, saved,
put back in place, and hashed only where runs can agree."""

from __future__ import annotations

import json
import types

from bisect_repro.capture.pystate import MAX_ITEMS, PythonState, Scope, caller_scope, is_small

SOURCE = """
import time
iter_num = 0
best = 1.5
t0 = time.time()
flags = {"warm": False, "seen": [1, 2]}
name = "run-a"
big = list(range(1000))

def make_step():
    count = {"n": 0}
    label = "x"

    def step(batch):
        count["n"] += 1
        return count["n"]

    return step

step = make_step()

def advance():
    global iter_num
    iter_num += 1
"""


def module() -> types.ModuleType:
    made = types.ModuleType("user_train")
    exec(compile(SOURCE, "user_train.py", "exec"), made.__dict__)
    return made


def test_counters_in_globals_and_closures_are_found_and_other_values_are_not() -> None:
    found = PythonState(Scope(module().__dict__)).state_dict()
    assert set(found["globals"]) == {"iter_num", "best", "t0", "flags"}
    assert found["cells"] == {"make_step.<locals>.step.count": {"n": 0}}


def test_a_saved_state_is_put_back_in_place_and_survives_json() -> None:
    made = module()
    state = PythonState(Scope(made.__dict__))
    made.step(None), made.advance()
    saved = json.loads(json.dumps(state.state_dict()))
    flags, closure_dict = made.flags, made.step.__closure__[0].cell_contents
    for _ in range(3):
        made.step(None), made.advance()
    made.flags["warm"] = True
    state.load_state_dict(saved)
    # the closure counter is back at 1, then counts on
    assert made.iter_num == 1 and made.step(None) == 2
    assert made.flags == {"warm": False, "seen": [1, 2]}
    # updated in place
    assert made.flags is flags and made.step.__closure__[0].cell_contents is closure_dict


def test_hostile_saved_state_changes_nothing_it_should_not() -> None:
    made = module()
    state = PythonState(Scope(made.__dict__))
    state.load_state_dict(
        {
            "globals": {
                "iter_num": "import os",
                "name": 5,
                "missing": 1,
                "best": [0] * (MAX_ITEMS + 1),
                "flags": {"warm": object()},
            },
            "cells": {"make_step.<locals>.step.count": "x", "other.cell": 1},
        }
    )
    assert (made.iter_num, made.name, made.best, made.flags["warm"]) == (0, "run-a", 1.5, False)
    assert "missing" not in made.__dict__ and made.step(None) == 1
    state.load_state_dict(None)
    state.load_state_dict({"globals": [], "cells": 3})
    assert made.iter_num == 0


def test_small_values() -> None:
    assert (
        is_small(3)
        and is_small(2.5)
        and is_small(True)
        and is_small({"a": [1, 2]})
        and is_small((1, 2))
    )
    assert (
        not is_small("text")
        and not is_small({1: 2})
        and not is_small([[[1]]])
        and not is_small(list(range(MAX_ITEMS + 1)))
    )
    assert not is_small(None) and not is_small(object())


def test_a_helper_held_in_a_local_variable_counts_through_its_closure() -> None:
    made = module()

    def main() -> PythonState:
        helper = made.make_step()  # a local of the loop's function, not a global
        helper(None)
        return PythonState(caller_scope())

    state = main()
    assert state.state_dict()["cells"]["make_step.<locals>.step.count"] == {"n": 1}
