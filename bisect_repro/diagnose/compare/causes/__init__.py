"""The causes ``compare`` may name, one module each, gathered in one registry.

Each cause is one :class:`~bisect_repro.diagnose.compare.causes.entry.CauseEntry` in a module of
its own here (``rng_state``, ``data_order``, ``config``, ...): its value and title, what it means,
its precondition on the records' signals, the signals by which the records alone name it with
their rank in the precedence, the experiment that proves it, what is said without that
experiment, its fix and the words of its explanation. :mod:`.registry` gathers the entries
(``REGISTRY``) and derives from them everything that treats causes one by one: the rules, the
precedence of the records' verdict, the fix and explanation dispatch, the titles, the docs' tables
(:mod:`.tables`).

To add a cause: its member in :class:`~.cause.Cause`, a module here with its ``ENTRY``, the entry
in :data:`.registry.ENTRIES`, its tests, and the docs' tables written again
(``python -m bisect_repro.diagnose.compare.causes.tables``); CONTRIBUTING.md walks through it.

Only :class:`~.cause.Cause` is imported here: the entries read the records, the signals and the
verdict, which import the enum.
"""

from .cause import Cause

__all__ = ["Cause"]
