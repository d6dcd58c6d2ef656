"""The section 21 GPU driver's child, whose LMCache tier raises in its paired design.

``tests/test_crossover_gpu.py`` points ``sections.crossover.gpu.CHILD`` here to make the (model, lmcache) unit fail
after it wrote its store and grid rows (its summary then says ``error``), while the other tiers' children run as
they do; then it resumes the driver with the real child.
"""
import runpy
import sys

from kmesh_lib.sections.crossover import arms

real_run_pairs = arms.RestoreBench.run_pairs


def run_pairs(self, *args, **kwargs):
    if self.tier_name == "lmcache":
        raise RuntimeError("injected crash in the lmcache tier's pairs")
    return real_run_pairs(self, *args, **kwargs)


arms.RestoreBench.run_pairs = run_pairs
sys.argv = ["kmesh_lib.sections.crossover.experiment", *sys.argv[1:]]
runpy.run_module("kmesh_lib.sections.crossover.experiment", run_name="__main__")
