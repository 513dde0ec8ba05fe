"""Capture: what a training process is, as plain data: its tensors' content hashes, every random
stream, the data position, the environment. Nothing here writes or runs anything."""
