"""The hash's C kernel for the tests, and the switch between the hash's CPU paths.

The tests must check the kernel even where the package was installed without it, and in CI,
where ``pip install .`` puts the built kernel in site-packages while the tests import the package
from the checkout: :func:`c_kernel` takes the kernel beside the package if it is there, and
otherwise compiles ``_hash_c.c`` with the system's C compiler into a temporary folder (skipping
only where there is no compiler). :func:`build_kernel` builds variants, such as a kernel with a
wrong constant, to check that the property tests would catch one.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

import pytest

from bisect_repro.capture import _hash_cpu, hashing

SOURCE = Path(_hash_cpu.__file__).with_name("_hash_c.c")


def compiler(folder: Path) -> list[str] | None:
    """The C compiler command that setuptools would use, if it exists here and builds a shared
    library from a trivial source (``CC=/bin/false``, how the fallback install is tried, does
    not)."""
    command = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    if not command or not shutil.which(command[0]):
        return None
    probe = folder / "probe.c"
    probe.write_text("int probe(void) { return 1; }\n")
    done = subprocess.run(
        [*command, "-shared", "-fPIC", str(probe), "-o", str(folder / "probe.so")],
        capture_output=True,
        timeout=120,
    )
    return command if done.returncode == 0 else None


@pytest.fixture(scope="session")
def build_kernel(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., _hash_cpu.Kernel]:
    """Compile the kernel's source (with ``-D`` overrides) into a temporary library and load it."""
    folder = tmp_path_factory.mktemp("hash-kernel")
    cc = compiler(folder)
    if cc is None:
        pytest.skip("no working C compiler to build the hash kernel with")

    def build(**defines: str) -> _hash_cpu.Kernel:
        name = "_".join(f"{k}-{v}" for k, v in sorted(defines.items())) or "as-shipped"
        out = folder / f"{name}.so"
        if out.exists():  # built earlier in this session
            return _hash_cpu.Kernel(out)
        flags = [f"-D{k}={v}" for k, v in defines.items()]
        done = subprocess.run(
            [*cc, "-O2", "-shared", "-fPIC", "-pthread", *flags, str(SOURCE), "-o", str(out)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr  # a working compiler must build the kernel
        return _hash_cpu.Kernel(out)

    return build


@pytest.fixture(scope="session")
def c_kernel(request: pytest.FixtureRequest) -> _hash_cpu.Kernel:
    """The installed kernel where it sits beside the package, else one compiled here from source."""
    installed = _hash_cpu.load()
    if installed is not None:
        return installed
    return request.getfixturevalue("build_kernel")()


@pytest.fixture(scope="module", params=["c", "torch"])
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs a module's tests once through the C kernel and once through the torch-op path.

    In the run that checks the Triton kernel (``BISECT_REPRO_HASH_BACKEND=triton``, see
    test_hash_triton.py) the switch is left alone and the tests run once, through Triton."""
    if hashing._BACKEND == "triton":
        if request.param == "c":
            pytest.skip("this run checks the Triton kernel")
        yield "triton"
        return
    if request.param == "c":
        kernel = request.getfixturevalue("c_kernel")
        with (
            mock.patch.object(hashing, "_BACKEND", "c"),
            mock.patch.object(_hash_cpu, "load", lambda: kernel),
        ):
            yield "c"
    else:
        with mock.patch.object(hashing, "_BACKEND", "torch"):
            yield "torch"
