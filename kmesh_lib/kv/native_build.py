"""The project's C sources, compiled once per content (and flags) into a per-user cache, as Triton compiles
its own launcher stubs: ``cc -O2 -shared -fPIC``. A concurrent build replaces the library atomically."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sysconfig
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(tempfile.gettempdir(), f"kmesh-{os.getuid()}")
    return Path(base) / "kmesh"


def python_include() -> list[str]:
    """The flags that find ``Python.h`` for this interpreter (raises ``FileNotFoundError`` where it has none)."""
    include = sysconfig.get_paths().get("include") or ""
    if not (Path(include) / "Python.h").is_file():
        raise FileNotFoundError(f"no Python.h in {include!r} (the interpreter's development headers)")
    return [f"-I{include}"]


def build_library(source: Path, flags: tuple[str, ...] = (), error: type[Exception] = RuntimeError) -> Path:
    """The compiled library for ``source`` and ``flags`` (built once, by their hash). Raises ``error`` naming the
    compiler's complaint, or that there is no compiler."""
    text = source.read_bytes()
    key = hashlib.sha256(text + "\0".join(flags).encode()).hexdigest()[:16]
    out = cache_dir() / f"{source.stem}-{key}.so"
    if out.exists():
        return out
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise error("no C compiler (cc, gcc or clang) on PATH")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    proc = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(tmp), str(source), *flags],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise error(f"{cc} failed on {source.name}: {proc.stderr.strip().splitlines()[-1:]}")
    os.replace(tmp, out)
    return out
