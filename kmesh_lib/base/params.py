"""Layered YAML parameters, validated into typed configs before any engine starts.

A section's parameters come from up to four files in ``params/``, later files winning:

    common.yaml -> <section>.yaml -> engine.<profile>.yaml -> <section>.<profile>.yaml
                                     (engine sections only)

The merged mapping must name only fields of the section's config dataclass; an unknown key, a
value of the wrong type or a value the field's check rejects raises ``ParamError`` with the key
and what is allowed. papermill only warns about unknown parameters, so notebooks validate their
own namespace again with ``from_namespace``.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from kmesh_lib.base.paths import PARAMS_DIR

PROFILES = ("smoke", "cpu", "gpu")


class ParamError(ValueError):
    """A parameter is unknown, mistyped or out of range. The message names the key."""


def param_files(section: str, profile: str, uses_engine: bool, params_dir: Path = PARAMS_DIR) -> list[Path]:
    if profile not in PROFILES:
        raise ParamError(f"profile {profile!r} is not one of {', '.join(PROFILES)}")
    names = ["common.yaml", f"{section}.yaml"]
    if uses_engine:
        names.append(f"engine.{profile}.yaml")
    names.append(f"{section}.{profile}.yaml")
    return [params_dir / n for n in names if (params_dir / n).exists()]


def read_yaml(path: Path) -> dict[str, Any]:
    with open(path) as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict):
        raise ParamError(f"{path}: expected a mapping of KEY: value, got {type(data).__name__}")
    return data


def merge_files(paths: list[Path]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for path in paths:
        merged.update(read_yaml(path))
    return merged


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Returns ``value`` checked against the annotation ``tp``; ints are accepted for floats."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(key, value, arg)
            except ParamError as e:
                errors.append(str(e))
        raise ParamError(f"{key}={value!r}: expected {' or '.join(_type_name(a) for a in args)}")
    if origin is Literal:
        if value not in args:
            raise ParamError(f"{key}={value!r}: expected {_type_name(tp)}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ParamError(f"{key}={value!r}: expected a list of {_type_name(args[0])}")
        return [_coerce(f"{key}[{i}]", v, args[0]) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ParamError(f"{key}={value!r}: expected a mapping")
        return dict(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ParamError(f"{key}={value!r}: expected true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ParamError(f"{key}={value!r}: expected an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ParamError(f"{key}={value!r}: expected a number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ParamError(f"{key}={value!r}: expected a string")
        return value
    return value


def build(cls: type, values: dict[str, Any], where: str = "") -> Any:
    """Builds ``cls`` (a dataclass with UPPER_CASE fields) from ``values``.

    Raises:
        ParamError: for an unknown key, a missing required key, a mistyped value, or a value
            rejected by ``cls.__post_init__`` (which raises ParamError itself).
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(values) - set(fields))
    prefix = f"{where}: " if where else ""
    if unknown:
        raise ParamError(
            f"{prefix}unknown parameter {unknown[0]!r}"
            + (f" (and {', '.join(unknown[1:])})" if len(unknown) > 1 else "")
            + f" for {cls.__name__}; allowed: {', '.join(sorted(fields))}"
        )
    kwargs = {}
    for name, f in fields.items():
        if name in values:
            kwargs[name] = _coerce(name, values[name], hints[name])
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ParamError(f"{prefix}missing parameter {name!r} ({_type_name(hints[name])}) for {cls.__name__}")
    try:
        return cls(**kwargs)
    except ParamError as e:
        raise ParamError(f"{prefix}{e}") from None


def from_namespace(cls: type, namespace: dict[str, Any]) -> Any:
    """Builds ``cls`` from a notebook's globals: every UPPER_CASE name is a parameter.

    Any UPPER_CASE global that is not a field (a misspelt key papermill injected) is an error.
    """
    values = {k: v for k, v in namespace.items() if k.isupper() and not k.startswith("_")}
    return build(cls, values, where="notebook parameters")


def to_dict(config: Any) -> dict[str, Any]:
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


# Parameter names before the one-vocabulary change (vLLM's ``max_tokens``; ``*_TOKENS`` for every
# token count). Run folders recorded before it are read through this table.
RENAMED = {"OUTPUT_TOKENS": "MAX_TOKENS", "PREFIX_LEN": "CONTEXT_TOKENS", "SUFFIX_LEN": "SUFFIX_TOKENS",
           "CONTEXT_LENS": "CONTEXT_TOKENS_GRID", "FOLLOWUP_NEW_TOKENS": "SUFFIX_TOKENS",
           "FOLLOWUPS": "NUM_FOLLOWUPS", "PARENT_LEN": "PARENT_TOKENS", "NOISE_LEN": "NOISE_TOKENS",
           "CHILD_TAIL_LEN": "CHILD_SUFFIX_TOKENS"}


def current_names(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with every pre-rename key under its current name."""
    return {RENAMED.get(k, k): v for k, v in values.items()}


def check(condition: bool, message: str) -> None:
    """``__post_init__`` helper: raises ParamError(message) unless ``condition``."""
    if not condition:
        raise ParamError(message)


@dataclass(frozen=True)
class RunParams:
    """Parameters every section has: where the run writes, and the base seed."""

    RUN_DIR: str | None = None  # set by `kmesh run`; None writes nothing
    SEED: int = 0
    PROFILE: str = "cpu"

    def __post_init__(self) -> None:
        check(self.SEED >= 0, f"SEED={self.SEED}: must be >= 0")


def resolve_params(section, profile: str, extra_files: list[str], overrides: list[str]):
    """Merges the layered files, extra files and KEY=VALUE overrides; returns (config, dict)."""
    files = param_files(section.KEY, profile, section.USES_ENGINE) + [Path(f) for f in extra_files]
    values = merge_files(files)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ParamError(f"--set {item!r}: expected KEY=VALUE")
        values[key] = yaml.safe_load(raw)
    values["PROFILE"] = profile
    config = build(section.Params, values, where=f"{section.KEY} --profile {profile}")
    return config, values, files
