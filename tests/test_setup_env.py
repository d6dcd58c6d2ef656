"""``scripts/setup_env.sh`` hands pip's configuration to uv (``scripts/pip_config_for_uv.py``): uv reads neither
pip.conf nor PIP_*, so an index, a wheel folder or a constraint pip would use must reach uv as a flag, or uv would
resolve against PyPI alone and install another set than pip. The options are pip's own parse of its configuration
(its files in a temporary home here, and PIP_* variables), as ``pip install`` would read them."""
import importlib.util
import os
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "pip_config_for_uv.py"
spec = importlib.util.spec_from_file_location("pip_config_for_uv", SCRIPT)
pip_config_for_uv = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pip_config_for_uv)


@pytest.fixture
def pip_env(tmp_path, monkeypatch):
    """pip's configuration from this test alone: no PIP_* of the box's, its user and XDG files in tmp_path."""
    for name in list(os.environ):
        if name.startswith("PIP_"):
            monkeypatch.delenv(name)
    for name, sub in (("HOME", "home"), ("XDG_CONFIG_HOME", "home/.config"), ("XDG_CONFIG_DIRS", "xdg")):
        (tmp_path / sub).mkdir(parents=True, exist_ok=True)
        monkeypatch.setenv(name, str(tmp_path / sub))

    def configure(conf_text, **variables):
        conf = tmp_path / "pip.conf"
        conf.write_text(conf_text)
        monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
        for name, value in variables.items():
            monkeypatch.setenv(name, value)
        return pip_config_for_uv.uv_args(pip_config_for_uv.pip_install_options())
    return configure


def test_pip_install_reads_its_configuration_as_pip_does(pip_env):
    """pip's precedence (PIP_* over [install] over [global]), a variable replacing a file's list, a multi-line
    value (one URL a line, the usual pip.conf form) split into its URLs."""
    args = pip_env("[global]\nindex-url = https://global.example/simple\nextra-index-url =\n"
                   "    file:///opt/pypi/simple\n    file:///opt/pypi-more/simple\nfind-links = /opt/from-file\n"
                   "constraint = /etc/constraints.txt\n[install]\nindex-url = https://install.example/simple\n",
                   PIP_INDEX_URL="https://env.example/simple", PIP_FIND_LINKS="/opt/wheels")
    assert args == ["--index-url", "https://env.example/simple",
                    "--extra-index-url", "file:///opt/pypi/simple", "--extra-index-url", "file:///opt/pypi-more/simple",
                    "--find-links", "/opt/wheels",  # the variable's alone, as pip
                    "--constraint", "/etc/constraints.txt",
                    "--index-strategy", "unsafe-best-match"]


def test_no_index_and_pre_releases_reach_uv(pip_env):
    args = pip_env("[install]\nno-index = true\nfind-links = /opt/wheels\npre = yes\n")
    assert args == ["--no-index", "--find-links", "/opt/wheels", "--prerelease", "allow",
                    "--index-strategy", "unsafe-best-match"]


@pytest.mark.parametrize("setting", ["only-binary = :all:", "no-binary = numpy", "prefer-binary = true",
                                     "require-hashes = true", "upgrade = true"])
def test_a_setting_uv_is_not_handed_leaves_the_install_to_pip(pip_env, setting):
    with pytest.raises(pip_config_for_uv.NotHandedOn):
        pip_env(f"[global]\n{setting}\n")


def test_no_pip_configuration_leaves_uv_pypi(pip_env):
    assert pip_env("") == ["--index-url", "https://pypi.org/simple", "--index-strategy", "unsafe-best-match"]
