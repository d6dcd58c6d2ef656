"""A run resumed over several device calls keeps one machine and one stack: a call elsewhere is refused."""

import json

import pytest

from kmesh_lib.base.records import RunFileError, write_environment


def env(device="NVIDIA H200", vllm="0.26.0", nvidia_driver="570.86.15"):
    return {"device": device, "packages": {"vllm": vllm, "lmcache": "0.5.3", "torch": "2.11.0"}, "time_utc": "t",
            "nvidia_driver": nvidia_driver}


def test_a_resumed_call_on_the_same_machine_is_appended(tmp_path):
    path = tmp_path / "env.json"
    write_environment(path, env(), resume=True)
    write_environment(path, env() | {"time_utc": "later"}, resume=True)
    recorded = json.loads(path.read_text())
    assert recorded["time_utc"] == "t" and [c["time_utc"] for c in recorded["calls"]] == ["later"]


@pytest.mark.parametrize("other,named", [(env(device="NVIDIA H100 80GB HBM3"), "device"), (env(vllm="0.27.0"), "vllm"),
                                         (env(nvidia_driver="580.65.06"), "NVIDIA driver '570.86.15' -> '580.65.06'"),
                                         ({k: v for k, v in env().items() if k != "nvidia_driver"}, "NVIDIA driver")])
def test_a_resumed_call_on_another_machine_or_stack_is_refused(tmp_path, other, named):
    path = tmp_path / "env.json"
    write_environment(path, env(), resume=True)
    with pytest.raises(RunFileError, match=named):
        write_environment(path, other, resume=True)
    assert "calls" not in json.loads(path.read_text())  # nothing of the refused call is recorded


def test_a_run_begun_before_the_driver_was_recorded_is_held_to_the_rest(tmp_path):
    """env.json of a run begun before kmesh recorded nvidia_driver has no such key: its resumed calls are compared on
    the device and the stack alone, not refused for a driver the first call never named."""
    path = tmp_path / "env.json"
    path.write_text(json.dumps({k: v for k, v in env().items() if k != "nvidia_driver"}))
    write_environment(path, env(nvidia_driver="580.65.06") | {"time_utc": "later"}, resume=True)
    assert json.loads(path.read_text())["calls"][0]["nvidia_driver"] == "580.65.06"
    with pytest.raises(RunFileError, match="vllm"):
        write_environment(path, env(vllm="0.27.0", nvidia_driver="580.65.06"), resume=True)


def test_a_first_call_that_could_not_read_the_driver_is_held_to_the_rest(tmp_path):
    """A first call whose nvidia-smi and /proc read failed recorded the driver as None: a later call that reads one
    resumes (nothing to compare it with) and is recorded; a later call that cannot read it after one was named is
    still refused."""
    path = tmp_path / "env.json"
    write_environment(path, env(nvidia_driver=None), resume=True)
    write_environment(path, env() | {"time_utc": "later"}, resume=True)
    assert json.loads(path.read_text())["calls"][0]["nvidia_driver"] == "570.86.15"
    named = tmp_path / "named.json"
    write_environment(named, env(), resume=True)
    with pytest.raises(RunFileError, match="NVIDIA driver '570.86.15' -> None"):
        write_environment(named, env(nvidia_driver=None), resume=True)


def test_a_new_run_overwrites(tmp_path):
    path = tmp_path / "env.json"
    write_environment(path, env(), resume=False)
    write_environment(path, env(device="other"), resume=False)
    assert json.loads(path.read_text())["device"] == "other"


def test_a_resumed_call_with_other_engine_settings_is_refused(tmp_path, monkeypatch):
    """``VLLM_KV_CACHE_LAYOUT=HND`` changes the KV layout every copy kernel writes: a call set otherwise measures
    another engine. Variables outside vLLM's and LMCache's (CUDA_*, ...) are recorded, not compared; a run begun
    before env.json recorded them is held to the rest."""
    from kmesh_lib.base.records import engine_environ

    monkeypatch.setenv("VLLM_KV_CACHE_LAYOUT", "HND")
    monkeypatch.setenv("VLLM_API_KEY", "not recorded")
    recorded = engine_environ()
    assert recorded["VLLM_KV_CACHE_LAYOUT"] == "HND" and "VLLM_API_KEY" not in recorded
    path = tmp_path / "env.json"
    write_environment(path, env() | {"environ": {"VLLM_KV_CACHE_LAYOUT": "HND", "CUDA_MODULE_LOADING": "LAZY"}}, True)
    write_environment(path, env() | {"environ": {"VLLM_KV_CACHE_LAYOUT": "HND"}}, resume=True)
    with pytest.raises(RunFileError, match="engine settings"):
        write_environment(path, env() | {"environ": {}}, resume=True)
    before = tmp_path / "before.json"
    write_environment(before, env(), resume=True)
    write_environment(before, env() | {"environ": {"VLLM_KV_CACHE_LAYOUT": "HND"}}, resume=True)
    assert len(json.loads(before.read_text())["calls"]) == 1
