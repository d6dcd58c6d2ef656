"""Layered YAML parameters, validated into typed, frozen pydantic dataclasses before any engine starts.

A section's parameters are its ``Params`` class's field defaults, changed by up to four files in
``params/`` (later files winning; a layer holds only the keys it changes):

    common.yaml -> <section>.yaml -> engine.<profile>.yaml -> <section>.<profile>.yaml
                                     (engine sections only)

then by ``--params FILE`` and ``--set KEY=VALUE``. Each field is declared once, with its default,
its bounds and its help text (``Field(description=...)``). Validation is strict: an int field
refuses ``1e9`` and ``true``, a float field refuses ``.inf`` and ``.nan``, a string refuses a
number. An unknown key, a mistyped or out-of-range value, a rule across fields (``check_rules``)
and a params file that cannot be read all raise ``ParamError``, one line naming the key (or
file) and what is allowed. papermill only warns about unknown parameters, so notebooks validate
their own namespace again with ``from_namespace``.
"""
from __future__ import annotations

import contextlib
import contextvars
import copy
import dataclasses
import difflib
import functools
import json
import os
import re
import reprlib
import stat
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, ConfigDict, Field, ValidationError, ValidationInfo, model_validator
from pydantic.dataclasses import dataclass as pydantic_dataclass

from kmesh_lib.base.data import resolve_path
from kmesh_lib.base.paths import PARAMS_DIR, published_folder

PROFILES = ("smoke", "cpu", "gpu")


MAX_ERROR_CHARS = 300  # an error is one line a person reads, never a page of the input


