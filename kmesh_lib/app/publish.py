"""``kmesh publish``: ``public-results.json`` with aggregates and hashes, and no prompts, answers
or token ids.

The public file holds the resolved parameters, the environment summary, every result in
``results.json`` (sections store only aggregates there; per-request tokens go to ``raw/``), the
checks, and the SHA-256 of every input file the run declared (``results["inputs"]``) and of every
raw capture. A result key that looks like private content is refused rather than published.
"""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from kmesh_lib.base.public import find_private_keys
from kmesh_lib.base.records import sha256_file, write_json_atomic


def public_results(run_dir: Path) -> dict:
    results = json.loads((run_dir / "results.json").read_text())
    private = find_private_keys(results)
    if private:
        raise ValueError(f"results.json holds private content under {private[:5]}; keep it in raw/")
    env = json.loads((run_dir / "env.json").read_text()) if (run_dir / "env.json").exists() else {}
    params = yaml.safe_load((run_dir / "params.resolved.yaml").read_text()) if (run_dir / "params.resolved.yaml").exists() else {}
    params.pop("RUN_DIR", None)
    raw = sorted((run_dir / "raw").glob("*")) if (run_dir / "raw").exists() else []
    inputs = results.get("inputs", {})
    return {
        "schema": "kmesh.public-results/1",
        "section": results.get("section"), "run_id": results.get("run_id"),
        "params": params,
        "environment": {k: env.get(k) for k in ("python", "device", "cuda", "packages", "git", "time_utc")},
        "results": {k: v for k, v in results.items() if k not in ("checks", "inputs")},
        "checks": results.get("checks", {}),
        "input_hashes": inputs,
        "capture_hashes": {p.name: sha256_file(p) for p in raw if p.is_file()},
    }


def publish(run_dir: Path) -> Path:
    out = run_dir / "public-results.json"
    write_json_atomic(out, public_results(run_dir))
    return out
