"""What every command shares: the error edge, JSON output, and the model/GPU resolution."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from kvplan.errors import ExitCode, KvplanError
from kvplan.term import printable

F = TypeVar("F", bound=Callable[..., Any])


#: Set by ``kvplan --debug`` or KVPLAN_DEBUG=1: internal errors print their traceback.
DEBUG = False

def debug_from_env() -> bool:
    import os

    return os.environ.get("KVPLAN_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")


def error_line(message: str) -> None:
    """One line on stderr, in red when it is a terminal (the message's control characters,
    newlines included, are escaped: a name cannot add a line or move the cursor)."""
    text = printable(message)
    try:
        if sys.stderr.isatty():
            sys.stderr.write(f"\x1b[31merror:\x1b[0m {text}\n")
        else:
            sys.stderr.write(f"error: {text}\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # stderr closed: nothing more can be said
        pass


def report_error(exc: KvplanError) -> None:
    """A KvplanError on stderr: one line (one per issue for a list of issues); an engine's log
    tail, when it carries one, follows on its own lines."""
    issues = getattr(exc, "issues", None)
    if issues:
        for issue in issues:
            error_line(str(issue))
        return
    tail = getattr(exc, "log_tail", "")
    if tail:
        error_line((exc.message if not exc.hint else f"{exc.message} ({exc.hint})") + "; last log lines:")
        try:
            for line in str(tail).splitlines()[-40:]:
                sys.stderr.write("  " + printable(line, 400) + "\n")
        except (OSError, ValueError):
            pass
        return
    error_line(str(exc))


def report_internal_error(exc: BaseException) -> None:
    """An exception no command turned into a KvplanError: one line (exit 3), the traceback only
    with --debug / KVPLAN_DEBUG=1."""
    kinds = {
        RecursionError: "input nested too deeply",
        MemoryError: "out of memory",
        OverflowError: "a number is too large",
        UnicodeError: "text that is not valid UTF-8",
    }
    what = next((text for kind, text in kinds.items() if isinstance(exc, kind)), None)
    detail = printable(str(exc), 300)
    head = f"internal error: {type(exc).__name__}" + (f" ({what})" if what else "") + (f": {detail}" if detail else "")
    if DEBUG or debug_from_env():
        import traceback

        with contextlib.suppress(OSError, ValueError):
            traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
        error_line(head)
    else:
        error_line(head + " (run with --debug for the traceback; please report it)")


def user_errors(func: F) -> F:
    """Turn KvplanError into exit code 2 and one line; Ctrl-C into exit 130 without a trace."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        import typer

        try:
            return func(*args, **kwargs)
        except KvplanError as exc:
            report_error(exc)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            error_line("interrupted")
            raise typer.Exit(ExitCode.INTERRUPTED) from None

    return wrapper  # type: ignore[return-value]


def to_jsonable(payload: Any) -> Any:
    """Pydantic models, the planner's dataclasses (through pydantic's TypeAdapter), or plain data."""
    if hasattr(payload, "model_dump"):
        return payload.model_dump(mode="json")
    if dataclasses.is_dataclass(payload) and not isinstance(payload, type):
        from pydantic import TypeAdapter

        return TypeAdapter(type(payload)).dump_python(payload, mode="json")
    return payload


def print_json(payload: Any) -> None:
    """Exactly one JSON document on stdout: strict JSON, so a non-finite figure (which JSON cannot
    hold; ``Infinity`` would break every parser but Python's) is written as null."""
    data = to_jsonable(payload)
    try:
        text = json.dumps(data, indent=2, default=str, allow_nan=False)
    except ValueError:
        text = json.dumps(_finite_or_null(data), indent=2, default=str, allow_nan=False)
    sys.stdout.write(text + "\n")


def _finite_or_null(data: Any) -> Any:
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: _finite_or_null(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite_or_null(v) for v in data]
    return data


def parse_overrides(pairs: list[str] | None) -> dict[str, Any]:
    """``--set num_key_value_heads=8`` -> {"num_key_value_heads": 8} (JSON values, else strings)."""
    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise KvplanError(f"invalid --set {pair!r}", "use --set field=value, e.g. --set head_dim=128")
        from kvplan.paths import MAX_DEPTH, json_depth

        if len(raw) > 100_000 or json_depth(raw) > MAX_DEPTH:
            raise KvplanError(f"invalid --set {key.strip()[:60]}=...: the value is too long or nested too deeply")
        try:
            out[key.strip()] = json.loads(raw, parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))
        except ValueError:
            if raw.strip().lstrip("-+").isdigit() or raw.strip() in ("NaN", "Infinity", "-Infinity"):
                raise KvplanError(f"invalid --set {pair[:80]!r}", "use a finite number of at most 4300 digits") from None
            out[key.strip()] = raw
    return out


def require_extra(extra: str, modules: tuple[str, ...]) -> None:
    """Refuse, in one line (exit 2), a command whose optional dependencies are not installed, naming the extra
    that brings them, before the command writes anything."""
    import importlib

    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise KvplanError(f"this command needs kvplan's {extra!r} extra ({', '.join(missing)} not installed)",
                          f"pip install 'kvplan[{extra}]'")
