"""``compare``: two runs compared, where they first part and why, proven by experiment.

Read in this order: ``compare`` (the whole comparison, the entry), ``records`` and
``from_records`` (what the records say alone), ``rules`` (which cause a verdict may name: one
table), ``walk`` and ``placement`` (the replay to the divergent step), ``experiments`` with
``swaps``, ``reseeds``, ``rebuild`` and ``compiled`` (the re-runs that prove a cause), ``roles``
and ``settings`` (ranks' roles, non-tensor state), and ``verdict`` (the typed result, JSON only
at its ``to_json``).

Nothing here imports ``bisect_repro.diagnose.doctor``.
"""
