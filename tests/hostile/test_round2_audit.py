"""Issue 28 (hostile input, round 2), re-attacked: the classes an audit found still open after the first
fixes. Figures past any range in the files kvplan wrote itself (a 400-digit load, 2**63 preemptions, a p99
of 1.7e308 s, a 5e-324 count) and points.jsonl lines of the wrong types, in `report`, `check --bench` and
`bench --resume`; a full disk while a run appends its lines; a probe a server answers a byte at a time; a
`calibrate --bench` fit faster than the GPU; redirects of every 3xx status on each HTTP path of a run;
spreadsheet formulas through every CSV kvplan writes. Generated cases over every field of a run's
summary.json and points.jsonl, a `vllm bench serve` result and a GuideLLM report keep the contract: exit
0, 1 or 2, one line on stderr, never a traceback."""

from __future__ import annotations

import asyncio
import csv
import errno
import io
import json
import random
import shutil
import sys
import time
from pathlib import Path

import pytest
from helpers.fake_server import FakeBehaviour, FakeServer, _StreamServer
from helpers.harness import invoke

import kvplan.bench.steptime_io as steptime_io

DATA = Path(__file__).resolve().parents[1] / "bench" / "data"
OLD_RUN = DATA / "old-run-conc"
HUGE = {"400 digits": 10**400, "2**63": 2**63, "float max": sys.float_info.max, "-float max": -sys.float_info.max,
        "subnormal": 5e-324}
ODD = {**HUGE, "string": "x", "list": [], "object": {"a": 1}, "null": None, "true": True, "negative": -1,
       "formula": "=cmd|' /C calc'!A0", "escape": "\x1b]0;x\x07"}
SMALL = ["--sweep", "1", "--requests", "2", "--prompt", "8", "--output", "2", "--no-warmup"]


def _kept_the_contract(r, what: str) -> None:
    assert r.code in (0, 1, 2), (what, r.code, r.stderr[-1500:])
    assert "Traceback" not in r.stdout + r.stderr, (what, r.stderr[-3000:])
    if r.code == 2:
        assert len(r.stderr.strip().splitlines()) == 1, (what, r.stderr[-1500:])


def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc[:2]):
            yield from _paths(value, (*prefix, i))


def _set(doc, path, value):
    doc = json.loads(json.dumps(doc))
    if not path:
        return value
    cur = doc
    for key in path[:-1]:
        cur = cur[key]
    cur[path[-1]] = value
    return doc


def _cases(doc, n: int, seed: int):
    """``n`` (path, value name) pairs over ``doc``'s fields, the same ones every run (seeded)."""
    paths = list(_paths(doc))
    rnd = random.Random(seed)
    return [(p, v) for p in [(), *rnd.sample(paths, min(n, len(paths)))] for v in ODD]


# --- figures past any range in the files kvplan wrote ------------------------------------------------

SUMMARY = json.loads((OLD_RUN / "summary.json").read_text())


@pytest.mark.parametrize(("field", "value"), [(("prediction", "first_kv_wait"), 10**400),
                                              (("points", 0, "server", "preemptions"), 2**63),
                                              (("points", 1, "server", "preemptions"), 5e-324),
                                              (("points", 0, "ttft", "p99"), sys.float_info.max),
                                              (("points", 1, "concurrency"), 10**39)])
@pytest.mark.parametrize("command", ["report", "check"])
def test_a_run_figure_past_any_range_is_no_internal_error(tmp_path, field, value, command):
    run = tmp_path / "run"
    shutil.copytree(OLD_RUN, run)
    (run / "summary.json").write_text(json.dumps(_set(SUMMARY, field, value)))
    if command == "report":
        r = invoke("report", str(run), "--format", "csv")
    else:
        spec = tmp_path / "kvplan.yaml"
        spec.write_text("deployments:\n  - name: a\n    model: meta-llama/Llama-3.1-8B\n    gpu: H100\n    ctx: 8k\n"
                        "    concurrency: 4\n")
        r = invoke("check", str(spec), "--bench", str(run))
    _kept_the_contract(r, field)
    if isinstance(value, int) and abs(value) > 2**53:
        assert r.code == 2 and "more than any figure kvplan writes" in r.stderr, r.stderr


@pytest.mark.parametrize(("path", "value"), _cases(SUMMARY, 12, seed=28))
def test_generated_summary_fields_keep_the_contract_in_report(tmp_path, path, value):
    run = tmp_path / "run"
    shutil.copytree(OLD_RUN, run)
    (run / "summary.json").write_text(json.dumps(_set(SUMMARY, path, ODD[value])))
    _kept_the_contract(invoke("report", str(run), "--format", "csv"), (path, value))


