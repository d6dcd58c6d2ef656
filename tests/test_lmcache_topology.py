"""The topology record and the striped-flash row, on fake sysfs trees and a fake nvidia-smi."""
from __future__ import annotations

import subprocess
from pathlib import Path

from kmesh_lib.base import topology
from kmesh_lib.workloads.context_params import ContextGroupParams, striped_store_row


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def fake_sys_block(root: Path, nvme: int = 2, md: str | None = "raid0") -> Path:
    sb = root / "block"
    for i in range(nvme):
        write(sb / f"nvme{i}n1" / "size", str(2 * 1024 * 1024 * 1024 // 512))
        write(sb / f"nvme{i}n1" / "queue" / "rotational", "0")
        write(sb / f"nvme{i}n1" / "device" / "model", "FAKE NVME")
    write(sb / "loop0" / "size", "0")
    write(sb / "vda" / "size", "2048")
    write(sb / "vda" / "queue" / "rotational", "1")
    if md:
        write(sb / "md0" / "size", "4096")
        write(sb / "md0" / "md" / "level", md)
        write(sb / "md0" / "md" / "raid_disks", str(nvme))
        for i in range(nvme):
            (sb / "md0" / "slaves" / f"nvme{i}n1").mkdir(parents=True)
    return sb


def test_block_devices_and_md_arrays(tmp_path):
    sb = fake_sys_block(tmp_path)
    devs = {d["name"]: d for d in topology.block_devices(sb)}
    assert set(devs) == {"nvme0n1", "nvme1n1", "loop0", "vda", "md0"}
    assert devs["nvme0n1"]["nvme"] and not devs["nvme0n1"]["rotational"] and devs["nvme0n1"]["size_bytes"] == 2 << 30
    assert devs["loop0"]["virtual"] and not devs["vda"]["nvme"] and devs["md0"]["md"]
    write(tmp_path / "mdstat", "Personalities : [raid0] [raid1]\nmd0 : active raid0 nvme1n1[1] nvme0n1[0]\n")
    md = topology.md_support(sb, tmp_path / "mdstat")
    assert md["raid0_personality"] and md["personalities"] == ["raid0", "raid1"]
    assert md["arrays"] == [{"name": "md0", "level": "raid0", "raid_disks": "2", "members": ["nvme0n1", "nvme1n1"]}]
    assert topology.md_support(tmp_path / "none", tmp_path / "no-mdstat") == {
        "mdstat": False, "personalities": [], "raid0_personality": False, "mdadm": topology.shutil.which("mdadm"),
        "root": md["root"], "arrays": []}


def test_gpu_pcie_link_from_nvidia_smi_and_sysfs(tmp_path, monkeypatch):
    dev = tmp_path / "0000:00:06.0"
    for name, value in (("current_link_speed", "32.0 GT/s PCIe"), ("current_link_width", "16"),
                        ("max_link_speed", "32.0 GT/s PCIe"), ("max_link_width", "16")):
        write(dev / name, value)
    assert topology.pci_link_sysfs("00000000:00:06.0", root=tmp_path)["current_link_width"] == "16"
    write(dev / "numa_node", "1")
    write(dev / "local_cpulist", "8-15")
    assert {k: topology.pci_link_sysfs("0000:00:06.0", root=tmp_path)[k] for k in ("numa_node", "local_cpulist")} == {
        "numa_node": "1", "local_cpulist": "8-15"}
    assert topology.pci_link_sysfs("not a bus id", root=tmp_path) is None

    def fake_run(cmd, **kw):
        assert cmd[0] == "nvidia-smi" and cmd[1].startswith("--query-gpu=index,name,pci.bus_id")
        return subprocess.CompletedProcess(cmd, 0, "0, NVIDIA H200, 00000000:00:06.0, 5, 5, 16, 16, GPU-1234\n", "")

    monkeypatch.setattr(topology.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(topology, "pci_link_sysfs", lambda bus: {"current_link_width": "16"})
    gpus = topology.gpu_pcie(run=fake_run)["gpus"]
    assert gpus == [{"index": "0", "name": "NVIDIA H200", "pci.bus_id": "00000000:00:06.0",
                     "pcie.link.gen.current": "5", "pcie.link.gen.max": "5", "pcie.link.width.current": "16",
                     "pcie.link.width.max": "16", "card": topology.card_digest("GPU-1234"),
                     "sysfs": {"current_link_width": "16"}}]
    assert len(gpus[0]["card"]) == 12 and "GPU-1234" not in str(gpus)  # the card's digest, never its UUID
    failing = lambda cmd, **kw: subprocess.CompletedProcess(cmd, 9, "", "NVML: driver not loaded")  # noqa: E731
    assert topology.gpu_pcie(run=failing) == {"gpus": [], "error": "nvidia-smi exit 9: NVML: driver not loaded"}
    monkeypatch.setattr(topology.shutil, "which", lambda name: None)
    assert topology.gpu_pcie()["error"] == "nvidia-smi not on PATH"


def test_nvidia_driver_from_nvidia_smi_else_the_kernel_modules_version_file(tmp_path, monkeypatch):
    def smi(stdout, returncode=0):
        def fake_run(cmd, **kw):
            assert cmd[:2] == ["nvidia-smi", "--query-gpu=driver_version"]
            return subprocess.CompletedProcess(cmd, returncode, stdout, "")
        return fake_run

    proc_file = tmp_path / "version"
    write(proc_file, "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  575.57.08  Release Build  (dvs-builder@U16)\n"
                     "GCC version:  gcc version 12.3.0")
    monkeypatch.setattr(topology.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    assert topology.nvidia_driver(run=smi("570.86.15\n570.86.15\n"), version_file=proc_file) == "570.86.15"
    # nvidia-smi failing, or naming two versions, gives way to the loaded module's own line
    assert topology.nvidia_driver(run=smi("", returncode=9), version_file=proc_file) == "575.57.08"
    assert topology.nvidia_driver(run=smi("570.86.15\n575.57.08\n"), version_file=proc_file) == "575.57.08"
    monkeypatch.setattr(topology.shutil, "which", lambda name: None)
    write(proc_file, "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023")
    assert topology.nvidia_driver(version_file=proc_file) == "535.104.05"
    assert topology.nvidia_driver(version_file=tmp_path / "absent") is None


def test_striped_row_says_why_it_cannot_run(tmp_path, monkeypatch):
    one = {"nvme_count": 1, "md": {}}
    assert topology.striped_store(one)["reason"] == "1 NVMe drive on this machine; a striped store needs two"
    assert topology.striped_store({"nvme_count": 0})["reason"].startswith("0 NVMe drives")
    two = {"nvme_count": 2, "md": {"raid0_personality": False, "mdadm": None, "root": True, "arrays": []}}
    verdict = topology.striped_store(two)
    assert not verdict["available"] and "no striped mount was given" in verdict["reason"]
    assert "mdadm --create erases its members" in verdict["reason"]
    md = {"raid0_personality": True, "mdadm": "/sbin/mdadm", "root": True,
          "arrays": [{"name": "md0", "level": "raid0", "raid_disks": "2", "members": ["nvme0n1", "nvme1n1"]},
                     {"name": "md1", "level": "raid1", "raid_disks": "2", "members": ["nvme2n1", "nvme3n1"]}]}
    mounts = {"/striped": "/dev/md0", "/mirror": "/dev/md1", "/plain": "/dev/nvme0n1p1"}
    monkeypatch.setattr(topology, "mount_of", lambda root: {"device": mounts[str(root)]})
    topo = {"nvme_count": 4, "md": md}
    assert topology.striped_store(topo, "/striped") == {
        "available": True, "root": "/striped", "reason": "md0: RAID 0 over 2 drives (nvme0n1, nvme1n1)"}
    assert "raid1 with 2 disks, not RAID 0" in topology.striped_store(topo, "/mirror")["reason"]
    assert "not an md array" in topology.striped_store(topo, "/plain")["reason"]
    striped = tmp_path / "striped"  # STRIPED_STORE_ROOT must name an existing folder (issue 45)
    striped.mkdir()
    mounts[str(striped)] = mounts["/striped"]
    cfg = ContextGroupParams(STRIPED_STORE_ROOT=str(striped))
    assert striped_store_row(cfg, topo) == {"path": "mp-striped", "status": "available", "root": str(striped),
                                            "detail": "md0: RAID 0 over 2 drives (nvme0n1, nvme1n1)", "nvme_count": 4,
                                            "topology": {"nvme_count": 4, "block_devices": [], "md_raid0": True,
                                                         "mdadm": True, "gpu_pcie": []}}
    assert striped_store_row(ContextGroupParams(), one)["status"] == "not available"


def test_numa_nodes_and_the_hypervisor_flag_from_sysfs_and_cpuinfo(tmp_path):
    for node, cpus in (("node1", "8-15"), ("node0", "0-7"), ("node10", "64-71")):
        write(tmp_path / "node" / node / "cpulist", cpus)
    assert topology.numa_nodes(tmp_path / "node") == {"node0": "0-7", "node1": "8-15", "node10": "64-71"}
    assert topology.numa_nodes(tmp_path / "none") == {}
    write(tmp_path / "guest", "processor\t: 0\nflags\t\t: fpu vme hypervisor lahf_lm\n")
    write(tmp_path / "metal", "processor\t: 0\nflags\t\t: fpu vme lahf_lm\n")
    assert topology.under_hypervisor(tmp_path / "guest") is True
    assert topology.under_hypervisor(tmp_path / "metal") is False
    assert topology.under_hypervisor(tmp_path / "missing") is None


def test_describe_on_this_machine_reads_without_raising(tmp_path):
    topo = topology.describe(tmp_path)
    assert topo["nvme_count"] == sum(d["nvme"] for d in topo["block_devices"])
    assert topo["disk_tier"]["path"] == str(tmp_path.resolve()) and "mountpoint" in topo["disk_tier"]
    assert set(topo["gpu_pcie"]) <= {"gpus", "error"}
    assert topo["hypervisor"] in (True, False, None) and all(k.startswith("node") for k in topo["numa_nodes"])
