"""The one place where sizes and token counts are parsed and formatted.

Token counts: ``32k`` = 32,768 (binary k, as every LLM context length is quoted),
``32768``, ``1m`` = 1,048,576. Byte sizes: ``24GiB``, ``24GB`` (decimal, 24e9),
``512MiB``, a plain integer of bytes. Fractions: ``0.9`` or ``90%``. Request rates: ``200`` or
``200/s`` (requests per second).
"""

from __future__ import annotations

import math
import re

from kvplan.errors import KvplanError

KiB = 1024
MiB = 1024**2
GiB = 1024**3

# Bounded digit runs: a 400-digit "number" is refused by the pattern, never turned into inf.
_TOKEN_RE = re.compile(r"^\s*(\d{1,3}(?:,\d{3}){1,5}|\d{1,20}(?:\.\d{1,9})?)\s*([kKmM]?)\s*$", re.ASCII)
MAX_TOKENS = 2**40  # far beyond any context; keeps every product of token counts exact
MAX_BYTES = 2**60  # 1 EiB
MAX_TEXT = 100  # characters of a size or count worth reading
_TOKEN_SCALE = {"": 1, "k": 1024, "m": 1024**2}

_BYTES_RE = re.compile(r"^\s*(\d{1,19}(?:\.\d{1,9})?)\s*([a-zA-Z]{0,3})\s*$", re.ASCII)
_BYTE_SCALE = {
    "": 1,
    "b": 1,
    "kib": KiB,
    "mib": MiB,
    "gib": GiB,
    "tib": 1024**4,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "k": KiB,
    "m": MiB,
    "g": GiB,
    "t": 1024**4,
}


def parse_tokens(text: str | int, what: str = "token count", allow_zero: bool = False) -> int:
    """Parse ``32k``/``32K``/``32768``/``32,768``/``128k`` into a positive token count."""
    if isinstance(text, bool):
        raise KvplanError(f"invalid {what}: {text!r}")
    if isinstance(text, int):
        value = text
    else:
        match = _TOKEN_RE.match(str(text)) if len(str(text)) <= MAX_TEXT else None
        if not match:
            raise KvplanError(
                f"invalid {what}: {_show(text)}", "use a whole number of tokens such as 8192, 32k or 128k"
            )
        number, suffix = match.groups()
        scaled = float(number.replace(",", "")) * _TOKEN_SCALE[suffix.lower()]
        if scaled != int(scaled):
            raise KvplanError(f"invalid {what}: {text!r} is not a whole number of tokens")
        value = int(scaled)
    if value < 0 or (value == 0 and not allow_zero):
        raise KvplanError(f"invalid {what}: {_show(text)} must be greater than 0")
    if value > MAX_TOKENS:
        raise KvplanError(f"invalid {what}: {_show(text)} is too large (at most {MAX_TOKENS:,} tokens)")
    return value


def parse_bytes(text: str | int, what: str = "memory size") -> int:
    """Parse ``24GiB``, ``24GB``, ``512MiB`` or a plain byte count into bytes (> 0)."""
    if isinstance(text, bool):
        raise KvplanError(f"invalid {what}: {text!r}")
    if isinstance(text, int):
        value = text
    else:
        match = _BYTES_RE.match(str(text)) if len(str(text)) <= MAX_TEXT else None
        unit = match.group(2).lower() if match else None
        if not match or unit not in _BYTE_SCALE:
            raise KvplanError(f"invalid {what}: {_show(text)}", "use a size such as 24GiB, 80GB or 512MiB")
        if not unit and float(match.group(1)) < MiB:
            # "24" is far more likely 24 GiB than 24 bytes: make the user say which.
            raise KvplanError(f"invalid {what}: {text!r} has no unit", f"write {match.group(1)}GiB, or a whole byte count")
        value = int(float(match.group(1)) * _BYTE_SCALE[unit])
    if value <= 0:
        raise KvplanError(f"invalid {what}: {_show(text)} must be greater than 0")
    if value > MAX_BYTES:
        raise KvplanError(f"invalid {what}: {_show(text)} is too large (at most 1 EiB)")
    return value