@pytest.mark.parametrize(("path", "value"), _cases(SUMMARY, 40, seed=29))
def test_generated_summary_fields_keep_the_contract_in_check_bench(tmp_path, path, value):
    run = tmp_path / "run"
    shutil.copytree(OLD_RUN, run)
    (run / "summary.json").write_text(json.dumps(_set(SUMMARY, path, ODD[value])))
    spec = tmp_path / "kvplan.yaml"
    spec.write_text("deployments:\n  - name: a\n    model: meta-llama/Llama-3.1-8B\n    gpu: H100\n    ctx: 8k\n"
                    "    concurrency: 4\n")
    _kept_the_contract(invoke("check", str(spec), "--bench", str(run)), (path, value))


@pytest.mark.parametrize("source", ["vllm-bench-serve-c16.json", "guidellm-concurrent.json"])
def test_generated_fields_of_other_tools_results_keep_the_contract(tmp_path, source):
    doc = json.loads((DATA / source).read_text())
    for n, (path, value) in enumerate(_cases(doc, 10 if source.startswith("guidellm") else 30, seed=30)):
        target = tmp_path / f"{n}-{source}"
        target.write_text(json.dumps(_set(doc, path, ODD[value])))
        _kept_the_contract(invoke("report", str(target), "--format", "csv"), (path, value))


POINTS = [json.loads(line) for line in (OLD_RUN / "points.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(("field", "value", "refused"), [
    ("seq", "x", True), ("ttft", {"n": "x"}, True), ("concurrency", 10**400, False),
    ("server", {"preemptions": 2**63}, False), ("rate", 1e308, False), ("wall_s", 0, False)])
def test_resume_of_a_points_line_kvplan_did_not_write(tmp_path, field, value, refused):
    """A line of the wrong type is refused naming it (it was a pydantic ValidationError, exit 3); a number
    past any range makes the line unreadable, so the point is measured again (it was an OverflowError)."""
    run = tmp_path / "run"
    shutil.copytree(OLD_RUN, run)
    (run / "summary.json").unlink()
    (run / "points.jsonl").write_text(json.dumps(dict(POINTS[0], **{field: value}) | (
        {"mode": "rate"} if field == "rate" else {})) + "\n")
    with FakeServer(FakeBehaviour(tokens=6)) as srv:
        r = invoke("bench", "--resume", str(run), "--url", srv.url, "--json")
        measured = srv.behaviour.requests
    _kept_the_contract(r, field)
    if refused:
        assert r.code == 2 and "point 1 of points.jsonl is not one kvplan wrote" in r.stderr, r.stderr
        assert measured == 0
    else:
        assert r.code == 0 and measured > 0, r.stderr


def test_a_seed_run_json_could_not_hold_is_refused_before_the_run(tmp_path):
    r = invoke("bench", "--url", "http://127.0.0.1:9", "--seed", str(2**64), *SMALL, "--out", str(tmp_path))
    assert r.code == 2 and "--seed" in r.one_line_error()


@pytest.mark.parametrize("points", [[(1.0, 5e-324), (2.0, 0.0)], [(5e-324, 5e-324)], [(sys.float_info.max,) * 2],
                                    [(1.0, sys.float_info.max), (2.0, 1.0)], [(1e308, 1.0), (1e308, 2.0)],
                                    [(sys.float_info.max, 1.0), (-sys.float_info.max, 1.0)]])
@pytest.mark.parametrize("log_x", [True, False])
def test_the_html_chart_draws_any_finite_figures(points, log_x):
    from kvplan.bench.outputs.html import chart

    svg = chart("t", "x", "y", [("a", points, "#000", "")], log_x=log_x)
    assert svg.startswith("<figure><svg") and "nan" not in svg.lower()


# --- a full disk while a run appends its lines -----------------------------------------------------

def test_a_full_disk_while_appending_is_one_line_and_leaves_no_torn_line(tmp_path, monkeypatch):
    import os

    from kvplan.bench import store as st

    real_fsync = os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    run = tmp_path / "run"
    run.mkdir()
    s = st.RunStore(run)
    s.append_point({"seq": 1})
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(st.KvplanError, match="No space left on device"):
        s.append_point({"seq": 2, "pad": "x" * 10_000})
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert (run / "points.jsonl").read_text() == '{"seq":1}\n'  # cut back: no torn or half-kept line

    monkeypatch.setattr(st, "_append_to", lambda fh, data: full(0))
    with FakeServer(FakeBehaviour(tokens=2)) as srv:
        r = invoke("bench", "--url", srv.url, *SMALL, "--out", str(tmp_path / "out"))
    assert r.code == 2 and "No space left on device" in r.stderr.splitlines()[-1], (r.code, r.stderr[-1500:])
    assert "Traceback" not in r.stderr


