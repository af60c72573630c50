"""`--target BIG_FILE` is told apart by its header alone: one line at once, not the file read into memory.

Each file is sparse (3 GiB that take no disk): reading it whole, as a 4-byte
magic check once did, would grow the process by 3 GiB.
"""

import resource
import time

import pytest

from eaglewire_testing.cli import run_cli

BIG = 3 * 2 ** 30


def _sparse(path, head: bytes = b""):
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(BIG)
    return path


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


@pytest.mark.parametrize("name, head, words", [
    ("model.bin", b"", "no config.json"),  # not a GGUF, not a directory
    ("model.gguf", b"", "not a GGUF file"),  # the suffix says GGUF, the magic does not
    ("model", b"GGUF\x00\x00\x00\x00", "GGUF version"),  # the magic without a version: damaged
    ("model.gguf", b"GGUF" + (99).to_bytes(4, "little"), "GGUF version"),
])
@pytest.mark.parametrize("command", ["inspect", "plan"])
def test_a_big_target_file_is_one_line_fast(tmp_path, name, head, words, command):
    f = _sparse(tmp_path / name, head)
    run_cli("layers", "--help")  # the CLI's imports happen before the measured call
    peak, t0 = _peak_mib(), time.monotonic()
    r = run_cli(command, "--target", f, *(["--device", "cpu"] if command == "inspect" else []))
    took, grew = time.monotonic() - t0, _peak_mib() - peak
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], r.stderr
    assert str(f) in lines[0]
    assert took < 10 and grew < 512, f"{took:.1f} s, peak memory +{grew:.0f} MiB"
