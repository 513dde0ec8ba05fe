"""Diagnose: ``compare`` two runs and ``doctor`` a recipe; the experiments that prove a cause, and
the one table of causes and fixes (``causes``)."""
