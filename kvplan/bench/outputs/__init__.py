"""The files a run writes from its summary, one module per format (see registry.py). Importing this package
registers them all, in the order they are written: the summary first (it is what ``kvplan report`` reads back)."""
# ruff: noqa: I001 - the import order is the write order

from kvplan.bench.outputs import summary_json  # noqa: F401 - registers summary.json
from kvplan.bench.outputs import markdown  # noqa: F401 - registers report.md
from kvplan.bench.outputs import csv  # noqa: F401 - registers points.csv and requests.csv
from kvplan.bench.outputs import html  # noqa: F401 - registers report.html
from kvplan.bench.outputs import png  # noqa: F401 - registers plot.png
from kvplan.bench.outputs.registry import OUTPUTS, write_reports

__all__ = ["OUTPUTS", "write_reports"]
