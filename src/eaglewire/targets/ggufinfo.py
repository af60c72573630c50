"""How many weights a GGUF file holds, read from its header alone.

Converting a GGUF dequantizes it to fp32: a 5 GB Q4 file of an 8B model
becomes ~30 GiB in memory and on disk, so the conversion says so before it
starts. `gguf.GGUFReader` would tell, but it parses every metadata value
(the whole vocabulary, the merges) into numpy: seconds for a small model,
tens of seconds for a 150k vocabulary. The sizes only need the tensor
infos, so this walks the header and skips every metadata value by its
length.
"""

from __future__ import annotations

import math
import mmap
import struct
from pathlib import Path

# GGUF metadata value types (ggml/docs/gguf.md): fixed sizes in bytes; 8 = string, 9 = array
FIXED_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY = 8, 9
VERSIONS = (2, 3)  # v1 used 32-bit lengths and is long gone


class _Header:
    """A read position in the file's bytes, in the file's byte order."""

    def __init__(self, buf, order: str):
        self.buf, self.order, self.pos = buf, order, 8  # after the magic and the version

    def num(self, fmt: str) -> int:
        v = struct.unpack_from(self.order + fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return v

    def skip_string(self) -> None:
        n = self.num("Q")  # read first: `self.pos += self.num(...)` would add to the old position
        self.pos += n

    def skip_value(self, kind: int) -> None:
        if kind in FIXED_SIZES:
            self.pos += FIXED_SIZES[kind]
        elif kind == STRING:
            self.skip_string()
        elif kind == ARRAY:
            item, n = self.num("I"), self.num("Q")
            if item in FIXED_SIZES:
                self.pos += n * FIXED_SIZES[item]
            else:
                for _ in range(n):
                    self.skip_value(item)
        else:
            raise ValueError(f"unknown GGUF value type {kind}")


def gguf_byte_order(buf) -> str | None:
    """'<' or '>' from the version field after the magic (None when neither reads as a known version)."""
    for order in ("<", ">"):  # big-endian GGUF files exist (s390x builds)
        if struct.unpack_from(order + "I", buf, 4)[0] in VERSIONS:
            return order
    return None


def gguf_tensor_elements(path: Path) -> int | None:
    """Total elements over the file's tensors (fp32 bytes = 4 x this); None when the header cannot be read."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            if buf[:4] != b"GGUF" or (order := gguf_byte_order(buf)) is None:
                return None
            h = _Header(buf, order)
            tensors, kvs = h.num("Q"), h.num("Q")
            for _ in range(kvs):
                h.skip_string()
                h.skip_value(h.num("I"))
            total = 0
            for _ in range(tensors):
                h.skip_string()
                dims = [h.num("Q") for _ in range(h.num("I"))]
                h.num("I"), h.num("Q")  # ggml type, data offset
                total += math.prod(dims)
            return total
    except (OSError, ValueError, struct.error):
        return None
