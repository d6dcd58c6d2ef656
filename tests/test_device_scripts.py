"""``scripts/device_run.sh``'s checks before it installs or runs anything on the GPU machine, whose copy of the
tree has no .git, and the measured provenance of such a copy (``base.provenance``): the commit is recorded only
when every file matches the carried manifest, and dirty is measured, never typed."""
import json
import os
import shutil
import subprocess
from pathlib import Path

from kmesh_lib.base import provenance

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "device_run.sh"
REPO = SCRIPT.parent.parent


def _run(tmp_path: Path, manifest: bool, items: tuple[str, ...] = ("21",), sets: dict | None = None
         ) -> subprocess.CompletedProcess:
    """The script from a copy of it in ``tmp_path`` (no .git above it), with a ``python3`` that fails at once:
    past the checks, the first thing the script runs is pip, so exit status 1 means the checks let it through."""
    shutil.copy(SCRIPT, tmp_path / "device_run.sh")
    if manifest:
        (tmp_path / provenance.MANIFEST).write_text("{}")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text("#!/bin/sh\nexit 7\n")
    (bin_dir / "python3").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KMESH_", "GIT_"))}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", GIT_CEILING_DIRECTORIES=str(tmp_path.parent), **(sets or {}))
    return subprocess.run(["sh", "device_run.sh", *items], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60)


def test_a_copy_without_git_or_manifest_stops_before_anything_runs(tmp_path):
    out = _run(tmp_path, manifest=False)
    assert out.returncode == 2
    assert "no .kmesh-tree.json" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_a_copy_with_a_manifest_gets_past_the_check(tmp_path):
    out = _run(tmp_path, manifest=True)
    assert out.returncode == 1 and "no .kmesh-tree.json" not in out.stderr


def test_named_items_run_one_section_twice_in_a_call_each_with_its_own_overrides(tmp_path):
    """A lent call is 10 minutes and a machine start costs 1-3; section 21's MP tier at 0.5B and at 7B is about 2-4
    minutes each, so one call runs both: items 21/mp05 and 21/mp7, overrides in KMESH_SET_mp05 and KMESH_SET_mp7."""
    named = _run(tmp_path, manifest=True, items=("21/mp05", "21/mp7"),
                 sets={"KMESH_SET_mp05": "MODELS=[qwen2.5-0.5b]", "KMESH_SET_mp7": "MODELS=[qwen2.5-7b]"})
    assert named.returncode == 1 and "matches no section" not in named.stderr  # past the checks, at pip
    (tmp_path / "bin").rename(tmp_path / "bin-1")
    stray = _run(tmp_path, manifest=True, items=("21/mp05",), sets={"KMESH_SET_mp7": "MODELS=[qwen2.5-7b]"})
    assert stray.returncode == 2 and "KMESH_SET_mp7 matches no section given (21/mp05)" in stray.stderr


