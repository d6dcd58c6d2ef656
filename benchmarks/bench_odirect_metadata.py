"""What creating disk-tier chunk files costs in *device reads*: the process's /proc/self/io read_bytes
while it writes N new files with O_DIRECT (as LMCache's fs adapter does), reading nothing itself.

The difference is file-system metadata (directory and inode blocks) that the kernel reads on the
process's behalf; a byte hook on the adapter's own reads never sees it. Section 22's answer cites this.

    python3 benchmarks/bench_odirect_metadata.py [--files 48] [--file-kib 1024] [--dir DIR]
"""
from __future__ import annotations

import argparse
import mmap
import os
import tempfile

import psutil


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=48)
    ap.add_argument("--file-kib", type=int, default=1024)
    ap.add_argument("--dir", default=None, help="a directory on the disk to test (default: a temp dir; not tmpfs)")
    args = ap.parse_args()
    size = args.file_kib * 1024
    buf = mmap.mmap(-1, size)  # page-aligned, as O_DIRECT requires
    buf.write(os.urandom(size))
    me = psutil.Process()
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        os.sync()
        before = me.io_counters()
        for i in range(args.files):
            fd = os.open(os.path.join(root, f"chunk-{i}.bin"), os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o600)
            try:
                os.write(fd, buf)
            finally:
                os.close(fd)
        after = me.io_counters()
    print(f"wrote {args.files} new files of {args.file_kib} KiB with O_DIRECT under {root}")
    print(f"device read_bytes during the writes: {after.read_bytes - before.read_bytes:,} "
          f"(the process read no file); write_bytes: {after.write_bytes - before.write_bytes:,}")


if __name__ == "__main__":
    main()
