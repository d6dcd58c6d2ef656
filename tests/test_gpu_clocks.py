"""``engine.gpu_clocks``: NVML's clocks beside each measured follow-up, or a recorded absence."""
import torch

from kmesh_lib.engine.gpu_clocks import GpuClocks


def test_clocks_are_read_on_a_gpu_and_their_absence_says_why_elsewhere():
    clocks = GpuClocks()
    got = clocks.read()
    if torch.cuda.is_available():
        assert got is not None and got["sm_mhz"] > 0 and got["mem_mhz"] > 0 and got["event_reasons"] >= 0
    else:
        assert got is None and clocks.why  # e.g. NVML's shared library is not on this machine


def test_the_processes_on_the_gpu_come_with_the_clocks_where_nvml_lists_them():
    """A fake NVML: the count is its list's length; a device whose list NVML refuses keeps its clocks without it."""

    class Nvml:
        NVML_CLOCK_SM, NVML_CLOCK_MEM = 0, 1

        def __init__(self, processes):
            self.processes = processes

        def nvmlDeviceGetClockInfo(self, handle, kind):
            return 1980 if kind == self.NVML_CLOCK_SM else 3201

        def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
            return 0

        def nvmlDeviceGetComputeRunningProcesses(self, handle):
            if self.processes is None:
                raise RuntimeError("not supported")
            return self.processes

    clocks = GpuClocks.__new__(GpuClocks)
    clocks.handle, clocks.why, clocks._nvml = object(), None, Nvml([1, 2])
    assert clocks.read_with_processes() == {"sm_mhz": 1980, "mem_mhz": 3201, "event_reasons": 0, "num_processes": 2}
    clocks._nvml = Nvml(None)
    assert "num_processes" not in clocks.read_with_processes()
    assert GpuClocks.read_with_processes(clocks) is not None
