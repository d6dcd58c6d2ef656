"""Section 17 on the section interface: params, plan, a run on a generated hostile corpus, checks
that fail on a tampered raw row or results figure, and public results that hold no planted secret.

The corpus is generated here (every hostile case), so these tests need no data set; the real
corpus is covered by the golden notebook and test_trace_audit.py, skipped with the reason when the
data root does not hold it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from table_contract import assert_table_contract, problems

from kmesh_lib.app.cli import main
from kmesh_lib.base import params
from kmesh_lib.base.captures import is_header
from kmesh_lib.base.paths import REPO_ROOT
from kmesh_lib.base.records import RunFiles, RunRecord
from kmesh_lib.kv.capture_contract import write_capture
from kmesh_lib.sections import trace_audit as section
from kmesh_lib.sections.trace_audit import experiment as ta
from kmesh_lib.sections.trace_audit import params as ta_params
from kmesh_lib.sections.trace_audit.results import MAX_PUBLIC_FIELDS, MAX_PUBLIC_ROWS
from kmesh_lib.traces.audit import audit_tree
from kmesh_lib.traces.names import is_safe

SECRET = "sk-SECRET-" + "5" * 30
SECRET_TEXT = "CANARY-PROMPT-TEXT-7f3a"
TOKEN_IDS = [987654321, 123456789123, 555000111222]  # never counts, never sizes
REHASH = "input files re-hash to the recorded sha256"
REAUDIT = "a fresh audit of the corpus reproduces raw/"


def _line(obj) -> str:
    return json.dumps(obj) + "\n"


def write_hostile_corpus(root: Path) -> Path:
    """Every hostile case section 17 must survive: a link out of the tree and a loop, deep
    directories, a huge line, deep and dense JSON, non-UTF-8 bytes and names, an empty file,
    duplicates, thousands of distinct keys, and secrets in field names, nested keys, values and
    token ids under keys nobody expects."""
    (root / "alpha" / "sub").mkdir(parents=True)
    (root / "beta").mkdir()
    (root / "keys").mkdir()
    (root / "notes").mkdir()
    rec = {"timestamp": 1_760_000_000_000, "session_id": "s0", "input": SECRET_TEXT, "output": "ok"}
    (root / "alpha" / "a.jsonl").write_text(_line(rec) * 3 + _line(rec | {"session_id": "s1"}) + "\n")
    (root / "alpha" / "empty.jsonl").write_bytes(b"")
    (root / "alpha" / "sub" / "b.ndjson").write_text(_line(rec))  # a duplicate across files
    (root / "beta" / "bad.jsonl").write_bytes(
        b"{broken " + SECRET_TEXT.encode() + b"\n"
        + b'{"a": "caf\xe9"}\n'                                   # not UTF-8
        + b'{"x": "' + b"y" * 600_000 + b'"}\n'                   # over MAX_LINE_MB=0.5
        + b"[" * 100 + b"]" * 100 + b"\n"                         # deeper than MAX_JSON_DEPTH=64
        + b"[" + b",".join([b"{}"] * 100_000) + b"]\n"            # too dense to parse
        + _line({"ok": 1}).encode())
    with open(os.fsencode(root / "beta") + b"/caf\xe9.jsonl", "wb") as fh:
        fh.write(b'{"a": 1}\n')
    secrets = [{"x" * 430 + SECRET + "y" * 430: 1, "toks": TOKEN_IDS, "answer_text": SECRET_TEXT,
                "meta": {SECRET: TOKEN_IDS, "parent_id": None, "prompt_token_ids": TOKEN_IDS}},
               {"unexpected": {"deeper": [SECRET, TOKEN_IDS]}, "id": SECRET}]
    (root / "beta" / "secrets.jsonl").write_text("".join(_line(r) for r in secrets))
    with open(root / "keys" / "many.jsonl", "w") as f:  # 5,000 distinct keys, 20 records
        for r in range(20):
            f.write(_line({f"k{r * 250 + j}_at": 1_700_000_000 + j for j in range(250)}))
    (root / f"dir-{'z' * 60}-{SECRET}").mkdir()  # past 64 characters: hashed
    (root / f"dir-{'z' * 60}-{SECRET}" / "t.jsonl").write_text(_line({"id": 1}))
    deep = root / "alpha" / "d1" / "d2" / "d3" / "d4"
    deep.mkdir(parents=True)
    (deep / "too-deep.jsonl").write_text(_line({"id": 2}))
    (root / "notes" / "README.txt").write_text("not a trace")
    os.symlink("/", root / "rootlink")
    os.symlink("..", root / "alpha" / "loop")
    return root


RUN_PARAMS = {"MAX_LINE_MB": 0.5, "MAX_DEPTH": 3}


def make_run(run_dir: Path, trace_root: str, **extra) -> RunFiles:
    cfg = params.build(section.Params, {"TRACE_ROOT": trace_root, "RUN_DIR": str(run_dir)} | RUN_PARAMS | extra)
    record = RunRecord.open(section.KEY, cfg)
    section.audit_run(record, cfg)
    record.save_tables(section.TABLES)
    return record.files()


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> tuple[Path, Path]:
    """One run on the hostile corpus, copied by each test that edits it."""
    base = tmp_path_factory.mktemp("s17")
    corpus = write_hostile_corpus(base / "corpus")
    make_run(base / "run", str(corpus))
    return corpus, base / "run"


@pytest.fixture
def run(made, tmp_path) -> RunFiles:
    shutil.copytree(made[1], tmp_path / "run", symlinks=True)
    return RunFiles(tmp_path / "run")


def _status(run: RunFiles) -> dict[str, str]:
    return {c.name: c.status for c in section.checks(run)}


def _failed(run: RunFiles) -> list[str]:
    return [name for name, status in _status(run).items() if status == "failed"]


def _edit_jsonl(path: Path, index: int, edit) -> None:
    """Edits record ``index`` of the capture (after its schema header, where it has one)."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    edit(rows[index + (1 if rows and is_header(rows[0]) else 0)])
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _edit_results(run: RunFiles, edit) -> None:
    results = run.results
    edit(results)
    (run.run_dir / "results.json").write_text(json.dumps(results))


