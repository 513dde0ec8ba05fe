"""Diagnose: what the three reading commands decide, one subpackage each.

- ``compare/``: two runs compared, where they first part and why, proven by experiment
  (entry: :func:`bisect_repro.diagnose.compare.compare.compare`).
- ``numerics/``: part of ``compare``'s answer, whether the runs differ by rounding only, read
  against an envelope measured by experiment.
- ``doctor/``: one recipe or script audited for every known source of irreproducibility
  (entry: :func:`bisect_repro.diagnose.doctor.doctor.doctor`).
- ``show/``: what one run directory holds (entry:
  :func:`bisect_repro.diagnose.show.summary.run_summary`).

Shared by them, here: the fix for each kind of thing that makes runs differ, in words
(``advice``), whether a step repeats from the same state (``selfcheck``), how large a tensor's
difference is (``difference``) and the helpers of the results' JSON forms (``jsonform``). The
causes ``compare`` names are its own: one registry, a module per cause
(:mod:`bisect_repro.diagnose.compare.causes`).

Imports between the parts run one way (``tests/test_layering.py`` checks it): the shared modules
import no subpackage; ``doctor/`` imports nothing of ``compare/``, ``numerics/`` or ``show/``, and
none of them imports ``doctor/``. ``compare/`` and ``numerics/`` use each other's modules
(the verdict holds the numerics; the numerics read the records), without a cycle between modules.
"""
