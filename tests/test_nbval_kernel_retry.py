"""The goldens' kernel start (tests/conftest.py): a kernel that dies at start-up is started again, its stderr kept
and shown; nbval's own class is the retrying one in every pytest-xdist worker."""
import warnings

import pytest
from conftest import KERNEL_START_ATTEMPTS, _retrying_kernel_class


def test_nbval_starts_the_goldens_kernels_through_the_retrying_class():
    import nbval.plugin

    assert nbval.plugin.RunningKernel.__name__ == "RetryingKernel"


def test_a_kernel_that_dies_at_start_is_started_again_and_the_last_failure_carries_its_stderr(monkeypatch):
    from nbval import kernel as nbval_kernel

    real, calls = nbval_kernel.start_new_kernel, []

    def dies_then_starts(fail_times):
        def start(**kwargs):
            calls.append(1)
            if len(calls) <= fail_times:
                kwargs["stderr"].write("zmq.error.ZMQError: Address already in use\n")
                kwargs["stderr"].flush()
                raise RuntimeError("Kernel died before replying to kernel_info")
            return real(**kwargs)
        return start

    cls = _retrying_kernel_class()
    monkeypatch.setattr(nbval_kernel, "start_new_kernel", dies_then_starts(KERNEL_START_ATTEMPTS - 1))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        kernel = cls("python3")
    try:
        assert kernel.is_alive() and len(calls) == KERNEL_START_ATTEMPTS
        assert len(seen) == KERNEL_START_ATTEMPTS - 1 and "Address already in use" in str(seen[0].message)
    finally:
        kernel.stop()

    calls.clear()
    monkeypatch.setattr(nbval_kernel, "start_new_kernel", dies_then_starts(KERNEL_START_ATTEMPTS))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(RuntimeError, match=f"kernel start {KERNEL_START_ATTEMPTS}/{KERNEL_START_ATTEMPTS} failed.*"
                                               "Address already in use"):
            cls("python3")
    assert len(calls) == KERNEL_START_ATTEMPTS
