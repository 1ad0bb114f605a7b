"""summary.json: the typed BenchSummary itself, which ``kvplan report``, ``kvplan check`` and ``--resume`` read back."""

from __future__ import annotations

from kvplan.bench.outputs.registry import output
from kvplan.bench.results import BenchSummary
from kvplan.bench.store import SUMMARY_FILE, RunStore


@output("summary-json", SUMMARY_FILE, order=0)  # first: what is read back
def write_summary(summary: BenchSummary, store: RunStore) -> str:
    return summary.model_dump_json(indent=2) + "\n"
