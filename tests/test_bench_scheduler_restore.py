"""``benchmarks/bench_scheduler_restore_overhead.py`` at a small context: each case must be the hit it
stands for (vLLM's own ``num_cached_tokens``), and its timers must have seen the calls they name."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent


def test_the_scheduler_probe_gets_a_local_hit_an_external_hit_and_a_miss(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_scheduler_restore_overhead.py"),
                          "--contexts", "512", "--repeats", "2", "--out", str(tmp_path / "s.json")],
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "external - resident" in out.stdout and "WARNING: " not in out.stdout
    rows = {r["case"]: r for r in json.loads((tmp_path / "s.json").read_text())["rows"]}
    assert {c: r["num_cached_tokens"] for c, r in rows.items()} == {"resident": 512, "external": 512, "miss": 0}
    # the local hit touches cached blocks; the external hit allocates and caches new ones
    assert rows["resident"]["median_ms"]["pool.touch"] > 0
    assert rows["external"]["median_ms"]["pool.cache_full_blocks"] > 0
    assert rows["external"]["median_ms"]["connector.update_state_after_alloc"] > 0
