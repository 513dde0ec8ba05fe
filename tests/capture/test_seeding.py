"""The seeding watch names who seeds a stream, from where, and whether from entropy; with a fixed
seed, entropy seeding repeats; several watches at once leave the functions as they found them."""

from __future__ import annotations

import os
import random
import sys
import tempfile

import numpy as np
import torch

from bisect_repro.capture.seeding import SeedingCall, SeedingWatch


def test_each_seeding_call_is_noted_with_its_stream_and_call_site() -> None:
    watch = SeedingWatch().install()
    try:
        line = sys._getframe().f_lineno + 1
        torch.seed()
        random.seed(3)
        np.random.default_rng()
    finally:
        watch.uninstall()
    calls = [(c.stream, c.call, c.entropy) for c in watch.calls]
    assert calls[0] == ("torch", "torch.seed()", True) and calls[1] == (
        "python",
        "random.seed(3)",
        False,
    )
    assert calls[2] == ("new numpy Generator", "np.random.default_rng()", True)
    assert watch.calls[0].where == f"{__file__}:{line}"


def test_the_standard_library_seeding_its_own_private_random_is_not_noted() -> None:
    watch = SeedingWatch().install()
    try:
        # tempfile seeds a private Random() from entropy, as mkstemp does
        next(tempfile._RandomNameSequence())
        mine = random.Random()
    finally:
        watch.uninstall()
    assert [(c.stream, c.call, c.entropy) for c in watch.calls] == [
        ("random.Random", "random.Random.seed()", True)
    ]
    assert mine.random() != random.Random().random()


def test_a_private_random_made_by_torchs_compiler_or_at_a_librarys_import_is_not_noted() -> None:
    """Dynamo makes ``random.Random()`` instances while it traces (a step compiled again on a re-run
    would otherwise read as a step that seeds from entropy differently each time)."""
    inside = os.path.join(os.path.dirname(torch.__file__), "_dynamo", "variables", "misc.py")
    watch = SeedingWatch().install()
    try:
        exec(compile("import random\nrandom.Random()\n", inside, "exec"), {})
        installed = os.path.join(
            os.path.dirname(os.path.dirname(torch.__file__)), "some_library", "recipes.py"
        )
        # at import, module level
        exec(compile("import random\n_private = random.Random()\n", installed, "exec"), {})
        random.Random()
    finally:
        watch.uninstall()
    assert [(c.call, c.entropy) for c in watch.calls] == [("random.Random.seed()", True)]
    assert watch.calls[0].where is not None and watch.calls[0].where.startswith(__file__)


def test_a_fixed_seed_makes_entropy_seeding_repeat() -> None:
    watch = SeedingWatch(fixed=7).install()
    try:
        draws = []
        for _ in range(2):
            torch.seed()
            draws.append(torch.rand(3))
    finally:
        watch.uninstall()
    assert torch.equal(draws[0], draws[1])
    torch.seed()
    assert not torch.equal(torch.rand(3), draws[0])  # uninstalled: entropy again


def test_watches_installed_and_removed_in_any_order_restore_the_functions() -> None:
    originals = (torch.seed, torch.manual_seed, random.seed, np.random.seed, random.Random.seed)
    first, second = SeedingWatch().install(), SeedingWatch().install()
    assert torch.seed is not originals[0]
    torch.manual_seed(1)
    first.uninstall()
    torch.manual_seed(2)
    second.uninstall()
    assert (
        torch.seed,
        torch.manual_seed,
        random.seed,
        np.random.seed,
        random.Random.seed,
    ) == originals
    assert [c.call for c in first.calls] == ["torch.manual_seed(1)"]
    assert [c.call for c in second.calls] == ["torch.manual_seed(1)", "torch.manual_seed(2)"]


def test_a_seeding_call_names_its_call_site_only_when_it_is_known() -> None:
    known = SeedingCall("torch", "torch.seed()", True, "train.py:9")
    unknown = SeedingCall("torch", "torch.seed()", True, None)
    assert str(known) == "torch.seed() at train.py:9" and str(unknown) == "torch.seed()"
    assert known.describe(lambda part: f"<{part}>") == "<torch.seed()> at <train.py:9>"
    assert unknown.describe(lambda part: f"<{part}>") == "<torch.seed()>"


def test_a_seeding_call_reads_back_from_its_json() -> None:
    call = SeedingCall("numpy", "np.random.seed()", True, "x.py:1")
    assert SeedingCall.from_json(call.to_json()) == call
    # as a step log holds it
    logged = {"stream": "torch", "call": "torch.seed()", "entropy": True, "where": None}
    assert str(SeedingCall.from_json(logged)) == "torch.seed()"
    assert SeedingCall.from_json({"call": "torch.seed()", "where": ""}) == SeedingCall(
        "", "torch.seed()", False, None
    )
