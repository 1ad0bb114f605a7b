"""Offline: read finished runs (kvplan's own, `vllm bench serve` results or GuideLLM reports) and write their reports
again. Never starts an engine nor opens a connection."""

from __future__ import annotations

from pathlib import Path

from kvplan.bench import store as st
from kvplan.bench.external import YAML_SUFFIXES, read_external
from kvplan.bench.outputs import write_reports
from kvplan.bench.results import BenchSummary
from kvplan.errors import KvplanError
from kvplan.paths import MAX_RUN_NUMBER, load_user_json


def finished_run(path: Path) -> bool:
    """Is ``path`` a kvplan run whose summary says complete (nothing left for --resume to measure)?"""
    try:
        summary = load_summary(path)
    except KvplanError:
        return False
    return summary.status == "complete" and summary.source == "kvplan"


def load_summary(path: Path) -> BenchSummary:
    """A kvplan run folder (summary.json), a `vllm bench serve` result / folder of results, or a GuideLLM
    report (JSON or YAML; kvplan.bench.external)."""

    if path.is_dir() and (path / st.SUMMARY_FILE).is_file():
        data = load_user_json(path / st.SUMMARY_FILE, max_number=MAX_RUN_NUMBER)
        if not isinstance(data, dict):
            raise KvplanError(f"{path / st.SUMMARY_FILE}: expected a JSON object")
        try:
            summary = BenchSummary.model_validate(data)
        except Exception as exc:  # noqa: BLE001 - pydantic's message, first line
            raise KvplanError(f"{path / st.SUMMARY_FILE}: not a kvplan bench summary "
                              f"({str(exc).splitlines()[0][:200]})") from None
        return summary.model_copy(update={"run_dir": str(path)})
    if not path.is_dir() and path.suffix.lower() in (".json", *YAML_SUFFIXES):
        return read_external(path)  # whatever the path is: a FIFO or device gets its one error there
    if path.is_dir():
        if (path / st.RUN_FILE).is_file():
            raise KvplanError(f"{path}: the run has no summary.json yet (no point finished, or it is still running)",
                              "continue it with kvplan bench --resume")
        return read_external(path)
    raise KvplanError(f"{path}: no such run folder or file")


def rerender(path: Path) -> BenchSummary:
    """Write a finished kvplan run's report.md, report.html, points.csv and requests.csv again."""

    summary = load_summary(path)
    write_reports(st.RunStore(path), summary)
    return summary
