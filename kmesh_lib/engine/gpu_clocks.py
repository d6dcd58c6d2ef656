"""The GPU's clocks around a measured request, through NVML (vLLM's vendored ``pynvml``).

A forward step that takes 15 ms in one repeat and 25 ms in the next may follow the GPU's clocks (it
slows down while idle, or is held back by power or heat) or the host. Sections read ``GpuClocks.read()``
before a follow-up and after its first token, and keep both beside its times, so the split can be
made from the data rather than assumed.

``read()`` returns ``{"sm_mhz", "mem_mhz", "event_reasons"}`` (``event_reasons`` is NVML's bit mask of
why the clocks are below their maximum now: idle, power cap, thermal, ...), or None where NVML is not
there (CPU builds, a driver without it); ``why`` then says why. Reading costs tens of microseconds,
taken outside every timed interval.
"""
from __future__ import annotations

import os


class GpuClocks:
    """NVML's view of one GPU: the first of CUDA_VISIBLE_DEVICES (the device a section's engine uses)."""

    def __init__(self) -> None:
        self.handle, self.why, self._nvml = None, None, None
        try:
            from vllm.third_party import pynvml

            pynvml.nvmlInit()
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
            index = int(visible) if visible.isdigit() else 0
            self.handle, self._nvml = pynvml.nvmlDeviceGetHandleByIndex(index), pynvml
        except Exception as e:  # noqa: BLE001 - no NVML is a recorded absence, never an error
            self.why = f"{type(e).__name__}: {e}"[:200]

    def read(self) -> dict | None:
        if self.handle is None:
            return None
        n = self._nvml
        try:
            return {"sm_mhz": n.nvmlDeviceGetClockInfo(self.handle, n.NVML_CLOCK_SM),
                    "mem_mhz": n.nvmlDeviceGetClockInfo(self.handle, n.NVML_CLOCK_MEM),
                    "event_reasons": int(n.nvmlDeviceGetCurrentClocksEventReasons(self.handle))}
        except Exception as e:  # noqa: BLE001
            self.why, self.handle = f"{type(e).__name__}: {e}"[:200], None
            return None

    def read_with_processes(self) -> dict | None:
        """``read()`` plus ``num_processes``: the compute processes NVML lists on this GPU now, this one included
        (another tenant's copies share the link a restore uses; a count NVML cannot give is left out)."""
        clocks = self.read()
        if clocks is not None:
            try:
                clocks["num_processes"] = len(self._nvml.nvmlDeviceGetComputeRunningProcesses(self.handle))
            except Exception:  # noqa: BLE001 - the clocks stand without it
                pass
        return clocks
