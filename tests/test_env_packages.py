"""An env.json whose ``packages`` is null or missing records no package versions: every reader of it reads the
versions as not recorded ('?', left out of a stack line) instead of raising AttributeError on ``None.get``."""
import json
import shutil
from pathlib import Path

import pytest

from kmesh_lib.base.records import RunFiles, recorded_packages, write_environment

OUTPUTS = Path(__file__).resolve().parents[1] / "outputs"
UNRECORDED = [pytest.param(lambda env: env.update(packages=None), id="null"),
              pytest.param(lambda env: env.pop("packages"), id="missing")]


def published_copy(tmp_path: Path, section: str, unrecord) -> RunFiles:
    """The first published run of ``section``, copied, its env.json's packages made null or removed."""
    source = next(p for p in sorted((OUTPUTS / section).iterdir()) if (p / "results.json").is_file())
    run_dir = tmp_path / source.name
    shutil.copytree(source, run_dir)
    env = json.loads((run_dir / "env.json").read_text())
    unrecord(env)
    (run_dir / "env.json").write_text(json.dumps(env))
    return RunFiles(run_dir)


@pytest.mark.parametrize("unrecord", UNRECORDED)
def test_recorded_packages_of_an_env_without_them_is_empty(unrecord):
    env = {"device": "NVIDIA H200", "packages": {"vllm": "0.26.0"}}
    assert recorded_packages(env) == {"vllm": "0.26.0"}
    unrecord(env)
    assert recorded_packages(env) == {}
    assert recorded_packages({"packages": ["vllm"]}) == {}  # not a mapping: nothing recorded either


@pytest.mark.parametrize("unrecord", UNRECORDED)
@pytest.mark.parametrize("section", ["engine_check", "family_hold"])
def test_a_sections_answer_reads_unrecorded_versions_as_unknown(tmp_path, section, unrecord):
    from kmesh_lib.app.registry import find

    answer = find(section).answer(published_copy(tmp_path, section, unrecord))
    assert "vLLM" not in answer or "?" in answer


@pytest.mark.parametrize("unrecord", UNRECORDED)
def test_a_published_documents_stack_line_leaves_unrecorded_versions_out(unrecord):
    from kmesh_lib.app.published import stack_text

    env = {"device": "NVIDIA H200", "packages": {"vllm": "0.26.0", "lmcache": "0.5.3"}}
    assert stack_text({"environment": env}) == "NVIDIA H200; vLLM 0.26.0, LMCache 0.5.3"
    unrecord(env)
    assert stack_text({"environment": env}) == "NVIDIA H200"


@pytest.mark.parametrize("unrecord", UNRECORDED)
def test_a_resumed_run_whose_first_call_recorded_no_packages_is_refused_not_crashed(tmp_path, unrecord):
    from kmesh_lib.base.records import RunFileError

    first = {"device": "NVIDIA H200", "packages": {"vllm": "0.26.0"}, "time_utc": "t"}
    unrecord(first)
    path = tmp_path / "env.json"
    path.write_text(json.dumps(first))
    with pytest.raises(RunFileError, match="vllm None -> '0.26.0'"):  # unknown then, known now: not the same stack
        write_environment(path, {"device": "NVIDIA H200", "packages": {"vllm": "0.26.0"}, "time_utc": "u"}, resume=True)
