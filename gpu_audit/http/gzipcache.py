"""Gzip for /metrics: the big per-snapshot body is compressed once, each scrape only
its small live tail.

Pure byte work: no sockets, no locks beyond its own, nothing logged.
"""

from __future__ import annotations

import gzip
import struct
import threading
import zlib

from gpu_audit.http.state import RenderedSnapshot

# gzip member header: magic, deflate, no flags, mtime 0, no extra flags, unknown OS.
_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"


class GzipCache:
    """The gzip stream of the latest snapshot's body, compressed once per snapshot.

    The body is deflated once and sync-flushed, which ends it on a byte boundary without
    a final block. Each scrape deflates only the small live tail with a fresh compressor
    (its final block closes the stream) and appends the gzip trailer, whose CRC-32
    continues from the body's. The client gets one ordinary gzip member (some clients do
    not read concatenated members), the big part is compressed once per snapshot, and a
    scrape never copies compressor state.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._for: RenderedSnapshot | None = None
        self._prefix = b""
        self._crc = 0
        self._size = 0

    def compress(self, rendered: RenderedSnapshot | None, live: bytes) -> bytes:
        if rendered is None:
            return gzip.compress(live, compresslevel=1, mtime=0)
        with self._lock:
            if self._for is not rendered:
                comp = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
                self._prefix = (_GZIP_HEADER + comp.compress(rendered.body)
                                + comp.flush(zlib.Z_SYNC_FLUSH))
                self._crc = zlib.crc32(rendered.body)
                self._size = len(rendered.body)
                self._for = rendered
            prefix, crc, size = self._prefix, self._crc, self._size
        comp = zlib.compressobj(1, zlib.DEFLATED, -zlib.MAX_WBITS)
        tail = comp.compress(live) + comp.flush()
        trailer = struct.pack("<II", zlib.crc32(live, crc), (size + len(live)) & 0xFFFFFFFF)
        return prefix + tail + trailer
