"""Replay: what a run may launch (``launch``), a run replaying in its own process steered from
here (``replica``, ``ranked`` for a distributed run, started by ``bootstrap``), what the replay
and the experiments ask of one (``interface``), and two runs replayed side by side
(``lockstep``)."""
