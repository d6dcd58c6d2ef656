"""Names taken from a corpus (field names, file and directory names), in a short safe form.

An audit is published, and a corpus controls its own names: a 900-character field name can carry
a secret, a file name can be text. Every name the audit keeps goes through ``safe_name`` first, so
no output of the audit (raw rows, results, public results, the report) can hold more of a name
than this:

* a name of at most ``max_chars`` characters from ``SAFE_CHARS`` (letters, digits, ``_ . - + = @``)
  is kept as it is: ``session_id``, ``t_submit_ns``, ``gpt-5-mini-task1.jsonl``;
* any other name becomes ``#`` + the first 12 hex digits of its SHA-256 (UTF-8, lone surrogates
  passed through), plus ``.jsonl``/``.ndjson`` when it had that suffix, e.g. ``#3fa2c1d9e0b1``.

A name that looks like a credential (``base.public.CREDENTIAL_PATTERNS``: ``ghp_...``, ``AKIA...``,
``sk-ant-...``) is hashed however short and plain it is.

``#`` is not in ``SAFE_CHARS``, so a hashed form never equals a kept name. A reader who knows a
candidate name can hash it to find it; nobody can read a hashed name back. A secret short and plain
enough to look like a field name, and of no issuer's format, is indistinguishable from one and is kept.
"""
from __future__ import annotations

import hashlib
import re

from kmesh_lib.base.public import looks_like_credential

SAFE_CHARS = re.compile(r"[A-Za-z0-9_.\-+=@]+")
MAX_FIELD_CHARS = 40  # field names: the corpus's are up to 10 (session_id); lineage names up to 20
MAX_PATH_PART_CHARS = 64  # one file or directory name: the corpus's longest is 54
HASHED_PREFIX = "#"
OTHER_FIELDS = "#other"  # where names past a cap are pooled; no kept or hashed name equals it
_KEPT_SUFFIXES = (".jsonl", ".ndjson")


def name_hash(name: str) -> str:
    return hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def safe_name(name: object, max_chars: int = MAX_FIELD_CHARS) -> str:
    """``name`` if it is short and plain, else its hashed form (see the module docstring)."""
    name = name if isinstance(name, str) else str(name)
    if len(name) <= max_chars and SAFE_CHARS.fullmatch(name) and name not in (".", "..") \
            and not looks_like_credential(name):
        return name
    suffix = next((s for s in _KEPT_SUFFIXES if name.lower().endswith(s)), "")
    return HASHED_PREFIX + name_hash(name) + suffix


def safe_relpath(relpath: str) -> str:
    """A relative path with every part in its safe form ("." stays "." for the root)."""
    if relpath == ".":
        return relpath
    return "/".join(safe_name(part, MAX_PATH_PART_CHARS) for part in relpath.split("/"))


def is_safe(name: str, max_chars: int = MAX_FIELD_CHARS) -> bool:
    """True for a name ``safe_name`` would keep, or for a hashed form."""
    if name == OTHER_FIELDS:
        return True
    if name.startswith(HASHED_PREFIX):
        stem = name[1:]
        for suffix in _KEPT_SUFFIXES:
            stem = stem.removesuffix(suffix)
        return re.fullmatch(r"[0-9a-f]{12}", stem) is not None
    return safe_name(name, max_chars) == name
