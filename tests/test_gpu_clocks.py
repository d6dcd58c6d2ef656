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
