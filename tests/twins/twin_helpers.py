"""Runs vLLM once for every twin case of the differential tests (see test_twins.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBE_TIMEOUT_S = 1500


def run_probe(cases: list[dict], folder: Path) -> dict:
    """One probe process (vLLM imported once) for all cases; results by case name.

    ``KVPLAN_TWIN_RESULTS=FILE`` keeps the engine's results in FILE and reuses the cases it
    already holds (for working on the rules without rebuilding every engine); CI never sets it."""
    keep = os.environ.get("KVPLAN_TWIN_RESULTS")
    known: dict = {}
    if keep and Path(keep).is_file():
        known = {c["name"]: c for c in json.loads(Path(keep).read_text())["cases"]}
    todo = [c for c in cases if c["name"] not in known]
    results = {name: dict(c, vllm_version=c.get("vllm_version")) for name, c in known.items()}
    if todo:
        results.update(_probe(todo, folder))
    if keep:
        Path(keep).write_text(json.dumps({"cases": list(results.values())}))
    return results


def _probe(cases: list[dict], folder: Path) -> dict:
    request = folder / "request.json"
    out = folder / "result.json"
    request.write_text(json.dumps({"cases": cases}))
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.Popen([sys.executable, "-m", "kvplan.vllm.probe", str(request), "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=PROBE_TIMEOUT_S)
    finally:
        if proc.poll() is None:  # timed out or interrupted: stop the engine we started
            os.killpg(proc.pid, 9)
            proc.wait()
    if not out.is_file():
        pytest.fail("the vLLM probe wrote no result: " + err.decode("utf-8", "replace")[-3000:])
    doc = json.loads(out.read_text())
    results = {c["name"]: dict(c, vllm_version=doc.get("vllm_version")) for c in doc["cases"]}
    missing = [c["name"] for c in cases if c["name"] not in results]
    if missing:
        pytest.fail(f"the vLLM probe stopped before {missing[:3]}: " + err.decode("utf-8", "replace")[-3000:])
    return results
