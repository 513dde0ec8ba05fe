"""How large a difference is: the two copies of a tensor compared element by element."""

from __future__ import annotations

import torch

__all__ = ["difference_stats", "histogram"]


def difference_stats(
    a: torch.Tensor, b: torch.Tensor
) -> dict[str, float | int | dict[str, int] | None]:
    """Max absolute difference, max distance in units of the last place, fraction of elements that
    differ."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return {"max_abs_diff": None, "max_ulp": None, "fraction_differing": 1.0}
    differing = a != b if not a.dtype.is_floating_point else ~((a == b) | (a.isnan() & b.isnan()))
    fraction = float(differing.float().mean()) if a.numel() else 0.0
    max_abs = float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
    max_ulp = None
    ints = {
        torch.float64: torch.int64,
        torch.float32: torch.int32,
        torch.float16: torch.int16,
        torch.bfloat16: torch.int16,
    }
    if a.dtype in ints and a.numel():

        def ordered(t: torch.Tensor) -> torch.Tensor:
            bits = t.contiguous().view(ints[t.dtype]).to(torch.int64)
            top = 1 << (t.element_size() * 8 - 1)
            # sign-magnitude to a monotone integer line
            return torch.where(bits < 0, -(bits + top), bits)

        max_ulp = int((ordered(a) - ordered(b)).abs().max())
    return {
        "max_abs_diff": max_abs,
        "max_ulp": max_ulp,
        "fraction_differing": round(fraction, 6),
        "histogram": histogram(a, b),
    }


def histogram(a: torch.Tensor, b: torch.Tensor) -> dict[str, int] | None:
    """How many elements differ by about each power of ten (``"1e-07": 12``), over the differing
    ones."""
    if a.shape != b.shape or a.dtype != b.dtype or not a.dtype.is_floating_point or not a.numel():
        return None
    gap = (a.double() - b.double()).abs().flatten()
    gap = gap[(gap > 0) & gap.isfinite()]
    if not gap.numel():
        return None
    exponents = gap.log10().floor().to(torch.int64)
    values, counts = exponents.unique(return_counts=True)
    return {
        f"1e{int(v):+03d}": int(c) for v, c in zip(values.tolist(), counts.tolist(), strict=True)
    }
