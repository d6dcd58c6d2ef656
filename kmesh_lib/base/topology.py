"""The machine's storage and GPU-link topology, as recorded in every GPU run's ``env.json``.

The original study has a striped-flash row (the disk tier on two NVMe drives in RAID 0). Whether
that row can run here is a fact about the machine, so every GPU run records:

    block_devices   /sys/block: name, size, rotational, model, whether it is NVMe / md / virtual
    nvme_count      NVMe namespaces (``nvme<c>n<n>``, not partitions)
    md              RAID support: /proc/mdstat present, its personalities (raid0?), ``mdadm`` on PATH,
                    running as root; md arrays with their level and member count
    gpu_pcie        per GPU: PCI bus id and link generation / width, current and max
                    (``nvidia-smi --query-gpu``; the sysfs ``*_link_speed`` / ``*_link_width`` files
                    of the same PCI device when readable), and ``card``: the first 12 hex digits of the
                    SHA-256 of its UUID, which tells two runs on one card from runs on two cards of a kind
                    without recording the UUID
    disk_tier       (when a path is given) the mount and device the disk tier lives on
    numa_nodes      the host's NUMA nodes and their CPUs (/sys/devices/system/node), beside each GPU's ``numa_node``
                    and ``local_cpulist`` (its PCI device in sysfs): which CPUs are near the GPU's link
    hypervisor      whether the CPU says it runs under a hypervisor (/proc/cpuinfo's ``hypervisor`` flag): a
                    guest's CPU time can be stolen by the other guests of its host

``striped_store(topology, root)`` says whether the striped row can run and, if not, why. kmesh
never builds an array itself (``mdadm --create`` erases its member drives): the row runs only on
an existing RAID 0 mount of two or more NVMe drives named by the caller.

Every reader returns what it could read and says what it could not; nothing here raises.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

SYS_BLOCK = Path("/sys/block")
VIRTUAL = re.compile(r"^(loop|ram|zram|dm-|nbd|sr|fd)")
NVME_NAMESPACE = re.compile(r"^nvme\d+n\d+$")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def block_devices(sys_block: Path = SYS_BLOCK) -> list[dict]:
    """Whole block devices (no partitions) from sysfs."""
    out = []
    if not sys_block.is_dir():
        return out
    for dev in sorted(sys_block.iterdir()):
        name = dev.name
        sectors = _read(dev / "size")
        out.append({
            "name": name,
            "size_bytes": int(sectors) * 512 if sectors and sectors.isdigit() else None,
            "rotational": _read(dev / "queue" / "rotational") == "1",
            "model": _read(dev / "device" / "model"),
            "nvme": bool(NVME_NAMESPACE.match(name)),
            "md": name.startswith("md"),
            "virtual": bool(VIRTUAL.match(name)),
        })
    return out


def md_support(sys_block: Path = SYS_BLOCK, mdstat: Path = Path("/proc/mdstat")) -> dict:
    """Software RAID: kernel md personalities, the mdadm tool, privileges, and existing arrays."""
    text = _read(mdstat)
    personalities = []
    if text:
        m = re.search(r"^Personalities\s*:(.*)$", text, re.M)
        personalities = re.findall(r"\[(\w+)\]", m.group(1)) if m else []
    arrays = []
    if sys_block.is_dir():
        for dev in sorted(sys_block.glob("md*")):
            arrays.append({"name": dev.name, "level": _read(dev / "md" / "level"),
                           "raid_disks": _read(dev / "md" / "raid_disks"),
                           "members": sorted(p.name for p in (dev / "slaves").iterdir()) if (dev / "slaves").is_dir() else []})
    return {"mdstat": text is not None, "personalities": personalities, "raid0_personality": "raid0" in personalities,
            "mdadm": shutil.which("mdadm"), "root": hasattr(os, "geteuid") and os.geteuid() == 0, "arrays": arrays}


NVSMI_FIELDS = ("index", "name", "pci.bus_id", "pcie.link.gen.current", "pcie.link.gen.max",
                "pcie.link.width.current", "pcie.link.width.max", "uuid")


def card_digest(uuid: str) -> str:
    """A GPU's identity as recorded: the first 12 hex digits of its UUID's SHA-256 (the same card gives the same
    digest in every run; the UUID itself is not written anywhere)."""
    return hashlib.sha256(uuid.strip().encode()).hexdigest()[:12]


def gpu_pcie(run=subprocess.run) -> dict:
    """Each GPU's PCIe link from ``nvidia-smi`` and sysfs; ``{"gpus": [], "error": ...}`` without them."""
    if shutil.which("nvidia-smi") is None:
        return {"gpus": [], "error": "nvidia-smi not on PATH"}
    try:
        proc = run(["nvidia-smi", f"--query-gpu={','.join(NVSMI_FIELDS)}", "--format=csv,noheader,nounits"],
                   capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"gpus": [], "error": f"nvidia-smi: {e}"}
    if proc.returncode != 0:
        return {"gpus": [], "error": f"nvidia-smi exit {proc.returncode}: {proc.stderr.strip()[:200]}"}
    gpus = []
    for line in proc.stdout.strip().splitlines():
        values = [v.strip() for v in line.split(",")]
        if len(values) != len(NVSMI_FIELDS):
            continue
        gpu = dict(zip(NVSMI_FIELDS, values))
        gpu["card"] = card_digest(gpu.pop("uuid"))
        gpu["sysfs"] = pci_link_sysfs(gpu["pci.bus_id"])
        gpus.append(gpu)
    return {"gpus": gpus}


