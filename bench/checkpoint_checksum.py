"""What a checkpoint's manifest costs: the checksum verirl uses (zlib.crc32, streamed, the very
function `save_checkpoint` and `find_checkpoint` call) against blake2b and sha256 (and xxHash's
xxh3_64 when the `xxhash` package happens to be importable; verirl does not depend on it) over
the same file, in the same process run, and against what writing the same gigabyte as a
checkpoint file costs (`torch.save` of a tensor, then fsync).

    .venv/bin/python bench/checkpoint_checksum.py --gb 1 --repeats 3

Writes ``--gb`` GB of random bytes into a temporary directory (deleted at the end), then reads
it through each checksum ``--repeats`` times and keeps the best time of each. The file was just
written, so it is in the page cache, as a checkpoint's files are when the manifest is made at
save; a load after a reboot reads from disk first, which this does not measure.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

from verirl.run.checkpoint import CHUNK, file_checksum


def _hashlib(name: str) -> Callable[[Path], str]:
    def run(path: Path) -> str:
        h = hashlib.new(name)
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                h.update(view[:n])
        return h.hexdigest()
    return run


def _read_only(path: Path) -> str:
    """The same streamed read with no checksum: the floor every checksum pays."""
    buf = bytearray(CHUNK)
    total = 0
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            total += n
    return str(total)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=1.0, help="size of the test file in GB (1e9 bytes)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to write the file (default: the system temp dir)")
    args = ap.parse_args()
    size = int(args.gb * 1e9)
    cases: dict[str, Callable[[Path], str]] = {
        "read only": _read_only,
        "crc32 (verirl)": file_checksum,
        "blake2b": _hashlib("blake2b"),
        "sha256": _hashlib("sha256"),
    }
    try:
        import xxhash

        def _xxh3(path: Path) -> str:
            h = xxhash.xxh3_64()
            buf = bytearray(CHUNK)
            view = memoryview(buf)
            with open(path, "rb", buffering=0) as f:
                while n := f.readinto(buf):
                    h.update(view[:n])
            return h.hexdigest()
        cases["xxh3_64"] = _xxh3
    except ImportError:
        pass
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        path = Path(d) / "random.bin"
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            left = size
            while left:
                n = min(left, 64 << 20)
                f.write(os.urandom(n))
                left -= n
            f.flush()
            os.fsync(f.fileno())
        write_s = time.perf_counter() - t0
        print(f"{size / 1e9:.2f} GB of random bytes written and fsynced in {write_s:.2f} s "
              f"({size / 1e6 / write_s:,.0f} MB/s, os.urandom included); chunk {CHUNK >> 20} MiB; "
              f"best of {args.repeats}")
        best: dict[str, float] = {}
        for name, fn in cases.items():
            times = []
            for _ in range(args.repeats):
                t = time.perf_counter()
                fn(path)
                times.append(time.perf_counter() - t)
            best[name] = min(times)
        tensor = torch.empty(size // 4, dtype=torch.float32).uniform_()  # the write a checksum is added to
        t = time.perf_counter()
        torch.save({"t": tensor}, Path(d) / "save.pt")
        with open(Path(d) / "save.pt", "rb") as f:
            os.fsync(f.fileno())
        save_s = time.perf_counter() - t
        del tensor
        crc = best["crc32 (verirl)"]
        print(f"{'checksum':<16}{'MB/s':>10}{'s per GB':>11}{'time / crc32':>15}")
        for name, t in best.items():
            print(f"{name:<16}{size / 1e6 / t:>10,.0f}{t / (size / 1e9):>11.3f}{t / crc:>15.2f}")
        print(f"torch.save of a {size / 1e9:.2f} GB float32 tensor, then fsync: {save_s:.2f} s; crc32 adds "
              f"{crc / save_s:.0%} to such a write")
    print("(read from the page cache, as at save; a load right after a reboot is bounded by the disk's "
          "read speed first)")


if __name__ == "__main__":
    main()
