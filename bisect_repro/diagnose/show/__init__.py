"""``show``: what one run directory holds, read without running anything.

``summary`` reads the run into a :class:`~bisect_repro.diagnose.show.summary.RunSummary` (JSON
only at its ``to_json``); ``drift`` compares the data-parallel copies of a distributed run across
ranks, from its records.

Nothing here imports ``bisect_repro.diagnose.compare``, ``numerics`` or ``doctor``.
"""
