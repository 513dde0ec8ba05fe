"""A tiny image classifier laid out as a package: ``python -m imgclf.train``."""