def parse_fraction(text: str | float, what: str = "fraction") -> float:
    """Parse ``0.9`` or ``90%`` into a fraction in (0, 1]."""
    raw = str(text).strip()
    try:
        if len(raw) > MAX_TEXT or isinstance(text, bool):
            raise ValueError
        if not raw.isascii():
            raise ValueError
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise KvplanError(f"invalid {what}: {_show(text)}", "use a number in (0, 1] such as 0.9 or 90%") from None
    if not 0 < value <= 1:  # also refuses nan
        raise KvplanError(f"invalid {what}: {_show(text)} must be in (0, 1]")
    return value


MAX_RATE_PER_S = 1_000_000  # requests per second: above this is a typo


def parse_rate(text: str | float, what: str = "request rate") -> float:
    """Parse ``200``, ``200/s`` or ``2.5`` into requests per second, above 0 and at most MAX_RATE_PER_S."""
    raw = str(text).strip().lower().removesuffix("/s").strip()
    try:
        if len(raw) > MAX_TEXT or isinstance(text, bool) or not raw.isascii():
            raise ValueError
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value <= MAX_RATE_PER_S:  # NaN fails this too
        raise KvplanError(f"invalid {what}: {_show(text)}",
                          f"give requests per second, above 0 and at most {MAX_RATE_PER_S:,}: 200 or 200/s")
    return value


def _show(text: object) -> str:
    """A value for an error message: repr, cut to a readable length."""
    shown = repr(text)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def check_positive(value: float | int | None, what: str, allow_zero: bool = False, maximum: float | None = None):
    """``value`` if it is a finite number > 0 (>= 0 with allow_zero) and <= maximum; else one clear
    KvplanError. NaN fails every comparison, so it is refused here, not passed on as "positive"."""
    import math

    if value is None:
        return value
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
          and (value >= 0 if allow_zero else value > 0) and (maximum is None or value <= maximum))
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        limit = f" and at most {maximum:g}" if maximum is not None else ""
        raise KvplanError(f"invalid {what}: {_show(value)} (use a finite number {bound}{limit})")
    return value


def format_ms(seconds: float | None) -> str:
    """Milliseconds as every table prints them: to the unit from 10 ms up, to a tenth below (a 0.4 ms
    ITL is not "0"); "-" when unknown."""
    if seconds is None:
        return "-"
    ms = seconds * 1000
    return f"{ms:,.0f}" if ms >= 10 else f"{ms:.1f}"


def format_share(share: float | None, *, free: bool) -> str:
    """A share of the KV pool as a whole percentage, one rule for every output: a free share (headroom, margin)
    rounds down and a used share rounds up, so neither claims room a block already takes, and the used and
    free shares of one pool always add up to 100%."""
    if share is None:
        return "-"
    if abs(share) >= 10:
        return ">999%" if share > 0 else "<-999%"
    percent = round(share * 100, 9)  # 0.19 * 100 is 19.000000000000004: not 20% used
    return f"{math.floor(percent) if free else math.ceil(percent)}%"


def format_bytes(num_bytes: float, precision: int = 2) -> str:
    """Binary units, as vLLM prints them: ``14.99 GiB``."""
    sign = "-" if num_bytes < 0 else ""
    value = abs(float(num_bytes))
    for unit, scale in (("TiB", 1024**4), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if value >= scale:
            return f"{sign}{value / scale:.{precision}f} {unit}"
    return f"{sign}{value:.0f} B"


def format_tokens(num_tokens: float) -> str:
    """``131072`` -> ``128k``, ``1048576`` -> ``1m`` (as `parse_tokens` reads them back); others with thousands
    separators."""
    n = int(num_tokens)
    if n >= 1024**2 and n % 1024**2 == 0:
        return f"{n // 1024**2:,}m"
    if n >= 1024 and n % 1024 == 0:
        return f"{n // 1024:,}k"
    return f"{n:,}"


def format_range(low: float, high: float, precision: int = 2) -> str:
    """'2.59-6.06'; '-27.28 to -21.49' when a bound is negative (a dash would read as a sign)."""
    if min(low, high) < 0:
        return f"{low:.{precision}f} to {high:.{precision}f}"
    return f"{low:.{precision}f}-{high:.{precision}f}"


def cdiv(a: int, b: int) -> int:
    """Ceiling division, as vLLM's ``cdiv``."""
    return -(-a // b)
