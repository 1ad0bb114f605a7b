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

import json
import os
import re
import time
from pathlib import Path
from typing import Any

from kvplan.errors import KvplanError

RUN_FILE = "run.json"
POINTS_FILE = "points.jsonl"
REQUESTS_FILE = "requests.jsonl"
ENGINE_LOG = "engine.log"
SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.md"
PLOT_FILE = "plot.png"


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text.strip("/")).strip("-")[-60:] or "model"


def new_run_dir(parent: Path, model: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = parent / f"{stamp}-{slug(model)}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = Path(f"{base}-{n}")
    path.mkdir(parents=True)
    return path


class RunStore:
    """Append-only files of one run folder."""

    def __init__(self, path: Path):
        self.path = path

    @classmethod
    def open_existing(cls, path: Path) -> RunStore:
        if not (path / RUN_FILE).is_file():
            raise KvplanError(f"{path} is not a kvplan bench run folder (no {RUN_FILE})", "pass a folder made by kvplan bench")
        return cls(path)

    @property
    def engine_log(self) -> Path:
        return self.path / ENGINE_LOG

    def write_run(self, data: dict[str, Any]) -> None:
        _atomic_write(self.path / RUN_FILE, json.dumps(data, indent=2, default=str) + "\n")

    def read_run(self) -> dict[str, Any]:
        try:
            return json.loads((self.path / RUN_FILE).read_text())
        except (OSError, ValueError) as exc:
            raise KvplanError(f"cannot read {self.path / RUN_FILE}: {exc}") from None

    def append_point(self, point: dict[str, Any]) -> None:
        _append(self.path / POINTS_FILE, [point])

    def append_requests(self, rows: list[dict[str, Any]]) -> None:
        _append(self.path / REQUESTS_FILE, rows)

    def read_points(self) -> list[dict[str, Any]]:
        """Every complete line of points.jsonl (a torn last line is skipped)."""
        return _read_jsonl(self.path / POINTS_FILE)

    def read_requests(self) -> list[dict[str, Any]]:
        return _read_jsonl(self.path / REQUESTS_FILE)

    def write_text(self, name: str, text: str) -> Path:
        target = self.path / name
        _atomic_write(target, text)
        return target


def _append(path: Path, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    data = "".join(json.dumps(row, default=str, separators=(",", ":")) + "\n" for row in rows)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line torn by a crash
    return out


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
