"""pip's configuration as uv's arguments, one per line, for scripts/setup_env.sh: uv reads no pip.conf nor PIP_*.

``pip config list`` gives pip's own view (its files and PIP_* variables); its find-links, index URLs and constraints
become uv's flags (pip's index-url: the last one set), with ``--index-strategy unsafe-best-match`` as pip chooses
across indexes (the best version from any). Run by the venv's python, so ``pip`` is that venv's.
"""
from __future__ import annotations

import re
import subprocess
import sys

FLAGS = (("index-url", "--index-url"), ("extra-index-url", "--extra-index-url"), ("find-links", "--find-links"),
         ("constraint", "--constraint"))


def uv_args(pip_config_list: str) -> list[str]:
    """uv's flags from ``pip config list`` output (``section.key='value'`` lines; a value may hold several, by space)."""
    conf: dict[str, list[str]] = {}
    for line in pip_config_list.splitlines():
        m = re.match(r"^[^.]*\.([\w-]+)='(.*)'$", line.strip())
        if m:
            values = conf.setdefault(m.group(1), [])
            values += [v for v in m.group(2).split() if v not in values]
    args = []
    for key, flag in FLAGS:
        for value in conf.get(key, [])[-1:] if key == "index-url" else conf.get(key, []):
            args += [flag, value]
    return args + ["--index-strategy", "unsafe-best-match"]


if __name__ == "__main__":
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    print("\n".join(uv_args(listed)))
