"""The first call of MKL's vector math is made when bisect_repro is imported, on every thread."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from bisect_repro.capture import vml


def test_importing_the_package_made_the_first_call_on_a_share_for_every_thread() -> None:
    if not torch.backends.mkl.is_available():
        pytest.skip("torch built without MKL: nothing to settle")
    assert vml.settled >= 2 * vml.GRAIN * torch.get_num_threads()


def test_a_fresh_process_has_settled_before_the_code_it_records_runs() -> None:
    probe = (
        "import torch; torch.set_num_threads(2)\n"
        "calls = []\n"
        "sqrt = torch.Tensor.sqrt\n"
        "torch.Tensor.sqrt = lambda self: calls.append(self.numel()) or sqrt(self)\n"
        "import bisect_repro\n"
        "from bisect_repro.capture import vml\n"
        "print(json.dumps({'calls': calls, 'settled': vml.settled, 'mkl': "
        "torch.backends.mkl.is_available()}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", f"import json\n{probe}"], capture_output=True, text=True, check=True
    )
    seen = json.loads(done.stdout.splitlines()[-1])
    if not seen["mkl"]:
        pytest.skip("torch built without MKL: nothing to settle")
    assert seen["calls"] == [8192, 8192] and seen["settled"] == 8192, seen
