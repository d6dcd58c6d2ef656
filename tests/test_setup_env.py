"""``scripts/setup_env.sh`` hands pip's configuration to uv (``scripts/pip_config_for_uv.py``): uv reads neither
pip.conf nor PIP_*, so an index, a wheel folder or a constraint pip would use must reach uv as a flag, or uv would
resolve against PyPI alone and install another set than pip."""
import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "pip_config_for_uv.py"
spec = importlib.util.spec_from_file_location("pip_config_for_uv", SCRIPT)
pip_config_for_uv = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pip_config_for_uv)


def test_every_index_wheel_folder_and_constraint_pip_uses_reaches_uv_once():
    listed = """global.cert='/etc/ssl/certs/ca.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/wheels'
global.index-url='https://first.example/simple'
:env:.find-links='/opt/wheels'
:env:.index-url='https://mirror.example/simple'
:env:.default-timeout='180'
"""
    assert pip_config_for_uv.uv_args(listed) == [
        "--index-url", "https://mirror.example/simple",  # pip's last setting wins
        "--extra-index-url", "file:///opt/pypi/simple", "--extra-index-url", "file:///opt/pypi-more/simple",
        "--find-links", "/opt/wheels",  # set twice (file and PIP_FIND_LINKS), passed once
        "--constraint", "/etc/xdg/pip/constraints.txt",
        "--index-strategy", "unsafe-best-match"]


def test_no_pip_configuration_leaves_uv_its_defaults():
    assert pip_config_for_uv.uv_args("") == ["--index-strategy", "unsafe-best-match"]