# -- the run and its checks --------------------------------------------------------------------

def test_an_honest_run_passes_every_check(run: RunFiles):
    status = _status(run)
    assert set(status.values()) == {"ok"}, status
    assert len(status) == 10


def test_the_hostile_corpus_is_counted_not_followed(run: RunFiles):
    counts = section.counts(run)
    summary = run.results["audit"]["summary"]
    assert summary["malformed"] == {"invalid_json": 1, "invalid_utf8": 1, "oversize": 1, "too_deep": 1,
                                    "too_dense": 1}
    assert summary["problems"] == {"symlink": 1, "symlink-outside-root": 1, "too-deep": 1}
    assert (counts["num_files"], counts["num_empty_files"], counts["num_duplicate_copies"]) == (8, 1, 3)
    assert counts["num_sources"] == 4  # alpha, beta, keys, dir-<secret> (hashed)
    assert counts["num_qualifying_sources"] == 0 and counts["num_lineage_edges"] == 0
    files = {f["relpath"] for f in run.raw("audit_files.jsonl")}
    assert not any(p.startswith(("rootlink", "alpha/loop")) for p in files)


def test_save_tables_then_verify_compares_every_declared_table(made, tmp_path):
    stored = assert_table_contract(section.TABLES, section.KEY, made[1], tmp_path)
    assert list(stored) == ["audit", "lineage", "contrast"]
    assert set(stored["audit"]) == {"root_name", "summary", "set_sha256", "limits", "elapsed_s"}  # elapsed_s: live


def test_the_tables_rebuild_without_the_corpus(made, tmp_path, monkeypatch):
    """The declared tables read only the run folder: verify on a clone without the data compares them all."""
    shutil.copytree(made[1], tmp_path / "run", symlinks=True)
    shutil.move(made[0], tmp_path / "corpus-away")
    try:
        assert problems(section.TABLES, tmp_path / "run") == {}
    finally:
        shutil.move(tmp_path / "corpus-away", made[0])


def test_an_edited_raw_row_fails(run: RunFiles):
    _edit_jsonl(run.run_dir / "raw" / "audit_files.jsonl", 0, lambda row: row.update(num_records=row["num_records"] + 1))
    failed = _failed(run)
    assert "raw/ rows balance (lines, kinds, duplicates, directories, sources)" in failed
    assert "results.json totals recompute from raw/" in failed
    assert REAUDIT in failed


def test_an_edited_raw_row_that_still_balances_fails_against_the_corpus(run: RunFiles):
    def edit(row):  # one blank line relabelled a malformed one: every sum still balances
        row["num_blank_lines"] -= 1
        row["num_malformed_lines"] += 1
        row["malformed"]["invalid_json"] = row["malformed"].get("invalid_json", 0) + 1
    rows = run.raw("audit_files.jsonl")
    index = next(i for i, f in enumerate(rows) if f["num_blank_lines"])
    _edit_jsonl(run.run_dir / "raw" / "audit_files.jsonl", index, edit)
    failed = _failed(RunFiles(run.run_dir))
    assert "results.json totals recompute from raw/" in failed  # results still say the old totals
    assert REAUDIT in failed


