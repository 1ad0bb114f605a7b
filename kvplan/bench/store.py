"""The run folder: everything a run produced, written as it happens.

    RUN/run.json        the configuration, engine command and pid, capacity, prediction
    RUN/points.jsonl    one line per finished (or failed) point, appended when it ends
    RUN/requests.jsonl  one line per request (with its point's concurrency), appended per point
    RUN/engine.log      the engine's stdout and stderr (when kvplan launched it)
    RUN/summary.json    the summary (also what --json prints)
    RUN/report.md       the Markdown report;  RUN/plot.png  the plot

A crash or Ctrl-C keeps every line already appended; ``--resume RUN`` reads them back and only
runs the points still missing (failed points run again).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from kvplan.bench.client import scrub
from kvplan.errors import KvplanError
from kvplan.paths import MAX_RUN_NUMBER, iter_user_lines, load_user_json, parse_json_text, write_file_safely
from kvplan.vllm.startup_log import redact, redact_data

RUN_FILE = "run.json"
POINTS_FILE = "points.jsonl"
REQUESTS_FILE = "requests.jsonl"
ENGINE_LOG = "engine.log"
SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.md"
PLOT_FILE = "plot.png"


LOCK_FILE = ".kvplan.lock"
_held: dict[str, list[int]] = {}  # run folder -> [descriptor, depth] of the locks this process holds


@contextlib.contextmanager
def hold_run_folder(path: Path):
    """Hold ``path`` for this process while a run writes it: an exclusive ``flock`` on its lock file,
    taken without waiting (a second kvplan on the same folder, say two ``--resume`` at once, is refused
    rather than duplicating points) and released by the kernel however this process ends, SIGKILL
    included. Re-entrant within the process (a resume holds it while it reads the folder and runs)."""
    import fcntl

    key = os.path.realpath(path)
    if key in _held:
        _held[key][1] += 1
    else:
        fd = _open_nofollow(Path(path) / LOCK_FILE, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise KvplanError(f"another kvplan is writing the run folder {path}",
                              "let it finish (or stop it), then resume") from None
        _held[key] = [fd, 1]
    try:
        yield
    finally:
        _held[key][1] -= 1
        if not _held[key][1]:
            os.close(_held.pop(key)[0])  # closing the descriptor releases the lock


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text.strip("/")).strip("-")[-60:] or "model"


def new_run_dir(parent: Path, model: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = parent / f"{stamp}-{slug(model)}"
    path, n = base, 1
    try:
        while path.exists():
            n += 1
            path = Path(f"{base}-{n}")
        path.mkdir(parents=True)
    except OSError as exc:  # --out is a file, read-only, or not ours
        raise KvplanError(f"cannot create a run folder in {parent}: {exc.strerror or exc}",
                          "pass --out with a writable folder") from None
    return path


class RunStore:
    """Append-only files of one run folder."""

    def __init__(self, path: Path, secrets: tuple[str, ...] = ()):
        self.path = path
        # Values masked in every file written (API key, --header values, proxy passwords): a server
        # may echo one back in an error message. Held in memory only (kvplan.bench.client.scrub).
        self.secrets = tuple(secrets)

    @classmethod
    def open_existing(cls, path: Path) -> RunStore:
        if not (path / RUN_FILE).is_file():
            raise KvplanError(f"{path} is not a kvplan bench run folder (no {RUN_FILE})", "pass a folder made by kvplan bench")
        return cls(path)

    @property
    def engine_log(self) -> Path:
        return self.path / ENGINE_LOG

    def write_run(self, data: dict[str, Any]) -> None:
        _atomic_write(self.path / RUN_FILE, json.dumps(redact_data(data), indent=2, default=str) + "\n", self.secrets)

    def read_run(self) -> dict[str, Any]:
        data = load_user_json(self.path / RUN_FILE, max_number=MAX_RUN_NUMBER)
        if not isinstance(data, dict):
            raise KvplanError(f"{self.path / RUN_FILE}: expected a JSON object")
        return data

    def append_point(self, point: dict[str, Any]) -> None:
        _append(self.path / POINTS_FILE, [point], self.secrets)

    def append_requests(self, rows: list[dict[str, Any]]) -> None:
        _append(self.path / REQUESTS_FILE, rows, self.secrets)

    def read_points(self) -> list[dict[str, Any]]:
        """Every complete line of points.jsonl (a torn last line is skipped)."""
        return _read_jsonl(self.path / POINTS_FILE)

    def read_requests(self) -> Iterator[dict[str, Any]]:
        """Every complete line of requests.jsonl, one at a time: the file grows with every request of every point,
        so it is streamed, never held whole (a crafted multi-GB file stays within bounded memory)."""
        return _iter_jsonl(self.path / REQUESTS_FILE)

    def write_text(self, name: str, text: str | Iterable[str]) -> Path:
        target = self.path / name
        _atomic_write(target, text, self.secrets)
        return target

    def write_bytes(self, name: str, data: bytes) -> Path:
        """A binary file (a PNG): no secret scrubbing (its text is drawn, not stored), never through a link."""

        target = self.path / name
        write_file_safely(target, data)
        return target


def _append(path: Path, rows: list[dict[str, Any]], secrets: tuple[str, ...] = ()) -> None:
    """Append JSON lines: never through a symlink planted in the run folder; a torn last line (a
    crash mid-write) is repaired first, so the new lines are never glued onto it."""
    if not rows:
        return
    data = "".join(_scrub(json.dumps(redact_data(row), default=str, separators=(",", ":")), secrets) + "\n"
                   for row in rows)
    fd = _open_nofollow(path, os.O_RDWR | os.O_CREAT)
    try:
        with os.fdopen(fd, "r+b") as fh:
            _append_to(fh, data.encode("utf-8"))
    except OSError as exc:  # a full disk, a file size limit, an I/O error: the lines already there are kept
        raise KvplanError(f"cannot write {path}: {exc.strerror or exc}",
                          "free some space, then continue the run with --resume") from None


def _append_to(fh, data: bytes) -> None:
    """Append ``data`` to the open JSONL file ``fh`` (see ``_append``); when the write fails (a full disk)
    the file is cut back to where the new lines began, so no torn line is left behind."""
    end = fh.seek(0, os.SEEK_END)
    if end:
        fh.seek(max(0, end - 65536))
        tail = fh.read()
        if not tail.endswith(b"\n"):
            cut = tail.rfind(b"\n")
            fragment = tail[cut + 1:]
            try:
                json.loads(fragment)
                fh.write(b"\n")  # a whole record without its newline: keep it
            except ValueError:
                if cut < 0 and end > len(tail):
                    fh.write(b"\n")  # a torn line longer than we looked at: end it, readers skip it
                else:
                    fh.truncate(end - len(fragment))  # drop the torn fragment
    start = fh.seek(0, os.SEEK_END)
    try:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    except OSError:
        with contextlib.suppress(OSError):
            fh.truncate(start)
        raise


def _open_nofollow(path: Path, flags: int) -> int:
    try:
        return os.open(path, flags | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as exc:
        if os.path.islink(path):
            raise KvplanError(f"{path} is a symlink: kvplan never writes through a link in a run folder",
                              "remove it, or start a new run") from None
        raise KvplanError(f"cannot write {path}: {exc.strerror or exc}") from None


#: The longest line of a run folder's JSONL that is read back: a request's line holds a time per delivery,
#: ~15 bytes each, so 100,000 output tokens make a 1.5 MB line (the 1 MiB cap before dropped them: their
#: requests were missing from requests.csv, and a finished point was measured again on --resume).
MAX_RUN_LINE_CHARS = 64 * 1024 * 1024


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return list(_iter_jsonl(path))


def _iter_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    if not path.is_file():
        return
    for line in iter_user_lines(path, "", limit=None, max_line=MAX_RUN_LINE_CHARS):
        if not line.strip():
            continue
        try:
            row = parse_json_text(line, str(path), max_number=MAX_RUN_NUMBER)
        except KvplanError:
            continue  # a line torn by a crash, or not kvplan's
        if isinstance(row, dict):
            yield row


def _scrub(text: str, secrets: tuple[str, ...]) -> str:
    if not secrets:
        return text

    # A secret as it stands in JSON (escaped) too: a quote or backslash in it is written escaped.
    return scrub(text, [*secrets, *(json.dumps(s)[1:-1] for s in secrets)])


def _atomic_write(path: Path, text: str | Iterable[str], secrets: tuple[str, ...] = ()) -> None:
    """Write a whole file, its secrets masked, through kvplan's one safe writer (kvplan.paths); an iterable of
    lines is masked and written line by line (a secret never spans two lines of kvplan's files)."""
    if isinstance(text, str):
        write_file_safely(path, _scrub(redact(text), secrets))
    else:
        write_file_safely(path, (_scrub(redact(line), secrets) for line in text))
