"""Section 17's checks, computed from the run's recorded files and the corpus."""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from kmesh_lib.base.checks import Check
from kmesh_lib.base.public import find_private_keys
from kmesh_lib.base.records import sha256_file
from kmesh_lib.kv.capture_contract import validate_capture
from kmesh_lib.sections.trace_audit.experiment import set_sha256_of
from kmesh_lib.sections.trace_audit.params import DEFAULT_TRACE_ROOT, resolve_root


def public_invariants(public: dict) -> dict[str, bool]:
    """Accounting invariants re-derived from a public audit (``TraceAudit.to_public``)."""
    s, files = public["summary"], public["files"]
    return {
        "records = unique + duplicate copies":
            s["num_unique_records"] + s["num_duplicate_copies"] == s["num_records"],
        "per file: lines = blank + records + malformed": all(
            f["num_lines"] == f["num_blank_lines"] + f["num_records"] + f["num_malformed_lines"]
            for f in files),
        "malformed lines per file sum to the total":
            sum(f["num_malformed_lines"] for f in files) == s["num_malformed_lines"]
            == sum(s["malformed"].values()),
        "duplicate groups sum to the duplicate copies":
            sum(g["num_copies"] - 1 for g in public["duplicate_groups"])
            == s["num_duplicate_copies"] == sum(f["num_duplicate_copies"] for f in files),
        "directory rows sum to the records":
            sum(d["num_records"] for d in public["dirs"]) == s["num_records"],
        "file rows sum to the bytes": sum(f["size_bytes"] for f in files) == s["num_bytes"],
        "every input file hashed": len(files) == s["num_files"]
            and all(f["sha256"] for f in files),
        "set hash recomputes from the file hashes": public["set_sha256"] == set_sha256_of(
            {f["relpath"]: f["sha256"] for f in files if f["sha256"]}),
    }


def _rehash_inputs(root: Path, inputs: dict[str, str]) -> Check:
    if not root.is_dir():
        return Check("input files re-hash to the recorded sha256", True,
                     f"{root} is not present here: nothing re-hashed")
    changed, missing = [], 0
    for relpath, digest in sorted(inputs.items()):
        path = (root / relpath).resolve()
        if root not in path.parents or not path.is_file():
            missing += 1
        elif sha256_file(path) != digest:
            changed.append(relpath)
    detail = (f"{len(inputs) - missing} of {len(inputs)} re-hashed, {missing} missing, "
              f"{len(changed)} changed" + (f": {changed[:5]}" if changed else ""))
    return Check("input files re-hash to the recorded sha256", not changed, detail)


def checks(run_dir: Path) -> list[Check]:
    """Re-derive section 17's results from the run directory (``kmesh verify 17``)."""
    run_dir = Path(run_dir)
    results = json.loads((run_dir / "results.json").read_text())
    public, inputs = results.get("audit"), results.get("inputs") or {}
    if not public:
        return [Check("public audit recorded", False, "results.json holds no 'audit'")]
    checks = [Check(f"audit: {name}", ok) for name, ok in public_invariants(public).items()]
    file_hashes = {f["relpath"]: f["sha256"] for f in public["files"] if f["sha256"]}
    checks.append(Check("inputs are the audit's file hashes", bool(inputs) and inputs == file_hashes,
                        f"{len(inputs)} inputs, {len(file_hashes)} hashed files"))
    checks.append(Check("set hash recomputes from the inputs",
                        set_sha256_of(inputs) == public["set_sha256"], public["set_sha256"]))
    params_path = run_dir / "params.resolved.yaml"
    params = yaml.safe_load(params_path.read_text()) if params_path.exists() else {}
    checks.append(_rehash_inputs(resolve_root(params.get("TRACE_ROOT", DEFAULT_TRACE_ROOT)), inputs))
    lineage = public.get("lineage") or {}
    per_source = [s["qualifies"] for s in lineage.get("sources", [])]
    checks.append(Check("lineage verdict recorded and consistent",
                        isinstance(results.get("lineage_verdict"), bool)
                        and results["lineage_verdict"] == lineage.get("qualifies") == any(per_source),
                        f"qualifies={lineage.get('qualifies')}"))
    contrast = results.get("contrast") or {}
    capture = run_dir / contrast.get("path", "contrast/missing")
    checks.append(Check("contract capture unchanged and valid",
                        capture.is_file() and sha256_file(capture) == contrast.get("sha256")
                        and validate_capture(capture).ok and contrast.get("qualifies") is True,
                        str(contrast.get("path"))))
    private = find_private_keys(results)
    checks.append(Check("results hold no private keys", not private, ", ".join(private[:5])))
    return checks
