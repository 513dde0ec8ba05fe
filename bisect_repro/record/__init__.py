"""Record: recipes (``recipe``), the recorder (``recorder``) and its recording session
(``session``, with ``options``), the background writer (``background``), what a run records of
its launch (``provenance``), a run directory shared by ranks (``directory``), ``torchrun``, and
scripts recorded unchanged (``script``, driven by ``autohooks``)."""
