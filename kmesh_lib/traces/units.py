"""Timestamp units of trace records, inferred from magnitudes (s / ms / us / ns) or ISO strings.

Traces rarely declare their clock. Epoch seconds, milliseconds, microseconds and nanoseconds are
three orders of magnitude apart, so the magnitude of a value names its unit unambiguously for any
date between 1973 and 5138; values outside every band are durations or monotonic clocks and are
reported as "not-epoch" rather than guessed.
"""

from __future__ import annotations

import math
from collections import Counter
from datetime import datetime
from typing import Any

_EPOCH_BANDS = ((1e8, 1e11, "s"), (1e11, 1e14, "ms"), (1e14, 1e17, "us"), (1e17, 1e20, "ns"))
_UNIT_SCALE = {"s": 1, "ms": 1e3, "us": 1e6, "ns": 1e9}
_TIME_NAMES = {"timestamp", "ts", "time", "created", "date", "datetime", "start", "end"}
MAX_TIME_FIELDS = 64  # per source; a corpus may invent endless "*_at" keys
_TIME_SUFFIXES = ("_time", "_at", "_ts", "_ns", "_ms", "_us", "timestamp", "_date")


def is_time_field(name: str) -> bool:
    low = name.lower()
    return low in _TIME_NAMES or low.endswith(_TIME_SUFFIXES) or low.startswith("t_")


def unit_of_number(value: float) -> str:
    """Epoch unit implied by magnitude: 1e8..1e11 is seconds (1973..5138), each further factor
    of 1000 the next unit. Anything else is "not-epoch" (durations, monotonic clocks)."""
    mag = abs(value)
    for low, high, unit in _EPOCH_BANDS:
        if low <= mag < high:
            return unit
    return "not-epoch"


def _declared_unit(name: str) -> str | None:
    low = name.lower()
    for suffix in ("ns", "us", "ms"):
        if low.endswith("_" + suffix):
            return suffix
    return "s" if low.endswith("_s") else None


class _FieldUnits:
    __slots__ = ("units", "num_values", "min", "max", "min_int_zeros", "max_float_decimals", "declared_unit")

    def __init__(self, declared_unit: str | None) -> None:
        self.declared_unit = declared_unit
        self.units: Counter[str] = Counter()
        self.num_values = 0
        self.min = self.max = None
        self.min_int_zeros = 18      # fewest trailing decimal zeros seen on an int value
        self.max_float_decimals = -1  # most fractional digits seen on a float value

    def observe(self, value: Any) -> None:
        if value is None or isinstance(value, bool):
            return
        self.num_values += 1
        if isinstance(value, str):
            value = self._from_string(value.strip())
            if value is None:
                return
        if not isinstance(value, (int, float)):
            self.units["non-scalar"] += 1
            return
        if isinstance(value, float) and not math.isfinite(value):
            self.units["not-epoch"] += 1
            return
        self.units[unit_of_number(value)] += 1
        self.min = value if self.min is None else min(self.min, value)
        self.max = value if self.max is None else max(self.max, value)
        if isinstance(value, int):
            zeros, step = 0, 10
            while zeros < self.min_int_zeros and value % step == 0:
                zeros, step = zeros + 1, step * 10
            self.min_int_zeros = zeros
        else:
            text = repr(value)
            if "e" not in text and "." in text:
                self.max_float_decimals = max(self.max_float_decimals, len(text.split(".")[1]))

    def _from_string(self, text: str) -> float | None:
        if len(text) > 64:  # no timestamp is this long; do not parse text
            self.units["unparsed-string"] += 1
            return None
        try:
            return float(text)
        except ValueError:
            pass
        try:
            datetime.fromisoformat(text.replace("Z", "+00:00"))
            self.units["iso8601"] += 1
        except ValueError:
            self.units["unparsed-string"] += 1
        return None

    def report(self) -> dict[str, Any]:
        unit = self.units.most_common(1)[0][0] if len(self.units) == 1 else (
            "mixed" if self.units else None)
        resolution = None
        if unit in _UNIT_SCALE and self.min is not None:
            steps = []
            if self.max_float_decimals >= 0:
                steps.append(10.0 ** -self.max_float_decimals)
            if self.min_int_zeros < 18 or not steps:
                steps.append(10.0 ** self.min_int_zeros)
            resolution = min(steps) / _UNIT_SCALE[unit]
        return {"unit": unit, "units": dict(self.units), "num_values": self.num_values,
                "min": self.min, "max": self.max, "declared_unit": self.declared_unit,
                "resolution_s": resolution}


class TimestampUnits:
    """Per-source inference of timestamp units from time-like top-level fields.

    A field is time-like by name (``timestamp``, ``*_at``, ``*_ns``, ``t_*``, ...). Numeric values
    (and numeric strings) get an epoch unit from magnitude; other strings are checked for ISO 8601.
    ``resolution_s`` is the coarsest step every value is a multiple of (from trailing zeros of
    ints and fractional digits of floats): a trace stamped to the minute cannot order calls that
    are seconds apart. For float epoch seconds it is bounded by float precision (about 1e-7 s
    today), which says nothing about the clock's real resolution.

    At most ``max_fields`` fields are tracked, under the names the caller gives (the audit gives
    safe names); values of further time-like fields are only counted in ``num_untracked_values``.
    """

    def __init__(self, max_fields: int = MAX_TIME_FIELDS) -> None:
        self.max_fields = max_fields
        self.fields: dict[str, _FieldUnits] = {}
        self.num_untracked_values = 0

    def observe(self, name: str, key: str, value: Any) -> None:
        """One top-level ``key`` (tracked as ``name``) of a record; ignored unless time-like."""
        if not is_time_field(key):
            return
        units = self.fields.get(name)
        if units is None:
            if len(self.fields) >= self.max_fields:
                self.num_untracked_values += 1
                return
            units = self.fields[name] = _FieldUnits(_declared_unit(key))
        units.observe(value)

    def report(self) -> dict[str, Any]:
        fields = {name: f.report() for name, f in sorted(self.fields.items())}
        units = sorted({u for f in fields.values() for u in f["units"]})
        return {"unit": units[0] if len(units) == 1 else ("mixed" if units else None),
                "units": units, "fields": fields, "num_untracked_values": self.num_untracked_values}
