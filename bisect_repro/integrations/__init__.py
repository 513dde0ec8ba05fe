"""Integrations with training frameworks, each behind an optional extra."""
