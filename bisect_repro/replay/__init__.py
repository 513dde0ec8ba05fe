"""Replay: a recorded run rebuilt and stepped again (``replica``), every tensor of a step hashed in
execution order (``trace``), and which module an op runs in (``scope``)."""