def test_import_reads_section_and_profile_from_a_named_items_archive():
    """import_device_run.sh takes <section>-<profile>-<name>.tgz as it takes <section>-<profile>.tgz."""
    script = (REPO / "scripts" / "import_device_run.sh").read_text()
    line = next(x for x in script.splitlines() if x.startswith("section="))
    for name, want in (("21-gpu-mp05", "21 gpu"), ("22-gpu", "22 gpu"), ("16-smoke", "16 smoke")):
        got = subprocess.run(["sh", "-c", f'name={name}; {line}; echo "$section $profile"'], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        assert got == want, (name, got)


def _copy_of_checkout(tmp_path: Path) -> tuple[Path, dict]:
    """A copy of this checkout's committed files without .git, with the manifest of HEAD."""
    manifest = provenance.tree_manifest(REPO)
    copy = tmp_path / "tree"
    for name in manifest["files"]:
        if name.startswith(provenance.WATCHED):
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            out = subprocess.run(["git", "show", f"HEAD:{name}"], cwd=REPO, capture_output=True, check=True)
            (copy / name).write_bytes(out.stdout)
    (copy / provenance.MANIFEST).write_text(json.dumps(manifest))
    return copy, manifest


def test_a_manifested_copy_records_its_commit_only_while_every_file_matches(tmp_path):
    copy, manifest = _copy_of_checkout(tmp_path)
    clean = provenance.git_revision(copy)
    assert clean == {"commit": manifest["commit"], "dirty": False, "source": provenance.MANIFEST}
    edited = copy / "kmesh_lib" / "base" / "checks.py"
    edited.write_text(edited.read_text() + "\n# edited on the device\n")
    dirty = provenance.git_revision(copy)
    assert dirty["commit"] is None and dirty["dirty"] is True and dirty["manifest_commit"] == manifest["commit"]
    assert dirty["changed"] == ["changed kmesh_lib/base/checks.py"]
    edited.unlink()
    (copy / "kmesh_lib" / "extra.py").write_text("x = 1\n")
    assert provenance.git_revision(copy)["changed"] == ["missing kmesh_lib/base/checks.py", "added kmesh_lib/extra.py"]


def test_a_manifested_copy_beside_a_stale_git_records_the_manifests_commit(tmp_path):
    """The GPU machine's copy kept an earlier call's .git (5 Dec: HEAD c458964, dirty against the tree): a manifest
    the tree matches names the commit; a clean git still wins over any manifest, a dirty one where the manifest
    does not match either."""
    copy, manifest = _copy_of_checkout(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    subprocess.run(["git", "init", "-q", str(copy)], check=True, env=env)
    subprocess.run(["git", "-C", str(copy), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                    "--allow-empty", "-m", "stale"], check=True, env=env)
    subprocess.run(["git", "-C", str(copy), "add", "kmesh_lib/base/checks.py"], check=True, env=env)
    stale = subprocess.run(["git", "-C", str(copy), "rev-parse", "HEAD"], capture_output=True, text=True,
                           env=env).stdout.strip()
    got = provenance.git_revision(copy)
    assert (got["commit"], got["dirty"], got["source"]) == (manifest["commit"], False, provenance.MANIFEST)
    assert {k: got["stale_git"][k] for k in ("commit", "dirty", "code_changed")} == {
        "commit": stale, "dirty": True, "code_changed": True}
    edited = copy / "kmesh_lib" / "base" / "checks.py"
    edited.write_text(edited.read_text() + "\n# edited on the device\n")
    neither = provenance.git_revision(copy)  # neither matches: git's, dirty
    assert (neither["commit"], neither["dirty"], neither["code_changed"]) == (stale, True, True)
    subprocess.run(["git", "-C", str(copy), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-a",
                    "-m", "now"], check=True, env=env)
    assert provenance.git_revision(copy)["dirty"] is False  # a clean checkout: git's own commit


def test_a_dirty_checkout_beside_a_manifest_of_its_own_head_stays_dirty(tmp_path):
    """The manifest lets a copy leave docs and data behind; a checkout at the manifest's own commit with such a file
    deleted is dirty by git, and the manifest must not clean it (review, 5 Dec)."""
    copy, manifest = _copy_of_checkout(tmp_path)
    (copy / "docs").mkdir()
    (copy / "docs" / "note.md").write_text("a doc\n")
    (copy / provenance.MANIFEST).unlink()  # written again below, at this checkout's own HEAD (and left untracked)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    git = ["git", "-C", str(copy), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(copy)], check=True, env=env)
    subprocess.run([*git, "add", "-A"], check=True, env=env)
    subprocess.run([*git, "commit", "-q", "-m", "head"], check=True, env=env)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, env=env).stdout.strip()
    manifest = provenance.tree_manifest(copy)
    (copy / provenance.MANIFEST).write_text(json.dumps(manifest))
    assert manifest["commit"] == head and provenance.git_revision(copy) == {"commit": head, "dirty": False}
    (copy / "docs" / "note.md").unlink()  # outside the watched folders: the manifest alone would call it clean
    assert provenance.check_manifest(copy, manifest)["dirty"] is False
    assert provenance.git_revision(copy) == {"commit": head, "dirty": True, "num_changed": 1,
                                             "changed": ["D docs/note.md"], "code_changed": False}
    (copy / "kmesh_lib" / "base" / "checks.py").write_text("# edited\n")
    both = provenance.git_revision(copy)
    assert (both["dirty"], both["num_changed"], both["code_changed"]) == (True, 2, True)


def test_a_report_says_the_code_was_as_committed_where_only_other_files_differ():
    """6 Dec, H200: the device's copy carried .git at HEAD with outputs/ set aside, and three runs' reports read
    'c4eaf58 (uncommitted changes)' for code that was the commit's; the record now says which files differed."""
    from kmesh_lib.app.report import commit_text as commit_line

    outside = commit_line({"commit": "c4eaf58df456aa", "dirty": True, "num_changed": 300, "code_changed": False})
    assert outside == "c4eaf58df456, the code as committed (300 file(s) outside the code differ)"
    # the header names where they are (the record keeps the first few), not "uncommitted changes" before it
    listed = commit_line({"commit": "c4eaf58df456aa", "dirty": True, "num_changed": 419, "code_changed": False,
                          "changed": ["D outputs/crossover/a/env.json", "D outputs/retention/b/env.json"]})
    assert listed == "c4eaf58df456, the code as committed (419 file(s) outside the code differ, among them outputs/)"
    inside = commit_line({"commit": "c4eaf58df456aa", "dirty": True, "num_changed": 3, "code_changed": True})
    assert inside == "c4eaf58df456 (uncommitted changes)"
    old = commit_line({"commit": "c4eaf58df456aa", "dirty": True})
    assert old == "c4eaf58df456 (uncommitted changes)" and commit_line({"commit": "ab"}) == "ab"


def test_git_blob_id_is_gits_own(tmp_path):
    path = tmp_path / "f.txt"
    path.write_text("kmesh\n")
    out = subprocess.run(["git", "hash-object", str(path)], capture_output=True, text=True, check=True)
    assert provenance.git_blob_id(path) == out.stdout.strip()


def test_a_tree_without_git_inside_another_repository_records_no_commit(tmp_path, monkeypatch):
    """git looks upwards: a copy of the tree without .git inside another repository (the GPU machine's folder once
    gave an old kmesh commit) must record no commit, not that repository's."""
    from kmesh_lib.base import records

    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, env=env)
    subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                    "--allow-empty", "-m", "outer"], check=True, env=env)
    tree = tmp_path / "tree"
    tree.mkdir()
    monkeypatch.setattr(records, "REPO_ROOT", tree)
    assert records.git_revision() == {"commit": None, "dirty": None}
    monkeypatch.setattr(records, "REPO_ROOT", tmp_path)  # the repository's own root: its commit
    assert len(records.git_revision()["commit"]) == 40


