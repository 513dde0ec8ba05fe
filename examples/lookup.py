"""An embedding lookup written as ``table[idx]``, trained on two threads: its backward pass is
nondeterministic (``index_put_`` with accumulate). The same recipe ``bisect-repro demo`` uses.

    bisect-repro record examples/lookup.py:build --out runs/a --steps 20 --every 5
    bisect-repro record examples/lookup.py:build --out runs/b --steps 20 --every 5
    bisect-repro compare runs/a runs/b
    bisect-repro record examples/lookup.py:build --out runs/c --steps 20 --set deterministic=true
"""

from bisect_repro.demo import build

__all__ = ["build"]
