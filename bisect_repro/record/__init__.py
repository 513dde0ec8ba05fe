"""Record: recipes (``recipe``), the recorder that snapshots a training while it trains
(``recorder``) and its background writer (``background``)."""
