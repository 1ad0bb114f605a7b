"""Presentation at the ground floor: what turns a value from a user's file or a server into text a terminal, a CSV
cell or a rich console line shows safely. Imported by cli/, bench/ and gate/ alike (none of them imports another's
presentation)."""

from __future__ import annotations

import csv
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# C0 controls but tab, DEL, C1 controls (ESC starts terminal sequences, OSC-8 links, cursor moves).
_CONTROL_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def printable(text: object, limit: int = 2000) -> str:
    """``text`` safe for one terminal line: control characters (newlines, ESC) shown as escapes,
    at most ``limit`` characters."""
    out = _CONTROL_RE.sub(lambda m: repr(m.group())[1:-1], str(text))
    return out if len(out) <= limit else out[: limit - 3] + "..."


def csv_cell(value: Any) -> Any:
    """A CSV cell no spreadsheet runs as a formula and no terminal takes for control text: names, reasons
    and errors come from users' files and servers. Control characters (CR, LF, ESC) become escapes; text
    whose first character past blanks would start a formula (= + - @, or a leading tab) gets a quote
    mark, unless it is a plain number (``-1.5``)."""
    if not isinstance(value, str):
        return value
    text = _CONTROL_RE.sub(lambda m: repr(m.group())[1:-1], value)
    if text[:1] == "\t" or text.lstrip(" ")[:1] in ("=", "+", "-", "@"):
        try:
            float(text)
        except ValueError:
            return "'" + text
    return text


def csv_writer(stream):
    """``csv.writer`` whose every cell goes through ``csv_cell`` (kvplan's one CSV dialect)."""
    writer = csv.writer(stream, lineterminator="\n")

    class _Writer:
        def writerow(self, row) -> None:
            writer.writerow([csv_cell(v) for v in row])

    return _Writer()


def esc(text: object) -> str:
    """A value for a rich console line that holds markup: ``[/]`` in a name is printed, not
    interpreted; control characters are escaped."""
    from rich.markup import escape  # rich is loaded only by the commands that print with it

    return escape(printable(text))


def make_console(stderr: bool = False):
    """A rich console that does not wrap at 80 columns when output goes to a file or CI log. No emoji
    codes: a ``:smile:`` in a model name or path is text, and replacing codes costs start-up time."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else int(os.environ.get("COLUMNS") or 160)
    return Console(highlight=False, emoji=False, width=width, stderr=stderr)


@dataclass(frozen=True)
class Column:
    """One column of a table a command prints in several formats (kvplan.cli.tables.emit_rows)."""

    key: str  # the record's field (CSV header, JSON key)
    header: str  # what a person reads (table, Markdown)
    cell: Callable[[Any], str] = str
    right: bool = True
    whole: bool | None = None  # never split a cell across lines (an id, a figure); None: right-aligned ones

    @property
    def keeps_cells_whole(self) -> bool:
        return self.right if self.whole is None else self.whole


def fitted_table(columns: Sequence[Column], cells: Sequence[Sequence[Any]], width: int, **table_options: Any):
    """A rich table of ``cells`` (plain strings, or rich ``Text`` for a styled cell) that fits ``width``: text
    columns wrap at their words, ids and figures (``Column.keeps_cells_whole``) stay whole on one line; when even
    that does not fit, the last columns are left out. Returns the table and the columns left out."""
    from rich.table import Table
    from rich.text import Text

    def plain(value: Any) -> str:
        return value.plain if isinstance(value, Text) else str(value)

    widths = [max(map(len, [plain(row[i]) for row in cells] + [c.header])) if c.keeps_cells_whole  # header too
              else max(map(len, c.header.split() or [""])) for i, c in enumerate(columns)]
    shown = len(columns)
    while shown > 1 and sum(w + 3 for w in widths[:shown]) - 1 > width:  # each cell padded by 1, then a rule
        shown -= 1
    table = Table(show_edge=False, **table_options)
    for c, w in zip(columns[:shown], widths):
        table.add_column(c.header, justify="right" if c.right else "left", overflow="fold",
                         no_wrap=c.keeps_cells_whole, min_width=w)
    for row in cells:
        table.add_row(*(v if isinstance(v, Text) else esc(v) for v in row[:shown]))
    return table, list(columns[shown:])


def left_out_note(left_out: Sequence[Column], width: int) -> str | None:
    if not left_out:
        return None
    return (f"Left out at {width} columns: {', '.join(c.header for c in left_out)} (a wider terminal, or --format "
            "csv / json, shows them).")
