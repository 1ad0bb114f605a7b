"""What every command shares: the error edge, JSON output, and the model/GPU resolution."""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from kvplan.errors import KvplanError

F = TypeVar("F", bound=Callable[..., Any])


def error_line(message: str) -> None:
    """One line on stderr, in red when it is a terminal."""
    if sys.stderr.isatty():
        sys.stderr.write(f"\x1b[31merror:\x1b[0m {message}\n")
    else:
        sys.stderr.write(f"error: {message}\n")


def user_errors(func: F) -> F:
    """Turn KvplanError into exit code 2 and one line; Ctrl-C into exit 130 without a trace."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        import typer

        try:
            return func(*args, **kwargs)
        except KvplanError as exc:
            error_line(str(exc))
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            error_line("interrupted")
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def to_jsonable(payload: Any) -> Any:
    """Pydantic models, the planner's dataclasses (through pydantic's TypeAdapter), or plain data."""
    if hasattr(payload, "model_dump"):
        return payload.model_dump(mode="json")
    if dataclasses.is_dataclass(payload) and not isinstance(payload, type):
        from pydantic import TypeAdapter

        return TypeAdapter(type(payload)).dump_python(payload, mode="json")
    return payload


def make_console(stderr: bool = False):
    """A rich console that does not wrap at 80 columns when output goes to a file or CI log."""
    import os

    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else int(os.environ.get("COLUMNS") or 160)
    return Console(highlight=False, width=width, stderr=stderr)


def print_json(payload: Any) -> None:
    """Exactly one JSON document on stdout."""
    sys.stdout.write(json.dumps(to_jsonable(payload), indent=2, default=str) + "\n")


def parse_overrides(pairs: list[str] | None) -> dict[str, Any]:
    """``--set num_key_value_heads=8`` -> {"num_key_value_heads": 8} (JSON values, else strings)."""
    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise KvplanError(f"invalid --set {pair!r}", "use --set field=value, e.g. --set head_dim=128")
        try:
            out[key.strip()] = json.loads(raw)
        except ValueError:
            out[key.strip()] = raw
    return out
