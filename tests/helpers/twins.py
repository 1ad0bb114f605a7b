"""Runs vLLM once for every twin case of the differential tests (see test_twins.py).

The probe starts as soon as the session knows its cases (tests/twins/conftest.py), niced, so it builds
engines on the core the tests that need no engine leave idle; the twin tests, ordered after those
(tests/conftest.py), wait for its results."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

PROBE_TIMEOUT_S = 2400  # from its start: it may run starved beside the rest of the suite for a while
PROBE_NICENESS = 19  # the tests beside it keep their core; the probe gets what they leave


def probe_shards(cases: list[dict], workers: int | None = None) -> list[list[dict]]:
    """The cases split over ``workers`` probe processes (default 1, or $KVPLAN_TWIN_WORKERS: a probe
    builds one engine at a time on about one core, which is what the tests beside it leave; its resident
    memory peaked at 2.1 GB over the bundled twins, 15.5 GB before it stopped computing rotary caches), the
    variants of one twin in one shard (they share its model inspection), shards balanced by their case counts."""
    workers = workers or max(1, int(os.environ.get("KVPLAN_TWIN_WORKERS") or 1))
    by_twin: dict[str, list[dict]] = {}
    for case in cases:
        by_twin.setdefault(case["twin"], []).append(case)
    shards: list[list[dict]] = [[] for _ in range(workers)]
    for group in sorted(by_twin.values(), key=len, reverse=True):
        min(shards, key=len).extend(group)
    return [s for s in shards if s]


class ProbeRun:
    """The probe processes for ``cases``, started on construction; ``results()`` waits for them.

    ``KVPLAN_TWIN_RESULTS=FILE`` keeps the engine's results in FILE and reuses the cases it already
    holds (for working on the rules without rebuilding every engine); CI never sets it."""

    def __init__(self, cases: list[dict], folder: Path):
        self.cases, self.folder = cases, folder
        self.keep = os.environ.get("KVPLAN_TWIN_RESULTS")
        self.known: dict = {}
        if self.keep and Path(self.keep).is_file():
            self.known = {c["name"]: c for c in json.loads(Path(self.keep).read_text())["cases"]}
        self.started = time.monotonic()
        self.running: list[tuple[subprocess.Popen, Path, Path]] = []  # (process, result file, log file)
        self._results: dict | None = None
        todo = [c for c in cases if c["name"] not in self.known]
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        for number, shard in enumerate(probe_shards(todo) if todo else []):
            request, out, log = (folder / f"{name}-{number}.{ext}" for name, ext in
                                 (("request", "json"), ("result", "json"), ("probe", "log")))
            request.write_text(json.dumps({"cases": shard}))
            with log.open("wb") as log_fh:  # logs go to files, so no pipe fills and stalls a probe
                proc = subprocess.Popen(
                    [sys.executable, "-m", "kvplan.vllm.probe", str(request), "-o", str(out)],
                    stdout=subprocess.DEVNULL, stderr=log_fh, env=env, start_new_session=True,
                    preexec_fn=lambda: os.nice(PROBE_NICENESS))
            self.running.append((proc, out, log))

    def results(self) -> dict:
        """Every case's result by name (waiting for the probes); a probe that stopped early fails the test."""
        if self._results is None:
            try:
                for proc, _, _ in self.running:
                    proc.wait(timeout=max(1.0, self.started + PROBE_TIMEOUT_S - time.monotonic()))
            finally:
                self.stop()
            self._results = self._collect()
        return self._results

    def stop(self) -> None:
        """Stop the probes we started (timed out, interrupted, or the session ending early)."""
        for proc, _, _ in self.running:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def _collect(self) -> dict:
        results = {name: dict(c, vllm_version=c.get("vllm_version")) for name, c in self.known.items()}
        errors = [log.read_bytes()[-3000:] for _, _, log in self.running]
        for (_, out, _), err in zip(self.running, errors):
            if not out.is_file():
                pytest.fail("the vLLM probe wrote no result: " + err.decode("utf-8", "replace")[-3000:])
            doc = json.loads(out.read_text())
            results.update({c["name"]: dict(c, vllm_version=doc.get("vllm_version")) for c in doc["cases"]})
        if self.keep:
            Path(self.keep).write_text(json.dumps({"cases": list(results.values())}))
        missing = [c["name"] for c in self.cases if c["name"] not in results]
        if missing:
            tail = b"".join(errors).decode("utf-8", "replace")[-3000:]
            pytest.fail(f"the vLLM probe stopped before {missing[:3]}: " + tail)
        return results


PROBE_RUN = pytest.StashKey[ProbeRun]()  # the session's probe, in config.stash (tests/twins/conftest.py)
