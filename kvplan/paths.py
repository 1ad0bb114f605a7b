"""Where kvplan's data lives: ``profiles/`` beside the package in a source checkout, and
``kvplan/profiles`` in an installed wheel (pyproject maps one onto the other)."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


CONFIG_DIR_ENV = "KVPLAN_CONFIG_DIR"


def config_dir() -> Path:
    """kvplan's own settings folder: $KVPLAN_CONFIG_DIR, else ~/.config/kvplan."""
    import os

    env = os.environ.get(CONFIG_DIR_ENV, "").strip()
    return Path(env).expanduser() if env else Path.home() / ".config" / "kvplan"


def calibration_file() -> Path:
    """Where `kvplan calibrate` records measured start-ups (kvplan/calibration.py reads it)."""
    return config_dir() / "calibration.json"


def _profiles_dir() -> Path:
    for candidate in (_PACKAGE / "profiles", _PACKAGE.parent / "profiles"):
        if (candidate / "gpus.json").is_file():
            return candidate
    return _PACKAGE.parent / "profiles"


PROFILES_DIR = _profiles_dir()


# --- reading user files safely ------------------------------------------------------------------
# Every file a user (or a log, or a run folder) names goes through these: regular files only (a FIFO,
# /dev/zero or a folder is refused before a byte is read), a size cap, strict UTF-8, and JSON with a
# nesting cap (no RecursionError) and no NaN/Infinity. Errors are KvplanError (exit 2) naming the file.

MiB_ = 1024 * 1024
MAX_FILE_BYTES = 64 * MiB_  # configs, specs, summaries, reports, traces
MAX_LOG_BYTES = 256 * MiB_  # start-up logs (streamed by the log reader)
MAX_DEPTH = 64  # JSON / YAML nesting: real configs and specs need under 10
MAX_LINE_CHARS = 64 * 1024  # one log line: longer lines are cut (vLLM's longest are a few KB)


def _err(message: str, hint: str | None = None):
    from kvplan.errors import KvplanError

    return KvplanError(message, hint)


def open_user_file(path: str | Path, what: str = "", limit: int | None = MAX_FILE_BYTES):
    """Open ``path`` for binary reading if it is a regular file no larger than ``limit`` bytes.

    Opened non-blocking (a FIFO cannot hang the open), then checked with fstat on the open
    descriptor (no race between the check and the read). Symlinks to regular files are fine."""
    import os
    import stat

    name = f"{what} {path}" if what else str(path)
    try:
        fd = os.open(str(path), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise _err(f"cannot read {name}: no such file") from None
    except IsADirectoryError:
        raise _err(f"cannot read {name}: it is a folder, not a file") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise _err(f"cannot read {name}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise _err(f"cannot read {name}: it is a folder, not a file")
        if not stat.S_ISREG(st.st_mode):
            raise _err(f"cannot read {name}: not a regular file (a device, FIFO or socket is never read)")
        if limit is not None and st.st_size > limit:
            raise _err(f"cannot read {name}: too large ({st.st_size:,} bytes; the limit is {limit:,})")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_user_bytes(path: str | Path, what: str = "", limit: int | None = MAX_FILE_BYTES) -> bytes:
    with open_user_file(path, what, limit) as fh:
        try:
            data = fh.read(limit + 1) if limit is not None else fh.read()
        except OSError as exc:
            raise _err(f"cannot read {path}: {exc.strerror or exc}") from None
    if limit is not None and len(data) > limit:  # grew while we read it
        raise _err(f"{path}: too large (over {limit:,} bytes)")
    return data


def decode_utf8(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise _err(f"{where}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})",
                   "save the file as UTF-8") from None


def read_user_text(path: str | Path, what: str = "", limit: int | None = MAX_FILE_BYTES) -> str:
    """A user's text file: regular, at most ``limit`` bytes, UTF-8 (else one clear error)."""
    return decode_utf8(read_user_bytes(path, what, limit), str(path))


_NEST_RE = None


def json_depth(text: str) -> int:
    """The deepest ``[``/``{`` nesting in JSON text, strings skipped; linear time."""
    import re

    global _NEST_RE
    if _NEST_RE is None:
        _NEST_RE = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]')
    depth = deepest = 0
    for m in _NEST_RE.finditer(text):
        tok = m.group()
        if tok in ("[", "{"):
            depth += 1
            deepest = max(deepest, depth)
        elif tok in ("]", "}"):
            depth -= 1
    return deepest


def parse_json_text(text: str, where: str, max_depth: int = MAX_DEPTH, allow_nonfinite: bool = False):
    """JSON text -> data; errors name ``where`` (and the line); no NaN/Infinity; nesting capped."""
    import json

    if json_depth(text) > max_depth:
        raise _err(f"{where}: JSON nested deeper than {max_depth} levels")

    def refuse(name: str):
        raise _err(f"{where}: {name} is not a number kvplan accepts", "use a finite value")

    try:
        return json.loads(text, parse_constant=None if allow_nonfinite else refuse)
    except json.JSONDecodeError as exc:
        raise _err(f"{where}:{exc.lineno}: not valid JSON: {exc.msg} (column {exc.colno})") from None
    except RecursionError:
        raise _err(f"{where}: JSON nested too deeply") from None
    except ValueError as exc:  # e.g. an integer with more than 4300 digits
        raise _err(f"{where}: not valid JSON: {str(exc).splitlines()[0][:200]}") from None


def load_user_json(path: str | Path, what: str = "", limit: int | None = MAX_FILE_BYTES,
                   max_depth: int = MAX_DEPTH, allow_nonfinite: bool = False):
    """Read and parse a user's JSON file safely (see ``open_user_file`` and ``parse_json_text``)."""
    return parse_json_text(read_user_text(path, what, limit), str(path), max_depth, allow_nonfinite)


def iter_user_lines(path: str | Path, what: str = "log", limit: int | None = MAX_LOG_BYTES,
                    max_line: int = MAX_LINE_CHARS):
    """The lines of a (possibly huge) text file, streamed: each cut to ``max_line`` characters,
    undecodable bytes replaced; memory stays bounded whatever the file holds."""
    fh = open_user_file(path, what, limit)
    with fh:
        yield from _bounded_lines(fh, max_line)


def _bounded_lines(fh, max_line: int):
    """Text lines from a binary stream, each at most ``max_line`` characters (the rest of an
    over-long line is skipped without being held in memory)."""
    chunk = max(max_line, 4096)
    while True:
        raw = fh.readline(chunk + 1)
        if not raw:
            return
        if len(raw) > chunk and not raw.endswith(b"\n"):
            # An over-long line: keep its head, skip to its end in bounded reads.
            while True:
                more = fh.readline(chunk)
                if not more or more.endswith(b"\n"):
                    break
        yield raw.decode("utf-8", errors="replace").rstrip("\r\n")[:max_line]