def one_line(text: object, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` on one line (whitespace runs become one space), at most ``limit`` characters: a
    longer line keeps its start (the key) and its end (what to do), cut in the middle."""
    line = " ".join(str(text).split())
    if len(line) <= limit:
        return line
    head = (limit - 3) // 2
    return line[:head] + "..." + line[len(line) - (limit - 3 - head):]


class ParamError(ValueError):
    """A parameter is unknown, mistyped or out of range, or a params file is unreadable.

    The message is one line of at most ``MAX_ERROR_CHARS`` characters and names the key (or the
    file) and what is allowed; it never quotes a params file's contents beyond a parameter name.
    """

    def __init__(self, message: object = "") -> None:
        super().__init__(one_line(message))


# -- bounds --
# Every count, size, time and seed has a finite range. The upper bounds sit far beyond any run
# here, so a researcher never meets them; they exist so that an overflow or a typo (1e9 blocks,
# 2**70 as a seed, .inf seconds) fails at validation, naming the key, instead of deep in a run.
MAX_SEED = 2**32 - 1  # vLLM seeds numpy with SEED, and np.random.seed takes 0 .. 2**32 - 1
MAX_COUNT = 1_000_000  # groups, samples, repeats, calls, sequences: a million of any is days of engine time
MAX_TOKENS_BOUND = 1 << 21  # 2,097,152 tokens: twice the longest context windows (1M) models ship with
MAX_BLOCK_SIZE = 4096  # tokens per KV block; vLLM's attention backends use 16 .. 1024
MAX_BLOCKS = 1 << 24  # 16.8M blocks: an H200's 141 GB holds ~8.6M 16-token blocks of the 1 KiB/token tiny shape
MAX_SECONDS = 7 * 24 * 3600  # a week: any timeout or ceiling longer than that is a typo
MAX_MS = 3_600_000  # an hour, for leads and poll intervals given in milliseconds
MAX_MIB = 1 << 22  # 4 TiB, for memory arenas, disk tiers and buffers
MAX_PATH_CHARS = 4096  # Linux PATH_MAX

Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
PositiveCount = Annotated[int, Field(ge=1, le=MAX_COUNT)]
Tokens = Annotated[int, Field(ge=1, le=MAX_TOKENS_BOUND)]
BlockSize = Annotated[int, Field(ge=1, le=MAX_BLOCK_SIZE)]
NumBlocks = Annotated[int, Field(ge=2, le=MAX_BLOCKS)]  # a pool: vLLM's null block + at least one usable block
Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS)]
Millis = Annotated[float, Field(ge=0, le=MAX_MS)]
Mib = Annotated[int, Field(ge=1, le=MAX_MIB)]
PathText = Annotated[str, Field(max_length=MAX_PATH_CHARS, pattern=r"^[^\x00]*$")]
MAX_LIST_ITEMS = 256  # entries of one list parameter: grids, sweeps and puzzle lists hold tens
# What is read before any value is looked at: a params file is a page of KEY: value lines, a --set
# value one value. Bounds on the text and on what YAML builds from it keep a device file, a deep
# or aliased document or a pasted file from costing memory, stack or time.
MAX_PARAMS_FILE_BYTES = 1 << 20
MAX_SET_CHARS = 1 << 16
MAX_NESTING = 16  # levels of lists and mappings in one params document
MAX_YAML_NODES = 2_000  # values in one params document: a profile holds about 50
PARAM_NAME = re.compile(r"^[A-Z][A-Z0-9_]{0,63}$")
# Keys a command line flag sets, refused in --set and params files (they would be ignored or misused)
RESERVED = {"PROFILE": "--profile", "RUN_DIR": "--run-dir (kmesh run)", "SOURCE_RUN": "--source-run (kmesh run)"}

# -- paths --
# A path parameter names a file or folder of the kind it needs, checked at validation: a folder a
# run writes into (a disk tier's parent) is an existing folder outside the system's and the
# published runs' folders, named without ``..``; a folder or file a run reads is one of that kind
# outside /proc, /sys, /dev and /etc.
READ_REFUSED = tuple(Path(p) for p in ("/proc", "/sys", "/dev", "/etc"))
WRITE_REFUSED = READ_REFUSED + tuple(Path(p) for p in ("/boot", "/usr", "/bin", "/sbin", "/lib", "/lib64", "/run",
                                                       "/var/run"))


def check_path(key: str, value: str, kind: Literal["dir", "file"], write: bool = False) -> Path:
    """``value`` (``$KMESH_DATA_ROOT/...``, repo-relative or absolute) as the resolved path of an
    existing ``kind``; ParamError naming ``key`` otherwise."""
    what = "folder" if kind == "dir" else "file"
    shown = f"{key}={_short.repr(value)}"
    if not value.strip():
        raise ParamError(f"{shown}: empty; name a {what}")
    if _READING_RECORDED.get():  # a finished run's path names the machine it ran on, not this one
        return Path(value)
    if write and ".." in Path(value).parts:
        raise ParamError(f"{shown}: a folder written to is named without '..'")
    try:
        path = resolve_path(value)
        path = path.resolve(strict=True)
    except FileNotFoundError:
        raise ParamError(f"{shown}: no such {what}") from None
    except (OSError, RuntimeError, ValueError) as e:
        raise ParamError(f"{shown}: cannot be resolved ({getattr(e, 'strerror', None) or 'a symlink loop?'})") from None
    for root in WRITE_REFUSED if write else READ_REFUSED:
        if path == root or path.is_relative_to(root):
            raise ParamError(f"{shown}: {path} is under {root}, a system folder; name a {what} of your own")
    if write and published_folder(path) is not None:
        raise ParamError(f"{shown}: inside the published runs, which runs never write to")
    if kind == "dir" and not path.is_dir():
        raise ParamError(f"{shown}: {path} is not a directory")
    if kind == "file" and not path.is_file():
        raise ParamError(f"{shown}: {path} is not a regular file")
    return path


def _write_root(value: str, info: ValidationInfo) -> str:
    """A folder a run writes under; empty means the default (the field's description says which)."""
    if value:
        check_path(info.field_name, value, "dir", write=True)
    return value


WriteRoot = Annotated[PathText, AfterValidator(_write_root)]

CONFIG = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, validate_default=True)


DECLARED: list[type] = []  # every params_dataclass, so an unknown key that is another's parameter can say so


def params_dataclass(cls: type) -> type:
    """Makes ``cls`` a frozen pydantic dataclass with kmesh's config (vLLM's ``@config``, stricter).

    Constructing it (directly, through ``build`` or ``dataclasses.replace``) validates every field
    and then ``check_rules``, and raises ``ParamError`` instead of pydantic's multi-line error.
    Each subclass needs the decorator again.
    """
    cls = pydantic_dataclass(cls, frozen=True, config=CONFIG)
    DECLARED.append(cls)
    validate = cls.__init__

    @functools.wraps(validate)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        try:
            validate(self, *args, **kwargs)
        except ValidationError as e:
            raise ParamError(describe(e)) from None

    cls.__init__ = __init__
    return cls


_READING_RECORDED = contextvars.ContextVar("reading_recorded_params", default=False)


@contextlib.contextmanager
def _reading_recorded():
    token = _READING_RECORDED.set(True)
    try:
        yield
    finally:
        _READING_RECORDED.reset(token)


def recorded(cls: type, values: dict[str, Any], where: str = "") -> Any:
    """A finished run's ``params.resolved.yaml`` as ``cls`` (``RunFiles.params``): every field typed and bounded
    as when the run started, an unknown key refused, each absent one at its declared default (over
    ``cls.predating_values``: what runs recorded before a parameter existed ran with), and every key and value
    renamed since under its current name (``current_names``: ``RENAMED``, ``RENAMED_VALUES``).

    Two things are not checked again: a path is not looked up (it names the machine the run measured on: the
    GPU machine's puzzle file), and ``check_rules`` is not run (the rules were checked before the run started,
    and some read inputs outside the run folder). Re-reading a run is not running it.

    Raises:
        ParamError: as ``build``.
    """
    values = {**getattr(cls, "predating_values", {}), **current_names(values)}  # under today's names and values
    with _reading_recorded():
        return build(cls, values, where)


def check(condition: bool, message: str) -> None:
    """``check_rules`` helper: raises ParamError(message) unless ``condition``."""
    if not condition:
        raise ParamError(message)


@params_dataclass
class RunParams:
    """Parameters every section has: where the run writes, its profile and the base seed."""

    RUN_DIR: PathText | None = Field(None, description="run directory; `kmesh run` sets it, None makes a new one")
    SEED: int = Field(0, ge=0, le=MAX_SEED, description="base seed of the weights, the prompts and vLLM's sampling")
    PROFILE: Literal["smoke", "cpu", "gpu"] = Field("cpu", description="the params profile these values came from")

    @model_validator(mode="after")
    def _check_rules_after_fields(self):
        if not _READING_RECORDED.get():
            self.check_rules()
        check_lists(self)  # after: a section's own message for a repeated entry is the more specific
        return self

    def check_rules(self) -> None:
        """Rules across fields, run after every field is valid; subclasses extend it with super()."""

    def check_runnable(self) -> None:
        """Raises ParamError when this machine cannot run these parameters (a device it lacks).

        Only a run about to start calls it (``from_namespace``, ``resolve_params(for_run=True)``):
        ``kmesh plan``, ``kmesh verify`` and re-reading a finished run validate without it.
        """


def check_lists(config: Any) -> None:
    """Every list parameter: at most ``MAX_LIST_ITEMS`` entries, each entry once (a grid, sweep or
    set of arms that names a value twice would measure it twice and key its tables twice)."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if not isinstance(value, list):
            continue
        check(len(value) <= MAX_LIST_ITEMS, f"{f.name}: {len(value)} entries; at most {MAX_LIST_ITEMS}")
        seen = set()
        for item in value:
            marker = json.dumps(item, sort_keys=True, default=str)
            check(marker not in seen, f"{f.name}: {_short.repr(item)} is given twice; name each entry once")
            seen.add(marker)


def shown_key(key: object) -> str:
    """A key as an error names it: a parameter-like name as it is, anything else (text of a file
    given by mistake) not quoted."""
    return repr(key) if isinstance(key, str) and PARAM_NAME.match(key) else "a key that is not a parameter name"


# -- reading files --

class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load, except that a key given twice in one mapping is an error, not 'last wins',
    and that anchors and aliases, more than ``MAX_NESTING`` levels and more than ``MAX_YAML_NODES``
    values are refused as the document is composed (before anything is built from it)."""

    def __init__(self, stream) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise ParamError(f"line {event.start_mark.line + 1}: YAML anchors and aliases (&name, *name) are not "
                             "allowed; write the value out")
        self._nodes += 1
        if self._nodes > MAX_YAML_NODES:
            raise ParamError(f"more than {MAX_YAML_NODES:,} values")
        self._depth += 1
        try:
            if self._depth > MAX_NESTING:
                raise ParamError(f"line {event.start_mark.line + 1}: nested deeper than {MAX_NESTING} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, str) and key in seen:
                raise ParamError(f"line {key_node.start_mark.line + 1}: {shown_key(key)} is given twice")
            seen.add(key if isinstance(key, str) else id(key_node))
        return super().construct_mapping(node, deep=deep)


def _flow_depth(text: str, limit: int) -> int:
    """How deep ``[`` and ``{`` nest in ``text`` outside quotes and comments, counted up to ``limit + 1``.

    Checked before YAML reads the text: PyYAML's scanner takes quadratic time on thousands of
    unclosed brackets, long before the composer's own depth check would see them.
    """
    depth = deepest = 0
    quote = None
    previous = "\n"
    i = 0
    while i < len(text):
        c = text[i]
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "#" and previous in " \t\n":
            i = text.find("\n", i)
            if i < 0:
                break
            c = "\n"
        elif c in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > limit:
                break
        elif c in "]}":
            depth = max(depth - 1, 0)
        if c == "\n":
            quote = None if quote == "'" else quote  # a quoted scalar may span lines; this count is a bound, not a parser
        previous = c
        i += 1
    return deepest


def parse_yaml(text: str, where: str) -> Any:
    """``text`` as plain YAML data (no Python tags); every YAML error is one ParamError line."""
    if _flow_depth(text, MAX_NESTING) > MAX_NESTING:
        raise ParamError(f"{where}: nested deeper than {MAX_NESTING} levels")
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except ParamError as e:
        raise ParamError(f"{where}: {e}") from None
    except yaml.constructor.ConstructorError as e:
        if e.problem and "constructor for the tag" in e.problem:  # !!python/object/apply:os.system and friends
            tag = e.problem.split("'")[1].replace("tag:yaml.org,2002:", "!!")
            raise ParamError(f"{where}: the tag {tag} is not allowed; params are plain YAML values") from None
        raise ParamError(f"{where}: {_line(e.problem)} at line {e.problem_mark.line + 1}") from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ParamError(f"{where}: YAML syntax error{at}: {_line(e.problem or e.context)}") from None
    except yaml.YAMLError as e:
        raise ParamError(f"{where}: not YAML ({_line(e)})") from None
    except RecursionError:  # MAX_NESTING stops a document first; this is the last guard
        raise ParamError(f"{where}: nested too deep") from None


def _line(text: Any) -> str:
    return " ".join(str(text).split())


def read_bounded(path: Path, limit: int, what: str) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; anything else raises ParamError.

    A device (/dev/zero), a FIFO or a socket is refused before it is opened for reading (and
    opened non-blocking, in case it is swapped in between); a longer file, /proc's included, is
    refused after ``limit + 1`` bytes, so nothing reads without end.
    """
    path = Path(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise ParamError(f"{path}: no such {what}") from None
    except (OSError, ValueError) as e:
        raise ParamError(f"{path}: cannot be read ({getattr(e, 'strerror', None) or type(e).__name__})") from None
    if stat.S_ISDIR(info.st_mode):
        raise ParamError(f"{path}: is a directory, not a {what}")
    if not stat.S_ISREG(info.st_mode):
        raise ParamError(f"{path}: not a regular file (a device, FIFO or socket), not a {what}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise ParamError(f"{path}: cannot be read ({e.strerror})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ParamError(f"{path}: not a regular file (a device, FIFO or socket), not a {what}")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 16, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as e:
        raise ParamError(f"{path}: cannot be read ({e.strerror})") from None
    finally:
        os.close(fd)
    if size > limit:
        raise ParamError(f"{path}: larger than {limit:,} bytes; a {what} is far smaller")
    return b"".join(chunks)


def read_yaml(path: Path) -> dict[str, Any]:
    """A params file as a mapping of KEY: value; a file that cannot be one raises ParamError."""
    path = Path(path)
    data = read_bounded(path, MAX_PARAMS_FILE_BYTES, "params file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ParamError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    data = parse_yaml(text, str(path))
    if data is None or data == {}:
        raise ParamError(f"{path}: holds no parameters; write KEY: value lines")
    if not isinstance(data, dict):
        raise ParamError(f"{path}: expected a mapping of KEY: value, got a {type(data).__name__}")
    return data


def param_files(section: str, profile: str, uses_engine: bool, params_dir: Path = PARAMS_DIR) -> list[Path]:
    """The layer files that exist for ``section`` and ``profile``, lowest first."""
    if profile not in PROFILES:
        raise ParamError(f"profile {profile!r} is not one of {', '.join(PROFILES)}")
    names = ["common.yaml", f"{section}.yaml"]
    if uses_engine:
        names.append(f"engine.{profile}.yaml")
    names.append(f"{section}.{profile}.yaml")
    return [params_dir / n for n in names if (params_dir / n).exists()]


def merge_files(paths: list[Path]) -> dict[str, Any]:
    """The layer files' values, later files winning; each file is parsed once per version of it."""
    merged: dict[str, Any] = {}
    for path in paths:
        info = Path(path).stat()
        merged.update(copy.deepcopy(_read_layer(Path(path), info.st_mtime_ns, info.st_size)))
    return merged


@functools.lru_cache(maxsize=64)
def _read_layer(path: Path, mtime_ns: int, size: int) -> dict[str, Any]:
    return read_yaml(path)


def check_reserved(values: dict[str, Any], where: str) -> None:
    """Refuses a key a command-line flag sets (``RESERVED``), naming the flag to use instead."""
    for key, flag in RESERVED.items():
        if key in values:
            raise ParamError(f"{where}: {key} is set by {flag}, not as a parameter")


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` items; each VALUE is read as YAML (``[1, 2]``, ``null``, ``0.5``)."""
    values = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ParamError(f"--set {_short.repr(item)}: expected KEY=VALUE")
        if not PARAM_NAME.match(key):
            raise ParamError(f"--set {_short.repr(key)}: not a parameter name (UPPER_CASE letters, digits and _)")
        check_reserved({key: None}, "--set")
        if key in values:
            raise ParamError(f"--set {key}: given twice")
        if len(raw) > MAX_SET_CHARS:
            raise ParamError(f"--set {key}: a value of {len(raw):,} characters (at most {MAX_SET_CHARS:,}); "
                             "put long values in a --params file")
        values[key] = parse_yaml(raw, f"--set {key}")
    return values


# -- building --

def fields_of(cls: type) -> dict[str, Any]:
    """Field name -> pydantic FieldInfo (``.default``, ``.description``), in declaration order."""
    return dict(cls.__pydantic_fields__)


def defaults(cls: type) -> dict[str, Any]:
    return {name: info.get_default(call_default_factory=True) for name, info in fields_of(cls).items()}


def build(cls: type, values: dict[str, Any], where: str = "", quote_unknown: bool = True) -> Any:
    """Builds ``cls`` (a ``params_dataclass`` with UPPER_CASE fields) from ``values``.

    Raises:
        ParamError: for an unknown key, a mistyped or out-of-range value, or a rule of
            ``cls.check_rules``; the message starts with ``where`` when given.
    """
    prefix = f"{where}: " if where else ""
    names = fields_of(cls)
    unknown = sorted((k for k in values if k not in names), key=str)
    if unknown:
        close = _close_names(unknown[0], names)
        owners = _declared_by(unknown[0], cls)  # a parameter of another section: its name is no file's content
        quoted = close or owners or (quote_unknown and isinstance(unknown[0], str) and PARAM_NAME.match(unknown[0]))
        raise ParamError(
            f"{prefix}unknown parameter " + (repr(unknown[0]) if quoted else "a key that is not a parameter name")
            + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else "") + f" for {cls.__name__}"
            + (f"; did you mean {' or '.join(close)}?" if close else
               f"; it is a parameter of {' and '.join(owners)}, not of {cls.__name__}" if owners else
               f"; it takes {len(names)} parameters, listed in its notebook's parameters cell"))
    renamed = renamed_value_error(values)  # a recorded run's values were renamed when it was read (current_names)
    if renamed:
        raise ParamError(f"{prefix}{renamed}")
    try:
        return cls(**values)
    except ParamError as e:
        raise ParamError(f"{prefix}{e}") from None


def _declared_by(key: object, cls: type) -> list[str]:
    """The params classes other than ``cls`` (and its bases) that declare ``key`` themselves."""
    if not (isinstance(key, str) and PARAM_NAME.match(key)):
        return []
    return [other.__name__ for other in DECLARED if other is not cls and key in fields_of(other)
            and not any(key in getattr(base, "__pydantic_fields__", {}) for base in other.__mro__[1:])][:2]


def _close_names(key: object, names) -> list[str]:
    """The parameter names ``key`` is a likely typo of. An unknown key of a --params file is quoted
    only then: any other may be a line of a file given by mistake (/etc/shadow), which an error
    never repeats; one that is not UPPER_CASE is never quoted."""
    if isinstance(key, str) and key.upper() in names and len(key) <= 64:
        return [key.upper()]  # 'seed': the name in another case, which quotes nothing but the name
    if not (isinstance(key, str) and PARAM_NAME.match(key)):
        return []
    return difflib.get_close_matches(key, list(names), n=3, cutoff=0.75)


def from_namespace(cls: type, namespace: dict[str, Any]) -> Any:
    """Builds ``cls`` from a notebook's globals: every UPPER_CASE name is a parameter.

    Any UPPER_CASE global that is not a field (a misspelt key papermill injected) is an error. A
    notebook is a run, so the machine is checked too (``check_runnable``).
    """
    values = {k: v for k, v in namespace.items() if k.isupper() and not k.startswith("_")}
    cfg = build(cls, values, where="notebook parameters")
    try:
        cfg.check_runnable()
    except ParamError as e:
        raise ParamError(f"notebook parameters: {e}") from None
    return cfg


def to_dict(config: Any) -> dict[str, Any]:
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


def resolve_params(section, profile: str, extra_files: list[str], overrides: list[str], for_run: bool = False):
    """Merges the layered files, extra files and KEY=VALUE overrides; returns (config, values, files).

    ``for_run``: the caller is about to run the section, so the machine is checked as well
    (``check_runnable``: ``DEVICE=cuda`` needs a CUDA device unless no engine starts).
    """
    layers = param_files(section.KEY, profile, section.USES_ENGINE)
    if any(not str(f).strip() for f in extra_files):  # Path('') is '.', which read as 'is a directory'
        raise ParamError("--params '': empty; name a YAML file of KEY: value lines")
    files = layers + [Path(f) for f in extra_files]
    values = merge_files(layers)
    names = fields_of(section.Params)
    for path in files[len(layers):]:
        extra = read_yaml(path)
        check_reserved(extra, str(path))
        if any(k not in names for k in extra):  # named with the file it is in
            build(section.Params, {k: v for k, v in extra.items() if k not in names}, where=str(path),
                  quote_unknown=False)
        values.update(extra)
    values.update(parse_overrides(overrides))
    values["PROFILE"] = profile
    where = f"{section.KEY} --profile {profile}"
    config = build(section.Params, values, where=where)
    if for_run:
        try:
            config.check_runnable()
        except ParamError as e:
            raise ParamError(f"{where}: {e}") from None
    return config, values, files


# -- errors --

class _ShortRepr(reprlib.Repr):
    """reprlib, two levels deep, and never longer than 80 characters in all."""

    def repr(self, x: Any) -> str:
        text = super().repr(x)
        return text if len(text) <= 80 else text[:77] + "..."


_short = _ShortRepr()
_short.maxstring, _short.maxother, _short.maxlist, _short.maxdict, _short.maxlevel = 60, 60, 8, 4, 2

_ALLOWED = {
    "int_type": "expected an integer", "int_parsing": "expected an integer", "int_from_float": "expected an integer",
    "float_type": "expected a number", "float_parsing": "expected a number",
    "finite_number": "expected a finite number",
    "bool_type": "expected true or false", "bool_parsing": "expected true or false",
    "string_type": "expected a string", "list_type": "expected a list",
    "greater_than": "must be > {gt}", "greater_than_equal": "must be >= {ge}",
    "less_than": "must be < {lt}", "less_than_equal": "must be <= {le}",
    "too_short": "needs at least {min_length} item(s)", "too_long": "takes at most {max_length} items",
    "string_too_long": "must be at most {max_length} characters",
    "string_pattern_mismatch": "must not contain a NUL character",
    "unexpected_keyword_argument": "unknown parameter", "missing_argument": "missing",
}


def _one(error: dict) -> str:
    ctx = error.get("ctx") or {}
    if error["type"] == "value_error" and isinstance(ctx.get("error"), ParamError):
        return str(ctx["error"])  # a check_rules message names its keys itself
    loc = error["loc"]
    if not loc:  # another error raised by a rule across fields
        return error["msg"]
    key = (str(loc[0]) + "".join(f"[{i}]" for i in loc[1:] if isinstance(i, int))) if loc else "parameters"
    if error["type"] == "literal_error":
        allowed = "expected one of " + ctx["expected"].replace(" or ", ", ")
    elif error["type"] in _ALLOWED:  # bounds print as written: "> 0", not "> 0.0"
        allowed = _ALLOWED[error["type"]].format(**{k: int(v) if isinstance(v, float) and v.is_integer() else v
                                                    for k, v in ctx.items()})
    else:
        allowed = error["msg"]
    given = "(empty)" if error["input"] is None else _short.repr(error["input"])  # `--set KEY=` reads as YAML null
    return f"{key}={given}: {allowed}"


def describe(error: ValidationError) -> str:
    """pydantic's errors as one line: ``KEY=value: what is allowed``, joined by ``; ``."""
    return "; ".join(dict.fromkeys(_one(e) for e in error.errors()))


# -- notebooks --

def py_literal(value: Any) -> str:
    """``value`` as Python source, in the notebooks' style (double-quoted strings)."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(py_literal(v) for v in value) + "]"
    return repr(value)


def parameters_cell(config: Any, header: str) -> str:
    """A notebook's ``parameters`` cell for ``config``: one ``NAME = value  # description`` per field.

    Raises:
        ValueError: a description holds "=": papermill reads a line with more than one "=" as no parameter ("Unable
            to parse line", then "Passed unknown parameter" for every run that sets it), so the cell names the key.
    """
    fields = fields_of(type(config))
    for name, info in fields.items():
        if "=" in (info.description or ""):
            raise ValueError(f"{name}: its description holds '=', which papermill cannot parse in a parameters cell")
    lines = [header] + [f"{name} = {py_literal(getattr(config, name))}  # {info.description}"
                        for name, info in fields.items()]
    return "\n".join(lines)


# Parameter names before the one-vocabulary change (vLLM's ``max_tokens``; ``*_TOKENS`` for every
# token count). Run folders recorded before it are read through this table.
RENAMED = {"OUTPUT_TOKENS": "MAX_TOKENS", "PREFIX_LEN": "CONTEXT_TOKENS", "SUFFIX_LEN": "SUFFIX_TOKENS",
           "CONTEXT_LENS": "CONTEXT_TOKENS_GRID", "FOLLOWUP_NEW_TOKENS": "SUFFIX_TOKENS",
           "FOLLOWUPS": "NUM_FOLLOWUPS", "PARENT_LEN": "PARENT_TOKENS", "NOISE_LEN": "NOISE_TOKENS",
           "CHILD_TAIL_LEN": "CHILD_SUFFIX_TOKENS"}


# Values renamed since (issue 41: the arm whose context is already in vLLM's KV is ``resident`` in every section;
# "floor" names a physical transfer floor only). Keyed by the parameter, as it is named now: section 16's
# CONTROL_ARMS and section 21's ARMS said "floor", section 20's CONTROLS said "engine". A recorded run is read
# through this table (``current_names``); user input naming an old value is refused (``build``), naming the key.
FLOOR_NOW_RESIDENT = {"floor": "resident"}  # sections 16 and 21's captures and params
ENGINE_NOW_RESIDENT = {"engine": "resident"}  # section 20's
RENAMED_VALUES = {"CONTROL_ARMS": FLOOR_NOW_RESIDENT, "ARMS": FLOOR_NOW_RESIDENT, "CONTROLS": ENGINE_NOW_RESIDENT}


def _renamed_value(key: str, value: Any) -> Any:
    """``value`` of ``key`` with each entry renamed since under its current name (a list entry by entry)."""
    renamed = RENAMED_VALUES.get(key, {})
    if isinstance(value, list):
        return [renamed.get(v, v) if isinstance(v, str) else v for v in value]
    return renamed.get(value, value) if isinstance(value, str) else value


def current_names(values: dict[str, Any]) -> dict[str, Any]:
    """A recorded ``params.resolved.yaml``'s ``values`` with every pre-rename key (``RENAMED``) and value
    (``RENAMED_VALUES``) under its current name. Only what a run recorded is read so; never user input."""
    out = {RENAMED.get(k, k): v for k, v in values.items()}
    return {k: _renamed_value(k, v) if k in RENAMED_VALUES else v for k, v in out.items()}


def renamed_value_error(values: dict[str, Any]) -> str | None:
    """The first value of ``values`` (user input) that names what is renamed since: ``KEY: 'old' is now 'new'``."""
    for key, renamed in RENAMED_VALUES.items():
        value = values.get(key)
        for entry in (value if isinstance(value, list) else [value]):
            if isinstance(entry, str) and entry in renamed:
                return (f"{key}: {entry!r} is now {renamed[entry]!r} (one name in every section for the arm whose "
                        "context is already in vLLM's KV)")
    return None
