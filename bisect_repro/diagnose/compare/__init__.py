"""``compare``: two runs compared, where they first part and why, proven by experiment.

Read in this order: ``compare`` (the whole comparison, the entry), ``records``, ``differences``
and ``from_records`` (what the records say alone: the config, environment and code that differ,
and the verdict), ``causes`` (the cause registry: one module per cause, everything about it in
one entry) with ``signals`` and ``rules`` (the records' exact signals, and which cause a verdict
may name), ``walk`` and ``placement`` (the replay to the divergent step), ``experiments`` with
``draft``, ``swaps``, ``reseeds``, ``rebuild`` and ``compiled`` (the re-runs that prove a cause),
``roles`` and ``settings`` (ranks' roles, non-tensor state), and ``verdict`` (the typed result,
JSON only at its ``to_json``).

Nothing here imports ``bisect_repro.diagnose.doctor``.
"""