def test_an_edited_results_figure_fails(run: RunFiles):
    _edit_results(run, lambda r: r["audit"]["summary"].update(num_records=r["audit"]["summary"]["num_records"] + 1))
    assert _failed(run) == ["results.json totals recompute from raw/"]


def test_an_edited_verdict_fails(run: RunFiles):
    _edit_results(run, lambda r: r["lineage"].update(qualifies=True))
    assert _failed(run) == ["lineage verdict recomputes from raw/ counts"]


def test_an_edited_share_fails(run: RunFiles):
    rows = run.raw("audit_sources.jsonl")
    index = next(i for i, s in enumerate(rows) if s["fields"])

    def edit(row):
        name = next(iter(row["fields"]))
        row["fields"][name][0] = row["num_object_records"] * 45_268
    _edit_jsonl(run.run_dir / "raw" / "audit_sources.jsonl", index, edit)
    assert "coverage shares lie in [0, 1]" in _failed(RunFiles(run.run_dir))


def test_an_edited_input_hash_fails(run: RunFiles):
    _edit_results(run, lambda r: r["inputs"].update({next(iter(r["inputs"])): "0" * 64}))
    assert _failed(run) == ["results inputs are the audited files' hashes"]
    _edit_jsonl(run.run_dir / "raw" / "audit_files.jsonl", 0, lambda row: row.update(sha256="0" * 64))
    failed = _failed(RunFiles(run.run_dir))
    assert {"set hash recomputes from raw/ file hashes", REHASH, REAUDIT} <= set(failed)


def test_an_edited_contract_capture_fails(run: RunFiles):
    path = run.run_dir / "raw" / ta.CONTRAST_CAPTURE
    _edit_jsonl(path, 0, lambda row: row.update(output_token_ids=[3, 5]))
    assert _failed(run) == ["contract capture is unchanged, valid and qualifies"]


def test_a_missing_raw_table_fails(run: RunFiles):
    (run.run_dir / "raw" / "audit_problems.jsonl").unlink()
    failed = _failed(run)
    assert "raw/ holds every audit table" in failed
    assert "results.json totals recompute from raw/" in failed  # num_problems no longer recomputes


def test_a_changed_corpus_file_fails(made, tmp_path):
    corpus = tmp_path / "corpus"
    shutil.copytree(made[0], corpus, symlinks=True)
    run = make_run(tmp_path / "run", str(corpus))
    assert set(_status(run).values()) == {"ok"}
    (corpus / "alpha" / "sub" / "b.ndjson").write_text(_line({"changed": True}))
    assert _failed(run) == [REHASH, REAUDIT]


def test_without_the_corpus_the_corpus_checks_are_skipped_never_ok(made, tmp_path, monkeypatch):
    """A run made under one data root, verified on a machine whose data root is empty."""
    data = tmp_path / "data"
    shutil.copytree(made[0], data / "corpus", symlinks=True)
    monkeypatch.setenv("KMESH_DATA_ROOT", str(data))
    run = make_run(tmp_path / "run", "$KMESH_DATA_ROOT/corpus")
    assert "$KMESH_DATA_ROOT/corpus" in (run.run_dir / "params.resolved.yaml").read_text()
    assert set(_status(run).values()) == {"ok"}
    monkeypatch.setenv("KMESH_DATA_ROOT", str(tmp_path / "empty"))
    checks = {c.name: c for c in section.checks(run)}
    assert (checks[REHASH].status, checks[REAUDIT].status) == ("skipped", "skipped")
    assert "not on this machine" in checks[REHASH].detail and str(tmp_path / "empty") in checks[REHASH].detail
    assert {c.status for name, c in checks.items() if name not in (REHASH, REAUDIT)} == {"ok"}


def test_counts_headline_and_answer_come_from_the_files(run: RunFiles):
    counts = section.counts(run)
    assert all(isinstance(v, (int, str)) for v in counts.values())
    assert counts["set_sha256"] == run.results["audit"]["set_sha256"]
    headline = section.headline(run)
    assert 2 <= len(headline) <= 6 and headline["qualifying sources"] == "0 of 4"
    answer = section.answer(run)
    assert answer.startswith("**No.**") and "malformed lines were not read" in answer
    _edit_jsonl(run.run_dir / "raw" / "audit_files.jsonl", 0, lambda row: row.update(num_records=999))
    assert section.counts(RunFiles(run.run_dir))["num_records"] == counts["num_records"] - 4 + 999


