"""Can the disk tier be read straight into GPU memory here (cuFile / GPUDirect Storage)?

The original study's DMA-BUF route reads the SSD into GPU memory with no host copy. On Linux that is
GPUDirect Storage: the cuFile library, the ``nvidia-fs`` kernel driver, and a file system on a local
NVMe (or a supported remote) device. Without the driver cuFile runs in compatibility mode, which
stages through host memory: no direct route. A virtio disk (the lent H200 machine's, and this
machine's) is not a GDS device.

``direct_storage_status`` reports each condition from what the machine shows (library files, the
driver's proc entry, the mount's block device and its kernel driver) and names the route: ``gds``
only when all hold, ``host-staged`` otherwise, with the reasons. It never loads a CUDA library.
"""
from __future__ import annotations

import ctypes.util
import glob
import os
import sys
from pathlib import Path

from kmesh_lib.kv.disk_tier import mount_of

GDS_FILE_SYSTEMS = ("ext4", "xfs")


def _cufile_library() -> str | None:
    found = ctypes.util.find_library("cufile")
    if found:
        return found
    patterns = ["/usr/local/cuda*/lib64/libcufile.so*", "/usr/lib/x86_64-linux-gnu/libcufile.so*"]
    patterns += [os.path.join(p, "nvidia", "cufile", "lib", "libcufile.so*") for p in sys.path if p]
    for pattern in patterns:
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[0]
    return None


def _nvidia_fs_driver() -> bool:
    if Path("/proc/driver/nvidia-fs").exists():
        return True
    try:
        return any(line.split()[0] == "nvidia_fs" for line in Path("/proc/modules").read_text().splitlines())
    except OSError:
        return False


def block_device_of(path: str | Path) -> dict:
    """The block device under ``path``'s mount and the kernel driver behind it (virtio_blk, nvme, ...)."""
    mnt, fstype = mount_of(Path(path))
    source = None
    for line in Path("/proc/mounts").read_text().splitlines():
        dev, m, fs = line.split()[:3]
        if m == mnt and fs == fstype:
            source = dev
    out = {"mount": mnt, "fs_type": fstype, "source": source, "device": None, "sys_path": None, "kind": "unknown"}
    if source and source.startswith("/dev/"):
        name = Path(os.path.realpath(source)).name
        sys_path = Path("/sys/class/block") / name
        if sys_path.exists():
            real = os.path.realpath(sys_path)
            out.update(device=name, sys_path=real)
            if "/virtio" in real:
                out["kind"] = "virtio"
            elif "/nvme" in real:
                out["kind"] = "nvme"
            elif "/loop" in real or name.startswith("loop"):
                out["kind"] = "loop"
            else:
                out["kind"] = "other"
    return out


def direct_storage_status(disk_dir: str | Path) -> dict:
    """Whether cuFile/GDS could read ``disk_dir`` into GPU memory here; ``route`` is gds or host-staged."""
    disk_dir = Path(disk_dir)
    probe = disk_dir if disk_dir.exists() else disk_dir.parent
    device = block_device_of(probe)
    library = _cufile_library()
    driver = _nvidia_fs_driver()
    reasons = []
    if library is None:
        reasons.append("no cuFile library (libcufile)")
    if not driver:
        reasons.append("no nvidia-fs kernel driver (cuFile would run in compatibility mode, through host memory)")
    if device["kind"] != "nvme":
        reasons.append(f"the disk tier is on a {device['kind']} device ({device['source']}), not NVMe")
    if device["fs_type"] not in GDS_FILE_SYSTEMS:
        reasons.append(f"file system {device['fs_type']} is not one GDS reads ({', '.join(GDS_FILE_SYSTEMS)})")
    return {"cufile_library": library, "nvidia_fs_driver": driver, "disk": device,
            "gds_available": not reasons, "route": "gds" if not reasons else "host-staged", "reasons": reasons}