# --- a server that answers the probe a byte at a time ----------------------------------------------

class _Trickle(_StreamServer):
    """Answers ``route`` with headers, then one byte of body every 0.2 s, forever; other routes at once."""

    def __init__(self, route: str) -> None:
        super().__init__()
        self.route = route

    async def _handle(self, reader, writer) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ")[1].decode()
            if path.startswith(self.route):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 99999999\r\n\r\n")
                while True:
                    writer.write(b" ")
                    await writer.drain()
                    await asyncio.sleep(0.2)
            body = b'{"object":"list","data":[{"id":"fake"}]}' if "models" in path else b""
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


@pytest.mark.parametrize("route", ["/health", "/v1/models"])
def test_a_probe_answered_a_byte_at_a_time_ends_in_bounded_time(monkeypatch, route):
    """urllib's timeout counts seconds without a byte: a server trickling its answer held `bench` forever.
    Each GET now ends timeout + GET_BODY_S after it began (20 s in kvplan; 1 s here)."""
    from kvplan.bench import client

    monkeypatch.setattr(client, "GET_BODY_S", 1.0)
    with _Trickle(route) as srv:
        url = f"http://127.0.0.1:{srv.port}"
        started = time.monotonic()
        status, body = client.Client().get(url + route, timeout_s=1.0)
        assert (status, body) == (0, "") and time.monotonic() - started < 5
        r = invoke("bench", "--url", url, *SMALL, "--out", "out")
        assert r.code == 2 and time.monotonic() - started < 30, (r.code, r.stderr[-1000:])
        assert "Traceback" not in r.stderr and [ln for ln in r.stderr.splitlines() if ln.strip()] == [
            r.stderr.strip()], r.stderr  # one line (the live view may end its own line first)


# --- redirects: every 3xx, on each HTTP path a run takes -------------------------------------------

@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_no_http_path_of_a_run_follows_any_redirect(status):
    """The probe and model list (urllib), the /metrics scraper and the load (aiohttp): a redirect of any
    kind to another origin reaches it with nothing, no key, header or URL credential (the CLI routes:
    tests/bench/test_bench_redirects.py)."""
    from kvplan.bench.client import Client
    from kvplan.bench.metrics import fetch_text

    client = Client(api_key="sk-redirect-key-123", headers=(("X-Token", "tok-redirect-456"),))
    with FakeServer(FakeBehaviour()) as other, FakeServer(FakeBehaviour()) as srv:
        for route in ("/v1/models", "/health", "/metrics", "/v1/completions"):
            srv.behaviour.redirect[route] = (status, other.url + route)
        url = srv.url.replace("http://", "http://alice:url-pw-789@")
        assert client.get(url + "/v1/models")[0] == status
        assert client.get(url + "/health")[0] == status

        async def aio() -> tuple[str, int]:
            import aiohttp

            async with aiohttp.ClientSession(trust_env=False) as session:
                bare, kwargs = client.aio_kwargs(url + "/metrics")
                try:
                    await fetch_text(session, bare, kwargs)
                    why = ""
                except RuntimeError as exc:
                    why = str(exc)
                bare, kwargs = client.aio_kwargs(url + "/v1/completions")
                async with session.post(bare, json={"prompt": "x"}, **kwargs) as resp:
                    return why, resp.status

        why, posted = asyncio.run(aio())
        reached = list(other.behaviour.seen)
        asked = {path for path, _ in srv.behaviour.seen}
    assert asked == {"/v1/models", "/health", "/metrics", "/v1/completions"}
    assert f"HTTP {status}, a redirect" in why and posted == status
    assert reached == [], reached


# --- calibrate --bench: no fit faster than the GPU -------------------------------------------------

def _calibration_run(tmp_path: Path, itl_p50: float | None = None) -> Path:
    run = tmp_path / "run"
    shutil.copytree(OLD_RUN, run)
    doc = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps(dict(doc, model="meta-llama/Llama-3.1-8B-Instruct")))
    if itl_p50 is not None:
        rows = [dict(p, itl=dict(p["itl"], p50=itl_p50)) for p in POINTS]
        (run / "points.jsonl").write_text("".join(json.dumps(p) + "\n" for p in rows))
    return run


