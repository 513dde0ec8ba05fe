"""Store: state trees to safetensors + zstandard and back (``codec``), the run directory read
(``run``) and written crash-safely (``writer``). Never pickle."""
