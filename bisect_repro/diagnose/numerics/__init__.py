"""The ``numerics`` part of ``compare``: whether two runs differ by rounding only.

``numerics`` measures the distance between the runs' weights snapshot by snapshot and decides,
``envelope`` measures by experiment how far rounding alone moves run A, and ``numerics_result``
is the typed result ``compare --json`` writes under ``numerics``.

Nothing here imports ``bisect_repro.diagnose.doctor``.
"""
