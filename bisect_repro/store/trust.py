"""Whether a run is this user's own, as written: its launch and every file a replay restores.

A replay runs the code a run names and puts into that process what the run's checkpoints hold
(module globals and counters, the data position, random streams). So a run is *yours* only when
``run.json``'s launch claim carries this user's signature and every snapshot and checkpoint is
named by an index line carrying this user's MAC over that line (its name, size and checksum) and
the run's signature (:mod:`bisect_repro.store.signing`): a file whose bytes changed no longer
matches its checksum, and a line whose checksum changed no longer matches its MAC.

A run that is not yours (recorded by someone else, unsigned, or with any file edited since) is
replayed only with the user's consent; :attr:`Provenance.edited` names the files that broke it.

Where the guarantees stop: the step logs are compared, never restored, and are not signed; a
file is checked when the run is opened for a verdict, and read again (by checksum) when used.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import BisectReproError
from . import signing
from .run import Run, rank_folder

__all__ = ["Provenance", "provenance"]


@dataclass(frozen=True)
class Provenance:
    """Who wrote a run: ``signed`` (its launch claim is this user's) and the files ``edited``
    since."""

    signed: bool
    edited: tuple[str, ...] = ()

    @property
    def yours(self) -> bool:
        return self.signed and not self.edited


def provenance(run: Run) -> Provenance:
    """The provenance of every rank of ``run``; see the module docstring."""
    run = run.shifted(-run.offset)  # the steps its index lines were signed with
    raw = run.meta.raw
    if not signing.verify(raw):
        return Provenance(False)
    edited: list[str] = []
    for rank in range(run.world_size):
        try:
            opened = run if rank == run.rank else run.open_rank(rank)
        except BisectReproError:
            edited.append(f"{rank_folder(rank)}/")
            continue
        for entry in (*opened.snapshots.values(), *opened.checkpoints.values()):
            if not signing.verify_line(raw, rank, entry.line(), entry.mac):
                edited.append(f"{rank_folder(rank)}/{entry.file}")
    return Provenance(True, tuple(edited))
