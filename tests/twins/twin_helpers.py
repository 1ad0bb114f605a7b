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


def probe_shards(cases: list[dict], workers: int | None = None) -> list[list[dict]]:
    """The cases split over ``workers`` probe processes (default 1, or $KVPLAN_TWIN_WORKERS: a probe
    builds one engine at a time on about one core, but its resident memory climbs to ~12 GB over the
    bundled twins, so two do not fit a 24 GB CI machine), the variants of one twin in one shard (they
    share its model inspection), shards balanced by their case counts."""
    workers = workers or max(1, int(os.environ.get("KVPLAN_TWIN_WORKERS") or 1))
    by_twin: dict[str, list[dict]] = {}
    for case in cases:
        by_twin.setdefault(case["twin"], []).append(case)
    shards: list[list[dict]] = [[] for _ in range(workers)]
    for group in sorted(by_twin.values(), key=len, reverse=True):
        min(shards, key=len).extend(group)
    return [s for s in shards if s]


def _probe(cases: list[dict], folder: Path) -> dict:
    """The probe processes run side by side (a CI machine's 2 cores: half the wall time of one)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    running = []  # (process, result file, log file): logs go to files, so no pipe fills and stalls a probe
    try:
        for number, shard in enumerate(probe_shards(cases)):
            request, out, log = (folder / f"{name}-{number}.{ext}" for name, ext in
                                 (("request", "json"), ("result", "json"), ("probe", "log")))
            request.write_text(json.dumps({"cases": shard}))
            with log.open("wb") as log_fh:
                proc = subprocess.Popen([sys.executable, "-m", "kvplan.vllm.probe", str(request), "-o", str(out)],
                                        stdout=subprocess.DEVNULL, stderr=log_fh, env=env, start_new_session=True)
            running.append((proc, out, log))
        for proc, _, _ in running:
            proc.wait(timeout=PROBE_TIMEOUT_S)
    finally:
        for proc, _, _ in running:
            if proc.poll() is None:  # timed out or interrupted: stop the engines we started
                os.killpg(proc.pid, 9)
                proc.wait()
    errors = [log.read_bytes()[-3000:] for _, _, log in running]
    results: dict = {}
    for (_, out, _), err in zip(running, errors):
        if not out.is_file():
            pytest.fail("the vLLM probe wrote no result: " + err.decode("utf-8", "replace")[-3000:])
        doc = json.loads(out.read_text())
        results.update({c["name"]: dict(c, vllm_version=doc.get("vllm_version")) for c in doc["cases"]})
    missing = [c["name"] for c in cases if c["name"] not in results]
    if missing:
        tail = b"".join(errors).decode("utf-8", "replace")[-3000:]
        pytest.fail(f"the vLLM probe stopped before {missing[:3]}: " + tail)
    return results
