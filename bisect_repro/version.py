"""The package's version, in a module of its own: any layer may read it without importing the
package root."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
