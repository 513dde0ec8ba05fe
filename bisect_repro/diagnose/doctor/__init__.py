"""``doctor``: one recipe or script audited for every known source of irreproducibility.

Read in this order: ``doctor`` (the audit, the entry), ``subjects`` (what is audited: a recipe
or a script, as a maker of fresh processes), ``probe`` (two processes trained and compared),
``checks`` (steps run again in one process), ``audit`` (the settings read from the environment)
and ``findings`` (the typed result, JSON only at its ``to_json``).

Nothing here imports ``bisect_repro.diagnose.compare``, ``numerics`` or ``show``: what ``doctor``
shares with ``compare`` lives at the top of ``bisect_repro.diagnose``.
"""
