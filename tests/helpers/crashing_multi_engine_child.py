"""The section 22 GPU driver's child, with a fleet whose start raises.

``tests/test_multi_engine_gpu.py`` points ``sections.multi_engine.gpu.CHILD`` here to make a unit fail (its
fleet's record, tagged with the unit, is still written as the fleet closes), then resumes the driver with the
real child.
"""
import runpy
import sys

from kmesh_lib.sections.multi_engine import fleet


def start(self):
    raise RuntimeError(f"injected crash at the {self.model} {self.kind} fleet's start")


fleet.Fleet.start = start
sys.argv = ["kmesh_lib.sections.multi_engine.gpu", *sys.argv[1:]]
runpy.run_module("kmesh_lib.sections.multi_engine.gpu", run_name="__main__")
