"""One exception type for input a user can fix, and the exit codes of every command.

The CLI edge turns KvplanError into exit code 2 and a single line on stderr; anything else
that escapes a command is an internal error (exit 3), also one line, with the traceback only
behind ``kvplan --debug`` (or ``KVPLAN_DEBUG=1``). Nothing in kvplan prints tracebacks at users.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """What a kvplan exit status means: one code one meaning, so CI can tell a verdict from a breakage."""

    OK = 0
    DOES_NOT_FIT = 1  # a verdict: does not fit, a gate failed, or bench --check found a measured onset differ
    BAD_INPUT = 2
    INTERNAL = 3
    RUN_FAILED = 4  # kvplan bench could not finish: the engine died, the server went away, every request failed
    INTERRUPTED = 130


class KvplanError(Exception):
    """Bad input or an environment problem the user can act on (exit code 2)."""

    exit_code = int(ExitCode.BAD_INPUT)

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message
