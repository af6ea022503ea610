"""Numbers as a person reads them: three significant digits and a unit (tokens 1.23M, 12.3 ms, 4.50 GiB, 12.3%)."""

from __future__ import annotations

import math

DASH = "–"  # a missing value (None or NaN)

_TOKEN_SCALES = ((1e9, "B"), (1e6, "M"), (1e3, "k"), (1.0, ""))
_BYTE_SCALES = ((2**40, " TiB"), (2**30, " GiB"), (2**20, " MiB"), (2**10, " KiB"))
_SECOND_SCALES = ((1.0, " s"), (1e-3, " ms"), (1e-6, " µs"))


def _missing(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def sig3(x: float) -> str:
    """Three significant digits, no exponent: 1.23, 12.3, 123, 1,235 (integers past 999 keep every digit)."""
    if x == 0:
        return "0"
    if abs(x) >= 999.5:
        return f"{x:,.0f}"
    decimals = max(0, 2 - math.floor(math.log10(abs(x))))
    if abs(round(x, decimals)) >= 10 ** (3 - decimals):  # 9.996 rounds up to 10.0, not 10.00
        decimals = max(decimals - 1, 0)
    return f"{x:.{decimals}f}"


def _scaled(x: float, scales) -> str:
    """The largest unit in which ``x`` reads as at least 1.00; the smallest unit below that."""
    for scale, unit in scales:
        if abs(x) >= scale * 0.9995:
            return sig3(x / scale) + unit
    scale, unit = scales[-1]
    return sig3(x / scale) + unit


def tokens(n) -> str:
    """Token (or any large) counts: 950, 12.3k, 1.23M."""
    if _missing(n):
        return DASH
    if abs(n) < 999.5:
        return f"{n:,.0f}" if float(n).is_integer() else sig3(n)
    return _scaled(float(n), _TOKEN_SCALES)


def nbytes(n) -> str:
    """Binary units, as SGLang logs them: 512 B, 36.0 KiB, 4.50 GiB."""
    if _missing(n):
        return DASH
    if abs(n) < 1024:
        return f"{n:,.0f} B"
    return _scaled(float(n), _BYTE_SCALES)


def seconds(s) -> str:
    """Durations: 850 µs, 12.3 ms, 1.23 s, 3,725 s."""
    if _missing(s):
        return DASH
    if s == 0:
        return "0 s"
    return _scaled(float(s), _SECOND_SCALES)


def percent(frac) -> str:
    """A fraction as a percentage with one decimal: 0.1234 -> 12.3%; never a rounded 0 or 100 for a value that is
    not: 0.0004 -> <0.1%, 0.9996 -> >99.9%."""
    if _missing(frac):
        return DASH
    if 0 < frac < 0.0005:
        return "<0.1%"
    if 0.9995 <= frac < 1:
        return ">99.9%"
    return f"{100 * frac:.1f}%"


def count(n) -> str:
    """An exact count with thousands separators: 12,345."""
    if _missing(n):
        return DASH
    return f"{n:,.0f}"


def rate(x, unit: str) -> str:
    """A rate: 1.23k tok/s."""
    if _missing(x):
        return DASH
    return f"{tokens(x)} {unit}"


def count_or_mean(n) -> str:
    """A count (12,345) or an average of counts (1.09)."""
    if _missing(n):
        return DASH
    return count(n) if float(n).is_integer() else sig3(n)


FORMATTERS = {"tokens": tokens, "bytes": nbytes, "s": seconds, "fraction": percent, "count": count_or_mean}


def by_unit(value, unit: str) -> str:
    """Format ``value`` by the unit its definition in METRICS.md gives (``tok/s`` style rates included)."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return value
    if unit in FORMATTERS:
        return FORMATTERS[unit](value)
    if unit.endswith("/s"):
        return rate(value, unit)
    return DASH if _missing(value) else (count(value) if float(value).is_integer() else sig3(value)) + (
        f" {unit}" if unit and unit not in ("", "-") else "")
