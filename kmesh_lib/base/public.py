"""What may leave a run folder: the guard against private content in published files."""
from __future__ import annotations

PRIVATE_KEY_PARTS = ("token_ids", "prompt_text", "answer", "completion_text", "output_text")


def find_private_keys(value, path: str = "") -> list[str]:
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
