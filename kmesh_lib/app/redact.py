"""What publishing takes out of a run's files besides machine paths (``app.publish``).

``redact_folder(folder, notebook)`` rewrites a published copy in place:

- **credentials**: every credential-looking token (``base.public.CREDENTIAL_PATTERNS``: ``ghp_...``,
  ``AKIA...``, ``sk-ant-...``) in any text file, captures and the public file included, becomes
  its hashed form (``#`` + 12 hex digits of its SHA-256), the same token the same hash everywhere,
  so records that matched still match;
- **the machine**: ``env.json`` loses ``host``, ``platform`` (the kernel's release string)
  keeps only the system's name (``Linux``), and a machine path in a recorded engine variable (``environ``:
  ``CUDA_HOME=/usr/local/cuda``) keeps only its last part (``<path>/cuda``); the host name where a record names it after ``@``
  (section 19's ``clock_domain``, ``time.monotonic_ns@HOST``) becomes ``@<host>``;
- **engine log lines**: vLLM's and LMCache's log records in the notebook's stream outputs
  (``app.report.ENGINE_LINE``; a GPU run recorded before ``base.runlog`` printed them into
  cells, internal addresses included) are dropped, as ``report.html`` already drops them.

``xz``-compressed captures (a copy published before) are read and written back compressed, with
``app.compact``'s settings. ``scripts/redact_published_runs.py`` applies it to the published set.
"""
from __future__ import annotations

import json
import lzma
import re
from dataclasses import dataclass, field
from pathlib import Path

from kmesh_lib.app.report import ENGINE_LINE
from kmesh_lib.base.public import redact_credentials

HOST_MARK = "<host>"
PATH_MARK = "<path>"
MACHINE_PATH = re.compile(r"(?<![\w.~<>-])/[^\s:\"'<>]*")  # an absolute path, up to a separator (PATH-like values)
TEXT_SUFFIXES = (".json", ".yaml", ".ipynb", ".jsonl", ".html", ".txt", ".md", ".csv")


@dataclass
class Redacted:
    """What ``redact_folder`` changed: file -> what, in words."""

    changes: dict[str, list[str]] = field(default_factory=dict)

    def add(self, rel: str, what: str) -> None:
        self.changes.setdefault(rel, []).append(what)

    @property
    def captures(self) -> list[str]:
        """Captures (``raw/``) whose content changed."""
        return sorted(rel for rel in self.changes if rel.startswith("raw/"))


def redact_env(env: dict) -> tuple[dict, list[str]]:
    """``env`` without the host name, with ``platform`` cut to the system's name and the machine paths of its
    ``environ`` to their last part; the same for each of its ``calls`` (a run resumed over several device calls)."""
    out, what = dict(env), []
    if "host" in out:
        del out["host"]
        what.append("host name dropped")
    platform = out.get("platform")
    if isinstance(platform, str) and platform != platform.split("-")[0]:
        out["platform"] = platform.split("-")[0]
        what.append("kernel string dropped from platform")
    environ = out.get("environ")
    if isinstance(environ, dict):
        cut = {k: MACHINE_PATH.sub(lambda m: f"{PATH_MARK}/{m[0].rstrip('/').rsplit('/', 1)[-1]}", v)
               if isinstance(v, str) else v for k, v in environ.items()}
        if cut != environ:
            out["environ"] = cut
            what.append("machine paths in environ cut to their last part")
    calls = out.get("calls")  # a run measured over several device calls records each call's machine too
    if isinstance(calls, list):
        redacted = [redact_env(c) if isinstance(c, dict) else (c, []) for c in calls]
        if any(w for _, w in redacted):
            out["calls"] = [c for c, _ in redacted]
            what += [f"calls: {w}" for w in dict.fromkeys(w for _, ws in redacted for w in ws)]
    return out, what


def drop_engine_lines(nb: dict) -> int:
    """Removes engine log records from the stream outputs of notebook JSON ``nb`` (in place)."""
    dropped = 0
    for cell in nb.get("cells", []):
        outputs = []
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                text = out.get("text", "")
                lines = ("".join(text) if isinstance(text, list) else text).splitlines(keepends=True)
                kept = [line for line in lines if not ENGINE_LINE.match(line)]
                dropped += len(lines) - len(kept)
                if not "".join(kept).strip():
                    continue
                out["text"] = "".join(kept)
            outputs.append(out)
        if "outputs" in cell:
            cell["outputs"] = outputs
    return dropped


def _read(path: Path) -> str:
    data = lzma.decompress(path.read_bytes()) if path.suffix == ".xz" else path.read_bytes()
    return data.decode("utf-8", "surrogateescape")


def _write(path: Path, text: str) -> None:
    data = text.encode("utf-8", "surrogateescape")
    path.write_bytes(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME) if path.suffix == ".xz" else data)


def _is_text(path: Path) -> bool:
    name = path.name.removesuffix(".xz")
    return path.is_file() and not path.is_symlink() and name.endswith(TEXT_SUFFIXES)


def redact_folder(folder: Path, notebook: str) -> Redacted:
    """Redacts a run folder in place (module docstring); returns what changed."""
    folder = Path(folder)
    done = Redacted()
    host = None
    env_path = folder / "env.json"
    if env_path.is_file():
        env = json.loads(env_path.read_text())
        host = env.get("host") if isinstance(env.get("host"), str) and env.get("host") else None
        env, what = redact_env(env)
        if what:
            env_path.write_text(json.dumps(env, indent=1))
            for w in what:
                done.add("env.json", w)
    nb_path = folder / notebook
    if nb_path.is_file():
        nb = json.loads(nb_path.read_text())
        dropped = drop_engine_lines(nb)
        if dropped:
            nb_path.write_text(json.dumps(nb, sort_keys=True, ensure_ascii=False, separators=(",", ":")) + "\n")
            done.add(notebook, f"{dropped} engine log lines dropped")
    for path in sorted(p for p in folder.rglob("*") if _is_text(p)):
        rel = str(path.relative_to(folder))
        text = _read(path)
        new, n = redact_credentials(text)
        if host:
            mark = "@" + host
            hosts = new.count(mark + '"') + new.count(mark + "'") + new.count(mark + "\n")
            if hosts:
                new = new.replace(mark + '"', f'@{HOST_MARK}"').replace(mark + "'", f"@{HOST_MARK}'").replace(
                    mark + "\n", f"@{HOST_MARK}\n")
                done.add(rel, f"{hosts} host names")
        if n:
            done.add(rel, f"{n} credential-looking names hashed")
        if new != text:
            _write(path, new)
    return done
