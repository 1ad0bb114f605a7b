"""Tabular output in the format a reader asks for: a terminal table, JSON, Markdown (for a PR or
a wiki) or CSV (for a spreadsheet). A command builds its rows once, as plain records, and names its
columns; this module renders them. CSV and JSON carry the raw values under their machine names;
the table and Markdown show the formatted cells under their headers."""

from __future__ import annotations

import csv
import sys
from collections.abc import Sequence
from enum import Enum
from typing import Any

import typer

from kvplan.term import Column


class OutputFormat(str, Enum):
    table = "table"
    json = "json"
    markdown = "markdown"
    csv = "csv"


def format_option() -> Any:
    return typer.Option(OutputFormat.table, "--format", help="Output: table, json, markdown or csv.",
                        rich_help_panel="Output")


def chosen_format(fmt: OutputFormat | str, as_json: bool) -> OutputFormat:
    """``--json`` is ``--format json``; asking for JSON and another format at once is an error."""
    from kvplan.errors import KvplanError

    fmt = OutputFormat(fmt)
    if as_json and fmt not in (OutputFormat.table, OutputFormat.json):
        raise KvplanError(f"--json and --format {fmt.value} ask for two formats", "use one of them")
    return OutputFormat.json if as_json else fmt


def emit_rows(rows: Sequence[dict], columns: Sequence[Column], fmt: OutputFormat, footnote: str | None = None) -> None:
    if fmt is OutputFormat.json:
        from kvplan.cli.common import print_json

        print_json(list(rows))
    elif fmt is OutputFormat.csv:
        from kvplan.term import csv_cell

        keys = list(rows[0]) if rows else [c.key for c in columns]
        writer = csv.DictWriter(sys.stdout, fieldnames=keys, lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: csv_cell(v) for k, v in row.items()} for row in rows)
    elif fmt is OutputFormat.markdown:
        sys.stdout.write(markdown_table(rows, columns))
        if footnote:
            sys.stdout.write(f"\n{footnote}\n")
    else:
        from kvplan.term import esc, fitted_table, left_out_note, make_console

        console = make_console()
        cells = [[c.cell(row[c.key]) for c in columns] for row in rows]
        table, left_out = fitted_table(columns, cells, console.width)
        notes = [n for n in (footnote, left_out_note(left_out, console.width)) if n]
        footnote = "\n".join(notes) or None
        console.print(table)
        if footnote:
            console.print(esc(footnote))


def markdown_table(rows: Sequence[dict], columns: Sequence[Column]) -> str:
    def cell(text: str) -> str:  # one line, and a | inside a cell must not end it
        return " ".join(str(text).split()).replace("|", "\\|")

    lines = ["| " + " | ".join(cell(c.header) for c in columns) + " |",
             "|" + "|".join("---:" if c.right else ":---" for c in columns) + "|"]
    lines += ["| " + " | ".join(cell(c.cell(row[c.key])) for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"
