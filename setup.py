"""The optional C kernel of the CPU hash; everything else about the package is in pyproject.toml.

The kernel is built where a C compiler is at hand. ``optional=True`` turns a failed build (no
compiler, an unsupported platform) into a warning, and the package then hashes with torch ops:
``pip install .`` works with or without a compiler.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "bisect_repro.capture._hash_c",
            sources=["bisect_repro/capture/_hash_c.c"],
            # vector levels are chosen at run time: never -march=native
            extra_compile_args=["-O3", "-pthread"],
            extra_link_args=["-pthread"],
            optional=True,
        )
    ]
)
