"""Report: what the CLI prints and writes, from the typed results: rich text, JSON and a
self-contained HTML page."""