# -- public results ------------------------------------------------------------------------------

def test_public_results_hold_no_planted_secret(run: RunFiles):
    public = section.public_results(run)
    text = json.dumps(public)
    assert SECRET not in text and SECRET_TEXT not in text and "x" * 41 not in text
    assert not any(str(t) in text for t in TOKEN_IDS)
    assert "caf\\udce9" not in text and "\\udc" not in text
    names = ([r["field"] for r in public["coverage"]] + [r["field"] for r in public["timestamp_units"]]
             + [r["source"] for r in public["sources"]])
    paths = [f["relpath"] for f in public["input_files"]] + [p["relpath"] for p in public["problems"]]
    assert all(is_safe(n) or is_safe(n, 64) for n in names)
    assert all(is_safe(part, 64) for p in paths for part in p.split("/"))
    assert set(public) == {"schema", "corpus", "limits", "summary", "sources", "coverage", "timestamp_units",
                           "lineage", "contrast", "input_files", "num_input_files", "problems", "malformed_files",
                           "duplicate_groups"}


def test_public_results_re_screen_an_edited_raw_row(run: RunFiles):
    _edit_jsonl(run.run_dir / "raw" / "audit_sources.jsonl", 0,
                lambda row: row["fields"].update({SECRET + " in a raw row": [1, 1]}))
    _edit_jsonl(run.run_dir / "raw" / "audit_files.jsonl", 0, lambda row: row.update(relpath=f"alpha/{SECRET} x.jsonl"))
    text = json.dumps(section.public_results(RunFiles(run.run_dir)))
    assert SECRET not in text


def test_public_results_stay_small_with_many_keys_and_files(tmp_path: Path):
    corpus = tmp_path / "corpus"
    for s in range(3):
        (corpus / f"s{s}").mkdir(parents=True)
        for i in range(120):
            (corpus / f"s{s}" / f"f{i}.jsonl").write_text(
                _line({f"field_{s}_{i}_{j}": j for j in range(60)} | {f"t{i}_{j}_at": 1.7e9 for j in range(5)}))
    run = make_run(tmp_path / "run", str(corpus))
    public = section.public_results(run)
    assert len(public["input_files"]) == MAX_PUBLIC_ROWS and public["num_input_files"] == 360
    assert max(sum(r["source"] == s for r in public["coverage"]) for s in ("s0", "s1", "s2")) == MAX_PUBLIC_FIELDS
    assert all(0 <= r["share"] <= 1 for r in public["coverage"])
    assert len(json.dumps(public)) < 150_000


# -- params, plan, tables ------------------------------------------------------------------------

@pytest.mark.parametrize("values, message", [
    ({"TRACE_ROOT": "/nonexistent/traces"}, "TRACE_ROOT='/nonexistent/traces': .* does not exist"),
    ({"MAX_LINE_MB": 0}, r"MAX_LINE_MB=0: must be > 0"),
    ({"MAX_LINE_MB": float("inf")}, r"MAX_LINE_MB=inf: expected a finite number"),
    ({"MAX_DEPTH": -1}, r"MAX_DEPTH=-1: must be >= 0"),
    ({"MAX_DEPTH": 10**6}, r"MAX_DEPTH=1000000: must be <= 4096"),
    ({"MAX_JSON_DEPTH": 0}, r"MAX_JSON_DEPTH=0: must be >= 1"),
    ({"MAX_JSON_DEPTH": 1000}, r"MAX_JSON_DEPTH=1000: must be <= 256"),
])
def test_bad_params_name_the_key(values, message, tmp_path: Path):
    with pytest.raises(params.ParamError, match=message):
        params.build(section.Params, {"TRACE_ROOT": str(tmp_path)} | values).check_runnable()


def test_a_file_as_root_is_a_param_error(tmp_path: Path):
    not_dir = tmp_path / "file.jsonl"
    not_dir.write_text("{}\n")
    cfg = params.build(section.Params, {"TRACE_ROOT": str(not_dir)})  # a finished run's params read anywhere
    with pytest.raises(params.ParamError, match="is not a directory"):
        cfg.check_runnable()  # a run, or a plan, needs the corpus
    with pytest.raises(params.ParamError, match="MAX_LINE_MB=0: must be > 0"):
        params.build(section.Params, {"TRACE_ROOT": str(tmp_path), "MAX_LINE_MB": 0})