SPLIT = Path(__file__).resolve().parent.parent / "scripts" / "device_stage_split.sh"


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True, capture_output=True)


def test_stage_split_puts_the_stage_and_the_commit_into_an_ignored_folder_of_the_other_checkout(tmp_path):
    """A helper's clone (``clone``) stages through the session's checkout (``session``): call 1's file in two parts
    that concatenate to it, call 2's files divided between b/ and c/, and the committed tree without outputs/."""
    clone, session = tmp_path / "clone", tmp_path / "session"
    for repo in (clone, session):
        repo.mkdir()
        _git(repo, "init", "-q")
    (session / ".gitignore").write_text("/.device-stage/\n")
    call1, call2 = clone / ".device-stage" / "call1", clone / ".device-stage" / "call2"
    (call2 / "wheels").mkdir(parents=True)
    call1.mkdir()
    big = os.urandom(40_000_000 + 1234)
    (call1 / "_C_stable_libtorch.abi3.so.xz").write_bytes(big)
    for name in ("install.sh", "SHA256SUMS", "lmcache-0.5.3-x.whl", "_vllm_fa3_C.abi3.so.xz", "wheels/w.whl"):
        (call2 / name).write_text(name)
    (clone / ".whl").mkdir()
    (clone / ".whl" / "p.whl").write_text("p")
    (clone / ".gitignore").write_text(".device-stage/\n.whl/\n")
    (clone / "outputs").mkdir()
    (clone / "outputs" / "x").write_text("published")
    (clone / "code.py").write_text("print(1)\n")
    _git(clone, "add", "-A")
    _git(clone, "commit", "-qm", "c")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    done = subprocess.run(["sh", str(SPLIT), str(session / ".device-stage" / "h3")], cwd=clone, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    dest = session / ".device-stage" / "h3"
    assert (dest / "a" / "part.0").read_bytes() + (dest / "b" / "part.1").read_bytes() == big
    assert sorted(p.name for p in (dest / "b").iterdir()) == ["_vllm_fa3_C.abi3.so.xz", "lmcache-0.5.3-x.whl", "part.1"]
    assert sorted(p.name for p in (dest / "c" / "call2").iterdir()) == ["SHA256SUMS", "install.sh", "wheels"]
    tree = dest / "c" / "tree"
    assert (tree / "code.py").is_file() and (tree / ".whl" / "p.whl").is_file() and not (tree / "outputs").exists()
    assert 'carry [".device-stage/h3/a"]' in done.stdout
    refused = subprocess.run(["sh", str(SPLIT), str(session / "visible")], cwd=clone, env=env, capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 2 and "not ignored" in refused.stderr and not (session / "visible").exists()


# where a standing run's params.resolved.yaml differs from its documented command for a reason the table states:
# section 19's puzzles were read from the device's copy of the data; 942c's control arm was renamed (issue 41)
DOCUMENTED_DIFFERENCES = {("gpu-20261204-190116-fefc", "PUZZLES_CSV"), ("gpu-20261205-053105-942c", "ARMS")}


def test_every_documented_kmesh_run_command_resolves_to_its_published_runs_params():
    """docs/gpu.md gives each standing run 'the command that measures it again', its --set values 'exactly where the
    run's params.resolved.yaml differs from the gpu profile'. Section 22's lacked NUM_REPEATS=1 after the profile
    went to 5 repeats: it would have run five traces per policy (about 29 min, past one device call), not the one
    the published run measured."""
    import re
    import shlex

    import yaml

    from kmesh_lib.app import registry
    from kmesh_lib.base.params import resolve_params, to_dict

    checked = []
    for line in (REPO / "docs" / "gpu.md").read_text().splitlines():
        cells = line.split(" | ")
        if len(cells) < 3 or "kmesh run " not in cells[2]:
            continue
        run_id = re.search(r"`((?:gpu|cpu)-\d{8}-\d{6}-\w+)`", cells[1]).group(1)
        command = re.search(r"`(?:[^`]*&& )?(kmesh run [^`]+)`", cells[2]).group(1)
        argv = shlex.split(command)
        if "--source-run" in argv:  # a driver's run rendered again (16, 20): its params are the driver's
            continue
        section = registry.get(argv[2])
        profile = argv[argv.index("--profile") + 1]
        sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
        config, _, _ = resolve_params(section, profile, [], sets)
        mine = to_dict(config)
        recorded = yaml.safe_load((REPO / "outputs" / section.KEY / run_id / "params.resolved.yaml").read_text())
        differ = {k for k, v in recorded.items() if k not in ("RUN_DIR", "SOURCE_RUN") and mine.get(k) != v}
        assert differ <= {k for r, k in DOCUMENTED_DIFFERENCES if r == run_id}, (run_id, command, differ)
        checked.append(run_id)
    assert len(checked) >= 9, checked


def test_code_moved_out_of_a_watched_folder_is_a_code_change(tmp_path):
    """``git status`` names a staged rename "R  old -> new": reading only the new path, code moved from kmesh_lib/ to
    docs/ read as "the code as committed" (its old place no longer holds it). Unusual names come quoted and escaped
    without -z; with it each path reads as it is."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    (tmp_path / "kmesh_lib").mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "kmesh_lib" / "x.py").write_text("x = 1\n")
    (tmp_path / "docs" / "a -> b \u00e9.md").write_text("a doc\n")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, env=env)
    subprocess.run([*git, "add", "-A"], check=True, env=env)
    subprocess.run([*git, "commit", "-q", "-m", "head"], check=True, env=env)
    (tmp_path / "docs" / "a -> b \u00e9.md").unlink()
    got = provenance.git_revision(tmp_path)
    assert (got["num_changed"], got["changed"], got["code_changed"]) == (1, ["D docs/a -> b \u00e9.md"], False)
    subprocess.run([*git, "mv", "kmesh_lib/x.py", "docs/x.py"], check=True, env=env)
    got = provenance.git_revision(tmp_path)
    assert (got["dirty"], got["num_changed"], got["code_changed"]) == (True, 2, True), got
    assert "R docs/x.py <- kmesh_lib/x.py" in got["changed"]


def test_a_named_item_whose_name_is_no_variable_suffix_is_refused(tmp_path):
    """The name after / is read as KMESH_SET_<name> through eval: "21/mp-05" read ${KMESH_SET_mp-05:-}, which is
    ${KMESH_SET_mp-...} with the default "05:-" (a stray --set), and a name holding $( ran it. Refused before anything
    runs; a plain name goes on to pip (exit 1 from the stand-in python3)."""
    for bad in ("21/mp-05", "21/", "21/a$(touch x)"):
        out = _run(tmp_path, manifest=True, items=(bad,))
        assert out.returncode == 2 and "a name after / is letters, digits and _ only" in out.stderr, (bad, out.stderr)
        assert not (tmp_path / "x").exists()
        (tmp_path / "bin").rename(tmp_path / f"bin-{len(list(tmp_path.iterdir()))}")
    assert _run(tmp_path, manifest=True, items=("21/mp_05",)).returncode == 1


def test_a_report_names_the_commit_of_every_device_call_a_resumed_run_spans(tmp_path):
    """087c (6 Dec): section 20's run resumed over four calls, the first two at da2903e, the other two at b5c8238;
    the header's commit is the first call's, so the calls are named beside it. env.json holds the first call at its
    top level and the later ones in ``calls``, as ``write_environment`` writes them (read as ``calls`` alone until
    7 Dec 2026, the report said three calls: one short, and the first call's commit given to the second)."""
    from kmesh_lib.app.report import calls_text
    from kmesh_lib.base.records import write_environment

    first = {"device": "H100", "git": {"commit": "da2903e3072b32", "dirty": True, "num_changed": 415,
                                       "code_changed": False}}
    later = {"device": "H100", "git": {"commit": "b5c8238eff17aa", "dirty": False}}

    def written(*calls: dict) -> dict:
        path = tmp_path / f"env-{len(list(tmp_path.iterdir()))}.json"
        for i, env in enumerate(calls):
            write_environment(path, dict(env), resume=i > 0)
        return json.loads(path.read_text())

    assert calls_text(written(first, first, later, later)) == (
        "4 device calls: calls 1-2 at da2903e3072b, the code as committed (415 file(s) outside the code differ); "
        "calls 3-4 at b5c8238eff17")
    assert calls_text(written(later, later)) == "2 device calls, all at b5c8238eff17"
    assert calls_text(written(later)) is None and calls_text({}) is None


def test_the_report_names_the_engine_settings_a_run_measured_with():
    """A KV layout set by VLLM_KV_CACHE_LAYOUT is part of the measurement: the header names what env.json's environ
    recorded of vLLM's and LMCache's variables; a run recorded before environ has no such row."""
    from kmesh_lib.app.report import engine_settings_text

    assert engine_settings_text({"environ": {"VLLM_KV_CACHE_LAYOUT": "HND", "CUDA_MODULE_LOADING": "LAZY"}}) == (
        "VLLM_KV_CACHE_LAYOUT=HND")
    assert engine_settings_text({"environ": {"CUDA_MODULE_LOADING": "LAZY"}}) == (
        "none set (vLLM's and LMCache's defaults)")
    assert engine_settings_text({}) is None


def test_the_report_names_the_card_and_host_cpu_each_call_measured_on(tmp_path):
    """From 7 Dec 2026 a GPU run's env.json records the card (a digest of its UUID) and the host's CPU: H100 runs of
    one point differ outside their intervals (vLLM's CPU-tier span at 1.5B, 16k: e7c8 11.40 ms, 408a 12.18, d7bf
    12.12), and nothing said whether they shared a card or a host. The report's device row names both; a run over
    calls on two cards names each card with its calls; a run recorded before names the device alone."""
    from kmesh_lib.app.report import device_text
    from kmesh_lib.base.records import write_environment

    def call(card: str) -> dict:
        return {"device": "NVIDIA H100 80GB HBM3", "host_cpu": "cpu: Intel(R) Xeon(R) Platinum 8480+",
                "topology": {"gpu_pcie": {"gpus": [{"index": "0", "card": card}]}}}

    path = tmp_path / "env.json"
    write_environment(path, call("aaaa11112222"), resume=False)
    env = json.loads(path.read_text())
    assert device_text(env) == "NVIDIA H100 80GB HBM3 (card aaaa11112222) on Intel(R) Xeon(R) Platinum 8480+"
    for card in ("aaaa11112222", "bbbb33334444", "bbbb33334444"):
        write_environment(path, call(card), resume=True)
    assert device_text(json.loads(path.read_text())) == (
        "NVIDIA H100 80GB HBM3 (cards: aaaa11112222, calls 1-2; bbbb33334444, calls 3-4) on Intel(R) Xeon(R) "
        "Platinum 8480+")
    assert device_text({"device": "NVIDIA H200"}) == "NVIDIA H200"
