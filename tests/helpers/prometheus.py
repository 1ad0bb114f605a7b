"""A real Prometheus server for the tests (Debian's ``prometheus`` package; .ci/run installs it): started on
loopback with its own config and storage folder, scraping the given targets, stopped by PID.

``KVPLAN_REQUIRE_PROMETHEUS=1`` (as .ci/run sets it) makes a missing binary a failure, not a skip."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

PROMETHEUS = shutil.which("prometheus")


def require_prometheus() -> str:
    if PROMETHEUS is None:
        if os.environ.get("KVPLAN_REQUIRE_PROMETHEUS", "") not in ("", "0"):
            pytest.fail("the prometheus binary is missing (apt-get install prometheus)")
        pytest.skip("the prometheus binary is missing (apt-get install --no-install-recommends prometheus)")
    return PROMETHEUS


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/-/ready", timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False


def targets_up(url: str) -> int:
    """How many of its targets Prometheus has scraped successfully (``up == 1``)."""
    query = urllib.request.quote("sum(up)")
    try:
        with urllib.request.urlopen(f"{url}/api/v1/query?query={query}", timeout=2) as resp:
            result = json.load(resp)["data"]["result"]
    except (OSError, ValueError, KeyError):
        return 0
    return int(float(result[0]["value"][1])) if result else 0


@contextlib.contextmanager
def running_prometheus(folder: Path, targets: list[str], scrape_interval: str = "250ms",
                       labels: dict[str, str] | None = None):
    """Prometheus on a free loopback port, scraping ``targets`` (host:port) every ``scrape_interval`` under the
    job ``vllm`` with ``labels``; yields its URL once it has scraped every target. Stopped by PID after."""
    from kvplan.bench.engine import free_port

    binary = require_prometheus()
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = folder / "prometheus.yml"
    # scrape_timeout may not exceed the interval (Prometheus refuses the config otherwise)
    config.write_text(json.dumps({  # YAML is a superset of JSON
        "global": {"scrape_interval": scrape_interval, "scrape_timeout": scrape_interval},
        "scrape_configs": [{"job_name": "vllm", "static_configs": [{"targets": targets, "labels": labels or {}}]}],
    }))
    log = (folder / "prometheus.log").open("w")
    proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not (_ready(url) and targets_up(url) >= len(targets)):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"prometheus did not start: {(folder / 'prometheus.log').read_text()[-2000:]}")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


class FakePrometheus:
    """A stand-in for Prometheus' query API on loopback, for the failure paths a real server cannot be made to take
    (lies, huge answers): ``answer(params) -> (status, body bytes)`` for every GET, where params are the request's
    query parameters. ``seen``: (path, params, headers) of every request."""

    def __init__(self, answer):
        import http.server
        import threading
        from urllib.parse import parse_qs, urlsplit

        fake = self
        self.seen: list[tuple[str, dict, dict]] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                parts = urlsplit(self.path)
                params = {k: v[0] for k, v in parse_qs(parts.query).items()}
                fake.seen.append((parts.path, params, dict(self.headers)))
                status, body = answer(params)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()


def ok(result_type: str, result) -> tuple[int, bytes]:
    """A successful answer of the query API."""
    return 200, json.dumps({"status": "success", "data": {"resultType": result_type, "result": result}}).encode()


class FakeEngineWorld:
    """Answers as a Prometheus scraping one fake vLLM (model ``fake``) would: its clock, the names it holds, fresh
    samples at once, and ``values`` (name -> value) for every instant query; ``instant`` overrides that answer
    (a lie, an error) when set."""

    NAMES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
             "vllm:num_preemptions_total")

    def __init__(self, values: dict[str, float] | None = None, instant=None):
        self.values = values or {name: 0.0 for name in self.NAMES}
        self.instant = instant

    def __call__(self, params: dict) -> tuple[int, bytes]:
        expr, now = params.get("query", ""), time.time()
        labels = {"job": "vllm", "instance": "fake:8000", "model_name": "fake", "engine": "0"}
        if expr == "time()":
            return ok("scalar", [now, repr(now)])
        if expr.startswith("count by"):
            return ok("vector", [{"metric": {"__name__": n, **labels}, "value": [now, "1"]} for n in self.values])
        if expr.startswith("timestamp("):
            return ok("vector", [{"metric": labels, "value": [now, repr(now + 0.001)]}])
        if expr.endswith("ms]"):
            at = float(params["time"])
            return ok("matrix", [{"metric": {"__name__": n, **labels}, "values": [[at, repr(v)]]}
                                 for n, v in self.values.items()])
        if self.instant is not None:
            return self.instant(params)
        return ok("vector", [{"metric": {"__name__": n, **labels}, "value": [float(params.get("time", now)), repr(v)]}
                             for n, v in self.values.items()])
