"""What may leave a run folder: the guard on every published value.

``public-results.json`` is built by allow-list (``app.publish``): each field is chosen by name,
and whatever a section returns from ``public_results(run)`` passes ``validate_public`` first. The
validator does not try to recognise secrets; it bounds the shapes a secret or a token sequence
would need to get out:

- only dict, list, str, int, float (finite), bool and None;
- keys from a small charset, at most ``MAX_KEY_CHARS`` long (a key may be input text in disguise:
  a 900-character field name carried a secret once);
- strings at most ``MAX_STRING_CHARS`` long, and not a run of numbers (token ids written as text);
- no list of more than ``MAX_INT_LIST`` integers, or floats with integer values (token ids);
- at most ``MAX_DEPTH`` levels of nesting and ``MAX_PUBLIC_BYTES`` in all.

A value that breaks a rule is rejected with its path (``PublicContentError``), never trimmed:
publishing stops, and the section's allow-list is what gets fixed.
"""
from __future__ import annotations

import hashlib
import json
import math
import re

PRIVATE_KEY_PARTS = ("token_ids", "prompt_text", "answer", "completion_text", "output_text")

# A key is a section's own label ("mp N=4", "A first token 95% CI ms"), never text from input data;
# the pattern keeps anything long or odd out even if a section slipped.
LABEL_PATTERN = re.compile(r"^[A-Za-z0-9 _.:+=\-(),/%'<>\[\]]{1,96}$")
MAX_VERDICT_CHARS = 600  # a verdict sentence names a figure and its interval; longer is a paragraph
KEY_PATTERN = LABEL_PATTERN
MAX_KEY_CHARS = 96
MAX_STRING_CHARS = 240  # check names and formatted figures; a prompt or output is far longer
MAX_INT_LIST = 32
MAX_DEPTH = 8
MAX_PUBLIC_BYTES = 512 * 1024
NUMBER_RUN = re.compile(r"(?:-?\d+[\s,;]+){16,}")


# Credentials by their issuers' published formats: the one list kmesh recognises secrets by. A
# name or text that holds one is published as ``#`` + 12 hex digits of its SHA-256 (the form
# ``traces.names.safe_name`` gives a name it does not keep), never as itself.
CREDENTIAL_PATTERNS = (
    r"gh[pousr]_[A-Za-z0-9]{8,}",  # GitHub tokens
    r"github_pat_[A-Za-z0-9_]{8,}",
    r"(?:AKIA|ASIA)[0-9A-Z]{4,}",  # AWS access key ids
    r"sk-(?:ant-|proj-|live-|test-)?[A-Za-z0-9_\-]{8,}",  # Anthropic, OpenAI, Stripe secret keys
    r"xox[abposr]-[A-Za-z0-9\-]{8,}",  # Slack
    r"AIza[0-9A-Za-z_\-]{8,}",  # Google API keys
    r"glpat-[A-Za-z0-9_\-]{8,}",  # GitLab
    r"hf_[A-Za-z0-9]{8,}",  # Hugging Face
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----",
)
CREDENTIAL = re.compile(r"(?<![A-Za-z0-9])(?:" + "|".join(CREDENTIAL_PATTERNS) + ")")


def credential_hash(text: str) -> str:
    """The published form of a credential: ``#`` + the first 12 hex digits of its SHA-256."""
    return "#" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def looks_like_credential(text: str) -> bool:
    return CREDENTIAL.search(text) is not None


def redact_credentials(text: str) -> tuple[str, int]:
    """``text`` with every credential-looking token in its hashed form, and how many there were."""
    return CREDENTIAL.subn(lambda m: credential_hash(m.group(0)), text)


class PublicContentError(ValueError):
    """A value may not be published; the message names its path and the rule."""


def validate_public(value, path: str = "results", keys: re.Pattern = KEY_PATTERN, depth: int = 0) -> None:
    """Raises ``PublicContentError`` unless ``value`` is publishable (module docstring)."""
    if depth > MAX_DEPTH:
        raise PublicContentError(f"{path}: nested deeper than {MAX_DEPTH} levels")
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PublicContentError(f"{path}: {value} is not a finite number")
        return
    if isinstance(value, str):
        if len(value) > MAX_STRING_CHARS:
            raise PublicContentError(f"{path}: a string of {len(value)} characters (at most {MAX_STRING_CHARS})")
        if NUMBER_RUN.search(value):
            raise PublicContentError(f"{path}: a string of 16 or more numbers in a row looks like token ids")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str) or not keys.match(key):
                shown = repr(key) if isinstance(key, str) and len(key) <= MAX_KEY_CHARS else (
                    f"of {len(key)} characters" if isinstance(key, str) else f"of type {type(key).__name__}")
                raise PublicContentError(f"{path}: a key {shown} is not a short label of letters, digits, spaces "
                                         f"and _.:+=-(),/%'<>[] (at most {MAX_KEY_CHARS})")
            validate_public(item, f"{path}.{key}", keys, depth + 1)
        return
    if isinstance(value, list):
        num_ints = sum((isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer())
                       for v in value)
        if num_ints > MAX_INT_LIST:
            raise PublicContentError(f"{path}: a list of {num_ints} integers looks like token ids "
                                     f"(at most {MAX_INT_LIST}; publish counts or a hash)")
        for i, item in enumerate(value):
            validate_public(item, f"{path}[{i}]", keys, depth + 1)
        return
    raise PublicContentError(f"{path}: a {type(value).__name__} is not publishable (dict, list, str, number, "
                             "bool or null)")


def validate_size(document: dict) -> int:
    size = len(json.dumps(document, indent=1))
    if size > MAX_PUBLIC_BYTES:
        raise PublicContentError(f"public-results.json would be {size:,} bytes (at most {MAX_PUBLIC_BYTES:,})")
    return size


def find_private_keys(value, path: str = "") -> list[str]:
    """Key paths whose names look like private content (a screen for section code; the published
    file itself is built by allow-list and ``validate_public``)."""
    found = []
    if isinstance(value, dict):
        for k, v in value.items():
            here = f"{path}.{k}" if path else str(k)
            if any(part in str(k).lower() for part in PRIVATE_KEY_PARTS):
                found.append(here)
            found += find_private_keys(v, here)
    elif isinstance(value, list):
        for i, v in enumerate(value[:1000]):
            found += find_private_keys(v, f"{path}[{i}]")
    return found
