"""The report rendered by a real browser: headless Chromium takes a screenshot, which must not be
blank.

Needs ``chromium`` on PATH: skipped without it on a developer's machine, failed without it in CI
(see tests/required.py). The PNG is read with zlib alone: its rows, unfiltered,
must hold many colours (text, curves, the heatmap), not one background.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from ..required import missing
from .test_html import losses, report, sample


@pytest.fixture(scope="module")
def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        missing("chromium", "apt-get install chromium")
    return found


def screenshot(
    chromium: str, page: Path, out: Path, profile: Path, *, width: int = 1280, height: int = 1600
) -> None:
    command = [
        chromium,
        *(
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--hide-scrollbars",
        ),
        *("--disable-background-networking", "--disable-component-update", "--disable-sync"),
        f"--user-data-dir={profile}",
        f"--screenshot={out}",
        f"--window-size={width},{height}",
        page.as_uri(),
    ]
    subprocess.run(command, check=True, capture_output=True, timeout=120)


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and the unfiltered rows of an 8-bit RGB or RGBA PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    chunks, at = {}, 8
    idat = b""
    while at < len(data):
        (length,), kind = struct.unpack(">I", data[at : at + 4]), data[at + 4 : at + 8]
        body = data[at + 8 : at + 8 + length]
        idat += body if kind == b"IDAT" else b""
        chunks.setdefault(kind, body)
        at += 12 + length
    width, height, depth, colour = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert depth == 8 and colour in (2, 6), (depth, colour)
    size = 3 if colour == 2 else 4
    raw, stride, rows, previous = zlib.decompress(idat), width * size, [], bytes(width * size)
    for y in range(height):
        kind, line = (
            raw[y * (stride + 1)],
            bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]),
        )
        for i in range(stride):
            left = line[i - size] if i >= size else 0
            up, corner = previous[i], previous[i - size] if i >= size else 0
            if kind == 1:
                line[i] = (line[i] + left) & 255
            elif kind == 2:
                line[i] = (line[i] + up) & 255
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (
                    line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)
                ) & 255
        rows.append(bytes(line))
        previous = rows[-1]
    if size == 4:  # drop the alpha channel
        rows = [bytes(b for j, b in enumerate(row) if j % 4 != 3) for row in rows]
    return width, height, rows


def test_the_report_renders_in_a_browser(chromium, tmp_path) -> None:
    page = tmp_path / "report.html"
    page.write_text(report(sample("reseed"), losses(steps=40, part_at=23)))
    out = tmp_path / "report.png"
    screenshot(chromium, page, out, tmp_path / "profile", height=1200)
    data = out.read_bytes()
    assert len(data) > 30_000, len(data)
    width, height, rows = png_pixels(data)
    assert (width, height) == (1280, 1200)
    colours = {row[i : i + 3] for row in rows[::4] for i in range(0, len(row), 12)}
    assert len(colours) > 50, len(colours)  # a blank page has one or two
    red = sum(
        1
        for row in rows
        for i in range(0, len(row), 3)
        if row[i] > 150 and row[i + 1] < 90 and row[i + 2] < 90
    )
    # the verdict's headline, the divergence marker and the heatmap's differing cells
    assert red > 2_000, red