def test_calibrate_refuses_steps_faster_than_the_gpu_can_run(tmp_path):
    """1 us a decode step of Llama-3.1-8B on an H100 (16 GB of weights at 3.35 TB/s is 4.8 ms): a server's
    figures, or another GPU's, not this one's. Nothing is stored."""
    run = _calibration_run(tmp_path, itl_p50=1e-6)
    r = invoke("calibrate", "--bench", str(run), "--gpu", "H100")
    assert r.code == 2 and "faster than H100" in r.one_line_error()
    assert not (run / "steptime.json").exists()


def test_calibrate_stores_no_fit_faster_than_the_gpu(tmp_path, monkeypatch):
    """The old CPU run's steps (5.2-5.4 ms at 1 and 4 streams) named an H100. Summed terms (`calibrate_bench`'s
    ``overlap=False``) put every step in the overhead and read memory for free (efficiency ~8e8), which would predict a
    large batch faster than the GPU's bandwidth: refused on the GPU, nothing stored; the same run calibrates on the
    nominal device. With overlapping terms (the default) the fit reads the weights at most at the GPU's bandwidth, and
    what is stored says so."""
    run = _calibration_run(tmp_path)
    r = invoke("calibrate", "--bench", str(run), "--gpu", "H100")
    assert r.code == 0, r.stderr
    stored = json.loads((run / "steptime.json").read_text())["steptime"]
    assert stored["overlap"] and 0 < stored["mem_efficiency"] <= 1 and 0 < stored["compute_efficiency"] <= 1
    (run / "steptime.json").unlink()

    summed = steptime_io.calibrate_bench
    monkeypatch.setattr(steptime_io, "calibrate_bench", lambda *a, **k: summed(*a, **k, overlap=False))
    r = invoke("calibrate", "--bench", str(run), "--gpu", "H100")
    assert r.code == 2 and "faster than its bandwidth" in r.one_line_error()
    assert not (run / "steptime.json").exists()
    assert invoke("calibrate", "--bench", str(run)).code == 0 and (run / "steptime.json").is_file()


# --- spreadsheet formulas through every CSV kvplan writes, end to end ------------------------------

FORMULAS = ["-2+3+cmd|' /C calc'!A0", "\t=1+1", "\r=1+1", '=HYPERLINK("http://x")', "@SUM(1)", " +1+cmd"]


def _formulas(text: str) -> list[str]:
    out = []
    for row in csv.reader(io.StringIO(text)):
        for cell in row:
            head = cell.lstrip(" ")
            if cell[:1] in ("\t", "\r") or head[:1] in ("=", "+", "-", "@"):
                try:
                    float(cell)
                except ValueError:
                    out.append(cell)
    return out


@pytest.mark.parametrize("payload", FORMULAS)
def test_no_csv_kvplan_writes_starts_a_formula(tmp_path, payload):
    run = tmp_path / "run"
    shutil.copytree(OLD_RUN, run)
    for name in ("summary.json", "run.json"):
        doc = json.loads((run / name).read_text())
        doc["model"] = payload
        if name == "summary.json":
            doc["workload"] = payload
            doc["points"][0]["error"] = payload
        (run / name).write_text(json.dumps(doc))
    rows = [dict(json.loads(line), error=payload) for line in (run / "requests.jsonl").read_text().splitlines()]
    (run / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = invoke("report", str(run), "--format", "csv")
    assert r.code == 0, r.stderr
    shown = {"report --format csv": r.stdout, "points.csv": (run / "points.csv").read_text(),
             "requests.csv": (run / "requests.csv").read_text()}
    assert payload.strip()[:6].replace("\t", "").replace("\r", "") in "".join(shown.values()).replace("\\r", "")
    spec = tmp_path / "kvplan.yaml"
    spec.write_text("defaults:\n  model: meta-llama/Llama-3.1-8B-Instruct\n  gpu: H100\n  vllm_version: '0.11.0'\n"
                    f"  kv_cache_memory: 16GiB\n  context: 32k\ndeployments:\n  - name: {json.dumps(payload)}\n"
                    "    concurrency: 4\n")
    checked = invoke("check", str(spec), "--format", "csv")
    assert checked.code in (0, 1), checked.stderr
    shown["check --format csv"] = checked.stdout
    assert {k: _formulas(v) for k, v in shown.items()} == {k: [] for k in shown}
