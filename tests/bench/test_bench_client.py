"""`--header` and proxies from the environment: every component of a run (the readiness probe, the
model discovery, the /metrics scraper, the load generator) sends the headers and takes the same
proxy decision; header values and proxy passwords are written nowhere. Against the fake server and
a real forwarding proxy on loopback (no engine)."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import urllib.request
from pathlib import Path

import pytest
from helpers.bench import bench_env, kvplan_cmd
from helpers.fake_server import CountingProxy, FakeBehaviour, FakeServer

from kvplan.bench.client import Client, masked_headers, parse_headers, proxy_for, scrub
from kvplan.bench.loadgen import run_closed_loop
from kvplan.bench.metrics import scrape_once
from kvplan.bench.workload import Workload
from kvplan.errors import KvplanError

TOKEN = "gw-token-5f1e9c0a-secret"  # an --header value: must reach the server and no file
TENANT = "tenant-acme-7731"
PROXY_PASSWORD = "proxy-pw-93c1d7"
COMPONENTS = {"/health", "/v1/models", "/metrics", "/v1/completions"}
_PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "no_proxy",
               "all_proxy")


def _env(**extra: str) -> dict[str, str]:
    env = bench_env()
    for var in (*_PROXY_VARS, "OPENAI_API_KEY"):
        env.pop(var, None)
    env.update(extra)
    return env


def _cli(args: list[str], env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(kvplan_cmd(*args), capture_output=True, text=True, timeout=timeout, env=env or _env())


def _files_hold(root: Path, *secrets: str) -> list[str]:
    hits = []
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            hits += [f"{s} in {path}" for s in secrets if s.encode() in data]
    return hits


SMALL = ["--sweep", "1,2", "--requests", "4", "--prompt", "8", "--output", "3", "--scrape-interval", "0.05",
         "--no-warmup", "--json"]


# ------------------------------------------------------------------ parsing


def test_headers_parse_and_malformed_ones_never_echo_the_value():
    assert parse_headers(["Authorization: Bearer abc", "X-Tenant:acme", "X-Empty:"]) == (
        ("Authorization", "Bearer abc"), ("X-Tenant", "acme"), ("X-Empty", ""))
    assert masked_headers(parse_headers(["X-Token: s3cret"])) == ["X-Token: ***"]
    for bad, why in ((f"X-Token {TOKEN}", "no colon"), (f": {TOKEN}", "empty"), (f"X Token: {TOKEN}", "characters"),
                     (f"X-Token: {TOKEN}\r\nX-Evil: 1", "line break"), (f"X-Token: {TOKEN}\n", "line break"),
                     (f"Content-Length: {TOKEN}", "sets it")):
        with pytest.raises(KvplanError) as err:
            parse_headers([bad])
        assert why in str(err.value) and TOKEN not in str(err.value) + str(err.value.hint or "")
    with pytest.raises(KvplanError, match="twice"):
        parse_headers(["X-A: 1", "x-a: 2"])


def test_cli_refuses_a_malformed_header_with_one_line_and_exit_2(tmp_path):
    for bad in (f"X-Token {TOKEN}", f"X-Token: {TOKEN}\r\nX-Evil: 1", f": {TOKEN}"):
        proc = _cli(["--url", "http://127.0.0.1:9", "--header", bad, "--out", str(tmp_path)])
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr and TOKEN not in proc.stderr + proc.stdout
        assert proc.stderr.strip().startswith("error: invalid --header"), proc.stderr
    both = _cli(["--url", "http://127.0.0.1:9", "--api-key", "k" * 12, "-H", "Authorization: Bearer x",
                 "--out", str(tmp_path)])
    assert both.returncode == 2 and "both set the Authorization header" in both.stderr
    assert not any(tmp_path.iterdir())  # refused before a run folder exists


def test_scrub_masks_secrets_and_leaves_short_values():
    assert scrub(f"HTTP 401: bad token {TOKEN}!", [TOKEN, "1"]) == "HTTP 401: bad token ***!"
    assert scrub(None, [TOKEN]) is None


# ------------------------------------------------------------------ headers on every endpoint


def test_headers_reach_every_endpoint_and_no_file(tmp_path):
    headers = ["X-Gateway-Token: " + TOKEN, "X-Tenant: " + TENANT]
    with FakeServer(FakeBehaviour(tokens=3)) as srv:
        proc = _cli(["--url", srv.url, *[a for h in headers for a in ("--header", h)], *SMALL, "--out", str(tmp_path)])
        seen = list(srv.behaviour.seen)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert all(p["status"] == "ok" for p in summary["points"])
    assert summary["headers"] == ["X-Gateway-Token: ***", "X-Tenant: ***"] and summary["proxy"] is None
    paths = {path for path, _ in seen}
    assert paths >= COMPONENTS, paths
    for path, got in seen:  # every request of every component carried both headers
        assert got.get("X-Gateway-Token") == TOKEN and got.get("X-Tenant") == TENANT, (path, got)
    assert TOKEN not in proc.stdout + proc.stderr and TENANT not in proc.stdout + proc.stderr
    run = next(tmp_path.iterdir())
    assert {"run.json", "summary.json", "report.md", "report.html", "points.csv", "requests.csv"} <= {
        p.name for p in run.iterdir()}
    assert _files_hold(tmp_path, TOKEN, TENANT) == []
    assert json.loads((run / "run.json").read_text())["config"]["header_names"] == ["X-Gateway-Token", "X-Tenant"]
    assert "X-Gateway-Token: ***" in (run / "report.md").read_text()


def test_a_server_echoing_the_header_value_does_not_get_it_written(tmp_path):
    with FakeServer(FakeBehaviour(status=401, echo_header="X-Gateway-Token")) as srv:
        proc = _cli(["--url", srv.url, "--header", "X-Gateway-Token: " + TOKEN, *SMALL, "--out", str(tmp_path)])
    assert proc.returncode == 4, proc.stderr  # every request failed
    assert "you sent" in proc.stderr and TOKEN not in proc.stdout + proc.stderr
    assert _files_hold(tmp_path, TOKEN) == []
    assert "you sent '***'" in (next(tmp_path.iterdir()) / "requests.jsonl").read_text()


def test_resume_asks_for_the_headers_again(tmp_path):
    with FakeServer(FakeBehaviour(tokens=3)) as srv:
        first = _cli(["--url", srv.url, "--header", "X-Gateway-Token: " + TOKEN, *SMALL, "--out", str(tmp_path)])
        assert first.returncode == 0, first.stderr
        run = next(tmp_path.iterdir())
        lines = (run / "points.jsonl").read_text().splitlines()
        (run / "points.jsonl").write_text(lines[0] + "\n")  # as if stopped after the first point
        (run / "summary.json").unlink()
        asked = _cli(["--resume", str(run), "--json"])
        srv.behaviour.seen.clear()
        resumed = _cli(["--resume", str(run), "--header", "X-Gateway-Token: " + TOKEN, "--json"])
        seen = list(srv.behaviour.seen)
    assert asked.returncode == 2 and "Traceback" not in asked.stderr
    assert "X-Gateway-Token" in asked.stderr and "--header" in asked.stderr and len(asked.stderr.strip().splitlines()) <= 2
    assert resumed.returncode == 0, resumed.stderr
    assert [p["concurrency"] for p in json.loads(resumed.stdout)["points"]] == [1, 2]
    assert seen and all(h.get("X-Gateway-Token") == TOKEN for _, h in seen)
    assert _files_hold(tmp_path, TOKEN) == []


# ------------------------------------------------------------------ proxies


def test_proxy_decision_is_the_standard_librarys(monkeypatch):
    for var in _PROXY_VARS:
        monkeypatch.delenv(var, raising=False)
    assert proxy_for("http://127.0.0.1:8000") is None
    monkeypatch.setenv("HTTP_PROXY", "http://u:p@proxy.example:3128")
    monkeypatch.setenv("HTTPS_PROXY", "proxy.example:3129")  # no scheme: http:// as urllib reads it
    assert proxy_for("http://127.0.0.1:8000/v1") == "http://u:p@proxy.example:3128"
    assert proxy_for("https://gw.example/v1") == "http://proxy.example:3129"
    for no_proxy, url, direct in (("127.0.0.1,localhost", "http://127.0.0.1:8000", True),
                                  ("127.0.0.1,localhost", "http://localhost:8000", True),
                                  ("localhost", "http://127.0.0.1:8000", False),
                                  (".example.com", "http://gpu.example.com:8000", True),
                                  ("gpu-box:8000", "http://gpu-box:8000", True),
                                  ("gpu-box:9000", "http://gpu-box:8000", False),
                                  ("*", "http://anything:1", True)):
        monkeypatch.setenv("NO_PROXY", no_proxy)
        assert (proxy_for(url) is None) is direct, (no_proxy, url)
        # urllib's own default handler agrees (what http.client-based probes have always done)
        req = urllib.request.Request(url)
        handler = urllib.request.ProxyHandler()
        assert (urllib.request.proxy_bypass(req.host) or "http" not in handler.proxies) is direct


def test_every_component_goes_through_the_proxy_and_its_password_is_written_nowhere(tmp_path):
    with FakeServer(FakeBehaviour(tokens=3)) as srv, CountingProxy() as proxy:
        env = _env(HTTP_PROXY=f"http://puser:{PROXY_PASSWORD}@127.0.0.1:{proxy.port}")
        proc = _cli(["--url", srv.url, "--header", "X-Gateway-Token: " + TOKEN, *SMALL, "--out", str(tmp_path / "p")],
                    env=env)
        through = list(proxy.paths)
        auth = set(proxy.proxy_auth)
        seen = list(srv.behaviour.seen)
        direct = _cli(["--url", srv.url, *SMALL, "--out", str(tmp_path / "d")],
                      env=dict(env, NO_PROXY="localhost,127.0.0.1"))
        after_direct = len(proxy.paths)
    assert proc.returncode == 0, proc.stderr
    assert set(through) >= COMPONENTS, through
    # every request the server saw came through the proxy (it forwards, the client never connected itself)
    assert len(through) == len(seen) and sorted(through) == sorted(p for p, _ in seen)
    assert auth == {"Basic " + base64.b64encode(f"puser:{PROXY_PASSWORD}".encode()).decode()}
    assert all(h.get("X-Gateway-Token") == TOKEN for _, h in seen)  # headers pass through the proxy
    summary = json.loads(proc.stdout)
    assert summary["proxy"] == f"http://***@127.0.0.1:{proxy.port}"
    assert f"proxy: http://***@127.0.0.1:{proxy.port}" in (next((tmp_path / "p").iterdir()) / "report.md").read_text()
    assert direct.returncode == 0, direct.stderr
    assert after_direct == len(through)  # NO_PROXY=127.0.0.1: nothing went through the proxy
    assert json.loads(direct.stdout)["proxy"] is None
    for text in (proc.stdout, proc.stderr, direct.stdout, direct.stderr):
        assert PROXY_PASSWORD not in text and TOKEN not in text
    assert _files_hold(tmp_path, PROXY_PASSWORD, TOKEN) == []


def test_a_dead_proxy_is_named_masked(tmp_path):
    with FakeServer() as srv:
        env = _env(HTTP_PROXY=f"http://puser:{PROXY_PASSWORD}@127.0.0.1:9")
        proc = _cli(["--url", srv.url, *SMALL, "--out", str(tmp_path)], env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "through the proxy http://***@127.0.0.1:9" in proc.stderr and PROXY_PASSWORD not in proc.stderr


def test_library_calls_take_the_client(monkeypatch):
    """run_closed_loop and scrape_once with a Client: headers and the proxy, in-process."""
    for var in _PROXY_VARS:
        monkeypatch.delenv(var, raising=False)
    w = Workload(prompt_tokens=8, output_tokens=2, nonce="t")
    with FakeServer(FakeBehaviour(tokens=2)) as srv, CountingProxy() as proxy:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
        client = Client(headers=(("X-Tenant", TENANT),))
        load = asyncio.run(run_closed_loop(srv.url, "fake", "completions", 2, 1, w.request, client=client))
        asyncio.run(scrape_once(srv.url, client=client))
        paths = list(proxy.paths)
    assert all(r.ok for r in load.records)
    assert paths.count("/v1/completions") == 2 and paths.count("/metrics") == 1
    assert all(h.get("X-Tenant") == TENANT for _, h in srv.behaviour.seen)
