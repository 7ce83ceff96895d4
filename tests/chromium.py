"""Headless Chromium (the Debian `chromium` package) for tests that render HTML.

`screenshot` and `print_pdf` drive Chromium's own command-line modes; `layout` loads a
copy of the page with a probe script appended that writes each matching element's
rendered box into the DOM, then reads it back with `--dump-dom`: the boxes are what
Chromium laid out, not what the HTML says. Each call has its own profile directory
(helpers and tests may run Chromium side by side) and an explicit timeout.
Tests skip with the reason when no Chromium is installed (`scripts/setup --test`).
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import tempfile
import zlib
from pathlib import Path

import pytest

TIMEOUT_S = 90
_BASE = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-extensions", "--no-first-run", "--hide-scrollbars", "--mute-audio",
         # a page that asks the network for anything gets nothing
         "--host-resolver-rules=MAP * ~NOTFOUND"]


def binary() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("no chromium: install the Debian package (scripts/setup --test)")


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        return subprocess.run([binary(), *_BASE, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=timeout, check=False)


def screenshot(page: Path, png: Path, width: int = 1000, height: int = 2000,
               timeout: float = TIMEOUT_S) -> Path:
    """A PNG of the page's first `height` pixels at `width`."""
    proc = _run([f"--window-size={width},{height}", f"--screenshot={png}",
                 page.resolve().as_uri()], timeout)
    if not png.exists():
        raise AssertionError(f"chromium wrote no screenshot (rc {proc.returncode}):\n"
                             f"{proc.stderr[-2000:]}")
    return png


def print_pdf(page: Path, pdf: Path, timeout: float = TIMEOUT_S) -> Path:
    proc = _run(["--no-pdf-header-footer", f"--print-to-pdf={pdf}", page.resolve().as_uri()],
                timeout)
    if not pdf.exists():
        raise AssertionError(f"chromium printed no PDF (rc {proc.returncode}):\n"
                             f"{proc.stderr[-2000:]}")
    return pdf


_PROBE = """<script>
(() => {
  const boxes = [...document.querySelectorAll(%s)].map((el) => {
    const r = el.getBoundingClientRect();
    return {tag: el.tagName.toLowerCase(), cls: el.getAttribute("class") || "",
            x: r.x, y: r.y + window.scrollY, width: r.width, height: r.height,
            section: (el.closest("section") || {}).id || ""};
  });
  const pre = document.createElement("pre");
  pre.id = "__layout__";
  pre.textContent = JSON.stringify({boxes, scripts: document.scripts.length - 1,
                                    width: document.documentElement.scrollWidth});
  document.body.appendChild(pre);
})();
</script>"""


def layout(page: Path, selector: str, width: int = 1000,
           timeout: float = TIMEOUT_S) -> dict[str, object]:
    """Rendered boxes of the elements matching `selector`, and how many scripts the page
    itself had (`scripts`) and its scroll width, as Chromium laid it out."""
    html = page.read_text(encoding="utf-8")
    probe = _PROBE % json.dumps(selector)
    with tempfile.TemporaryDirectory(prefix="chromium-layout-") as tmp:
        copy = Path(tmp) / page.name
        copy.write_text(html.replace("</body>", probe + "</body>"), encoding="utf-8")
        proc = _run([f"--window-size={width},1200", "--dump-dom", copy.as_uri()], timeout)
    start = proc.stdout.find('<pre id="__layout__">')
    if start < 0:
        raise AssertionError(f"no layout in the DOM (rc {proc.returncode}):\n"
                             f"{proc.stderr[-2000:]}")
    text = proc.stdout[start + len('<pre id="__layout__">'):proc.stdout.index("</pre>", start)]
    result: dict[str, object] = json.loads(text.replace("&quot;", '"').replace("&lt;", "<")
                                           .replace("&gt;", ">").replace("&amp;", "&"))
    result["dom"] = proc.stdout
    return result


def png_pixels(png: Path) -> tuple[int, int, list[bytes]]:
    """Width, height and rows of RGB(A) bytes of an 8-bit non-interlaced PNG (what
    Chromium writes), decoded with zlib alone."""
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    height = depth = color = interlace = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
    bpp = 3 if color == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        ftype = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if ftype == 1:
                line[i] = (line[i] + a) & 0xFF
            elif ftype == 2:
                line[i] = (line[i] + b) & 0xFF
            elif ftype == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif ftype == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pred) & 0xFF
        rows.append(bytes(line) if bpp == 3 else
                    b"".join(bytes(line[i:i + 3]) for i in range(0, stride, 4)))
        prev = line
    return width, height, rows


def count_colors(png: Path, colors: list[str]) -> dict[str, int]:
    """How many pixels have exactly each colour `#rrggbb` (flat fills such as chart bars
    keep their exact colour; anti-aliased edges do not count)."""
    _, _, rows = png_pixels(png)
    out: dict[str, int] = {}
    for color in colors:
        want = bytes.fromhex(color.lstrip("#"))
        # bytes.count finds unaligned matches too; for a flat colour they are rare
        out[color] = sum(row.count(want) for row in rows)
    return out


def screenshot_url(url: str, png: Path, *, width: int = 1000, height: int = 2000,
                   wait_ms: int = 5000, timeout: float = TIMEOUT_S) -> Path:
    """A PNG of a live page (a server on loopback), taken once its scripts have had
    `wait_ms` of virtual time to fetch and render. Only 127.0.0.1 resolves (the last
    --host-resolver-rules wins over the one in _BASE)."""
    proc = _run(["--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
                 f"--window-size={width},{height}", f"--virtual-time-budget={wait_ms}",
                 f"--screenshot={png}", url], timeout)
    if not png.exists():
        raise AssertionError(f"chromium wrote no screenshot of {url} "
                             f"(rc {proc.returncode}):\n{proc.stderr[-2000:]}")
    return png