NVIDIA_DRIVER_VERSION = Path("/proc/driver/nvidia/version")
# "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  ..." or "... Open Kernel Module for x86_64  570.86.15  ..."
KERNEL_MODULE_VERSION = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)")


def nvidia_driver(run=subprocess.run, version_file: Path = NVIDIA_DRIVER_VERSION) -> str | None:
    """The NVIDIA driver's version ('570.86.15'): ``nvidia-smi --query-gpu=driver_version`` (one version for all
    GPUs), else the loaded kernel module's line in /proc/driver/nvidia/version; None where neither says."""
    if shutil.which("nvidia-smi") is not None:
        try:
            proc = run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                       capture_output=True, text=True, timeout=30)
            versions = {v.strip() for v in proc.stdout.splitlines() if v.strip()} if proc.returncode == 0 else set()
            if len(versions) == 1:
                return versions.pop()
        except (OSError, subprocess.TimeoutExpired):
            pass
    found = KERNEL_MODULE_VERSION.search(_read(version_file) or "")
    return found.group(1) if found else None


def pci_link_sysfs(bus_id: str, root: Path = Path("/sys/bus/pci/devices")) -> dict | None:
    """``current/max_link_speed`` and ``_width`` of a PCI device (nvidia-smi's 8-digit domain -> sysfs's 4), and its
    ``numa_node`` (-1: the platform gives none) and ``local_cpulist``."""
    m = re.fullmatch(r"(?:([0-9A-Fa-f]+):)?([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])", bus_id.strip())
    if not m:
        return None
    domain = int(m.group(1) or "0", 16)
    dev = root / f"{domain:04x}:{m.group(2).lower()}:{m.group(3).lower()}.{m.group(4)}"
    if not dev.is_dir():
        return None
    return {k: _read(dev / k) for k in ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width",
                                        "numa_node", "local_cpulist")}


def numa_nodes(root: Path = Path("/sys/devices/system/node")) -> dict[str, str | None]:
    """NUMA node -> its CPU list (``0-7,16-23``), as sysfs gives them; empty where there is no such folder."""
    nodes = sorted(root.glob("node[0-9]*"), key=lambda p: int(p.name[4:])) if root.is_dir() else []
    return {p.name: _read(p / "cpulist") for p in nodes}


def under_hypervisor(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool | None:
    """Whether the CPU's flags include ``hypervisor``; None where /proc/cpuinfo is not readable."""
    text = _read(cpuinfo)
    if text is None:
        return None
    return any(line.startswith("flags") and " hypervisor" in f" {line.split(':', 1)[-1]}" for line in text.splitlines())


def mount_of(path: str | Path) -> dict:
    """The mount point, device and file system that hold ``path`` (psutil), or an error."""
    import psutil

    target = Path(path).resolve()
    best = None
    for part in psutil.disk_partitions(all=True):
        mp = Path(part.mountpoint)
        if (target == mp or mp in target.parents) and (best is None or len(str(mp)) > len(best.mountpoint)):
            best = part
    if best is None:
        return {"path": str(target), "error": "no mount found"}
    return {"path": str(target), "mountpoint": best.mountpoint, "device": best.device, "fstype": best.fstype}


def describe(disk_tier: str | Path | None = None) -> dict:
    """The topology record (see the module docstring)."""
    devices = block_devices()
    topo = {"block_devices": devices, "nvme_count": sum(d["nvme"] for d in devices), "md": md_support(),
            "gpu_pcie": gpu_pcie(), "numa_nodes": numa_nodes(), "hypervisor": under_hypervisor()}
    if disk_tier is not None:
        topo["disk_tier"] = mount_of(disk_tier)
    return topo


def striped_store(topology: dict, root: str | Path | None = None) -> dict:
    """Whether the striped two-drive disk tier can run; ``{"available", "reason", "root"}``.

    Available only where at least two NVMe drives exist and ``root`` is on an md RAID 0 array of
    at least two members. Otherwise the reason names what is missing.
    """
    n = topology.get("nvme_count", 0)
    if n < 2:
        return {"available": False, "root": None,
                "reason": f"{n} NVMe drive{'s' if n != 1 else ''} on this machine; a striped store needs two"}
    if not root:
        md = topology.get("md", {})
        return {"available": False, "root": None,
                "reason": (f"{n} NVMe drives, but no striped mount was given (kmesh never builds an array: mdadm --create "
                           f"erases its members; md raid0 personality {'loaded' if md.get('raid0_personality') else 'absent'}, "
                           f"mdadm {'present' if md.get('mdadm') else 'absent'}, {'root' if md.get('root') else 'not root'})")}
    mount = mount_of(root)
    name = Path(mount.get("device", "")).name
    array = next((a for a in topology.get("md", {}).get("arrays", []) if a["name"] == name), None)
    if array is None:
        return {"available": False, "root": str(root), "reason": f"{root} is on {mount.get('device')}, not an md array"}
    if array.get("level") != "raid0" or int(array.get("raid_disks") or 0) < 2:
        return {"available": False, "root": str(root),
                "reason": f"{name} is {array.get('level')} with {array.get('raid_disks')} disks, not RAID 0 over two or more"}
    return {"available": True, "root": str(root),
            "reason": f"{name}: RAID 0 over {array['raid_disks']} drives ({', '.join(array['members'])})"}