@pytest.mark.requires_data("lmcache-agent-trace")
def test_cli_plan_names_only_the_params_files_there_are(capsys):
    assert main(["plan", "17", "--profile", "gpu"]) == 0  # section 17 has no YAML layer: says so, never an empty line
    assert "\nparams files: none for profile gpu (section 17's defaults and --set values only)\n" in capsys.readouterr().out
    assert main(["plan", "00", "--profile", "smoke"]) == 0
    assert "\nparams files: params/engine.smoke.yaml\n" in capsys.readouterr().out


def test_cli_plan_fails_with_exit_2_naming_the_fetch(capsys, tmp_path, monkeypatch):
    assert main(["plan", "17", "--set", "TRACE_ROOT=/nonexistent/traces"]) == 2
    assert "TRACE_ROOT='/nonexistent/traces'" in capsys.readouterr().err
    monkeypatch.setenv("KMESH_DATA_ROOT", str(tmp_path))
    assert main(["plan", "17", "--profile", "smoke"]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "lmcache-agent-trace") in err and "kmesh data fetch" in err


def test_roots_resolve_against_the_data_root_or_the_repo(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # papermill runs notebooks from notebooks/
    assert ta_params.resolve_root("kmesh_lib") == REPO_ROOT / "kmesh_lib"
    monkeypatch.setenv("KMESH_DATA_ROOT", str(tmp_path / "d"))
    assert ta_params.resolve_root("$KMESH_DATA_ROOT/lmcache-agent-trace") == tmp_path / "d" / "lmcache-agent-trace"
    assert section.Params.TRACE_ROOT == "$KMESH_DATA_ROOT/lmcache-agent-trace"
    cfg = params.build(section.Params, {"TRACE_ROOT": "kmesh_lib", "MAX_LINE_MB": 0.5})
    assert cfg.max_line_bytes == 1 << 19


def test_params_layer_without_engine_files(tmp_path):
    for name in ("common.yaml", "trace_audit.yaml", "engine.smoke.yaml", "trace_audit.smoke.yaml"):
        (tmp_path / name).write_text("SEED: 1\n")
    files = params.param_files(section.KEY, "smoke", section.USES_ENGINE, tmp_path)
    assert [f.name for f in files] == ["common.yaml", "trace_audit.yaml", "trace_audit.smoke.yaml"]


def test_plan_counts_files_and_bytes_without_following_links(tmp_path: Path):
    corpus = write_hostile_corpus(tmp_path / "corpus")
    cfg = params.build(section.Params, {"TRACE_ROOT": str(corpus)} | RUN_PARAMS)
    out = ta.plan(cfg)
    assert out["files to audit"].startswith("8 JSONL files, ") and "2 symbolic links reported, not followed" in \
        out["files to audit"]
    assert "1 other file listed" in out["files to audit"]
    assert SECRET not in json.dumps(out)


def test_contract_example_is_valid_and_qualifies(tmp_path: Path):
    path = tmp_path / "c" / "kmesh-capture" / "capture.jsonl"
    report = write_capture(path, ta.contract_example("r"))
    assert report.ok and (report.num_families, report.num_parent_links) == (2, 2)
    lineage = audit_tree(tmp_path / "c").lineage
    assert lineage.qualifies and lineage.num_lineage_edges == 2


def test_tables_and_matrices(tmp_path: Path):
    root = tmp_path / "corpus"
    (root / "alpha").mkdir(parents=True)
    (root / "beta").mkdir()
    rec = {"timestamp": 1_760_000_000_000_000, "session_id": "s0", "input": "hi", "output": "yo"}
    (root / "alpha" / "a.jsonl").write_text(_line(rec) + _line(rec) + "{broken\n")
    (root / "beta" / "b.jsonl").write_text(_line(rec | {"session_id": "s1", "model": None}))
    audit = audit_tree(root)
    labels = ta.source_labels(audit)
    assert labels == {"alpha": "alpha (2 records)", "beta": "beta (1 record)"}
    have = ta.coverage_matrix(audit)
    assert have.loc["beta (1 record)", "model"] == 0.0  # present but null
    assert have.loc["alpha (2 records)", "model"] == 0.0  # absent
    assert have.loc["alpha (2 records)", "input"] == 1.0
    need = ta.requirement_matrix(audit.lineage, labels)
    assert need.shape == (2, 5) and (need == 0).all().all()
    assert list(ta.verdict_table(audit.lineage)["qualifies"]) == [False, False]
    assert ta.timestamp_table(audit)["unit"].tolist() == ["us", "us"]
    assert "0 lineage edges: no parent reference names an id in this source" in set(
        ta.reasons_table(audit.lineage)["reason"])
