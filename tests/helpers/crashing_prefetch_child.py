"""The section 20 GPU driver's child, with engine runs that raise after KMESH_TEST_CRASH_AFTER groups.

``tests/test_prefetch.py`` points ``sections.prefetch.gpu.CHILD`` here to crash an engine run midway
(a real vLLM engine and lmcache server on the CPU), then resumes the driver with the real child.
"""
import os
import runpy
import sys

from kmesh_lib.sections.prefetch import protocol

AFTER = int(os.environ["KMESH_TEST_CRASH_AFTER"])
original = protocol.PrefetchRun.group


def group(self, *args, **kwargs):
    self.test_groups = getattr(self, "test_groups", 0) + 1
    if self.test_groups > AFTER:
        raise RuntimeError(f"injected crash after {AFTER} groups")
    return original(self, *args, **kwargs)


protocol.PrefetchRun.group = group
sys.argv = ["kmesh_lib.sections.prefetch.gpu", *sys.argv[1:]]
runpy.run_module("kmesh_lib.sections.prefetch.gpu", run_name="__main__")
