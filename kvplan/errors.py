"""One exception type for input a user can fix.

The CLI edge turns it into exit code 2 and a single line on stderr; nothing else
in kvplan prints tracebacks at users.
"""


class KvplanError(Exception):
    """Bad input or an environment problem the user can act on (exit code 2)."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message
