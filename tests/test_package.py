"""The package root: its public names, imported on first use, and what importing it costs."""

from __future__ import annotations

import json
import subprocess
import sys

import bisect_repro


def _fresh(code: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_importing_the_package_imports_no_torch_until_a_public_name_is_used() -> None:
    found = _fresh(
        "import json, sys, bisect_repro\n"
        "before = 'torch' in sys.modules\n"
        "bisect_repro.Recorder\n"
        "print(json.dumps({'before': before, 'after': 'torch' in sys.modules}))\n"
    )
    assert found == {"before": False, "after": True}


def test_record_is_the_function_even_when_its_subpackage_was_imported_first() -> None:
    found = _fresh(
        "import json, bisect_repro.record.script, bisect_repro.record.recorder\n"
        "import bisect_repro\n"
        "from bisect_repro import record\n"
        "print(json.dumps([record.__module__, bisect_repro.record is record, callable(record)]))\n"
    )
    assert found == ["bisect_repro.record.recorder", True, True]


def test_every_public_name_resolves_and_an_unknown_one_is_an_attribute_error() -> None:
    for name in bisect_repro.__all__:
        assert getattr(bisect_repro, name) is not None, name
    assert set(bisect_repro.__all__) <= set(dir(bisect_repro))
    try:
        bisect_repro.not_a_name  # noqa: B018
    except AttributeError as error:
        assert "not_a_name" in str(error)
    else:
        raise AssertionError("an unknown name resolved")
