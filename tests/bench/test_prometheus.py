"""`kvplan bench --prometheus` on its failure paths and its arithmetic, against a fake of Prometheus' query API
(the real server, scraping the real CPU engine, is tests/bench/test_prometheus_engine.py): Prometheus down, a
query it refuses, answers that lie, are malformed or huge, two replicas summed by hand; and no credential of
either origin reaching the other, a file or a log."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess

import pytest
from helpers.bench import bench_env, kvplan_cmd
from helpers.fake_server import FakeBehaviour, FakeServer
from helpers.prometheus import FakeEngineWorld, FakePrometheus, ok

from kvplan.bench.client import MAX_BODY_BYTES, Client
from kvplan.bench.prometheus import MAX_SERIES, Prometheus, PrometheusError, parse_selector
from kvplan.errors import KvplanError


def _reader(fake: FakePrometheus, selector: str | None = 'job="vllm"') -> Prometheus:
    return Prometheus(url=fake.url, selector=selector, client=Client(), wait_s=2.0)


@pytest.mark.parametrize(("given", "matchers"), [
    ('{namespace="llm"}', 'namespace="llm"'),
    ('{ namespace = "llm" , pod =~ "vllm-.*", }', 'namespace="llm",pod=~"vllm-.*"'),
    ('{a!="x\\"y", b!~"z"}', 'a!="x\\"y",b!~"z"'),
    ("{}", None),
])
def test_a_selector_is_kept_as_its_matchers(given, matchers):
    assert parse_selector(given) == matchers


@pytest.mark.parametrize("bad", [
    'namespace="llm"',  # no braces
    '{namespace="llm"} or vector(1) {a="b"}',  # a query spliced in
    '{namespace=llm}',  # unquoted
    '{namespace="llm" pod="x"}',  # no comma
    '{__name__="vllm:num_requests_running"}',  # kvplan picks the names
    '{a="' + "x" * 3000 + '"}',
    '{a="x\ny"}',
])
def test_a_selector_that_is_not_plain_matchers_is_refused(bad):
    with pytest.raises(KvplanError) as info:
        parse_selector(bad)
    assert "\n" not in str(info.value)


def _raises(answer, call) -> str:
    with FakePrometheus(answer) as fake, pytest.raises(PrometheusError) as info:
        call(_reader(fake))
    text = str(info.value)
    assert "\n" not in text and "Traceback" not in text
    return text


def _vector_of(*values: str):
    return lambda params: ok("vector", [{"metric": {"__name__": "vllm:num_preemptions_total", "engine": str(i)},
                                         "value": [100.0, v]} for i, v in enumerate(values)])


@pytest.mark.parametrize(("answer", "said"), [
    (lambda p: (200, b"<html>hello</html>"), "no Prometheus API answer"),
    (lambda p: (200, b"[" * 200_000), "no Prometheus API answer"),  # nested past Python's recursion limit
    (lambda p: (200, b'{"status": "success", "data": {"resultType": "vector", "result": ['
                + b'{"metric": {}, "value": [1, "1"]},' * (MAX_BODY_BYTES // 30)), "no Prometheus API answer"),
    (lambda p: (422, b'{"status": "error", "errorType": "execution", "error": "query timed out"}'),
     "Prometheus refused the query"),
    (lambda p: (503, b""), "no Prometheus API answer"),
    (lambda p: (401, b""), "wants credentials"),
    (lambda p: (302, b""), "a redirect"),
    (lambda p: ok("string", [1, "x"]), "a string where a vector was asked"),
    (lambda p: ok("vector", [{"metric": {"a": 1}, "value": [1, "1"]}]), "without string labels"),
    (lambda p: ok("vector", [{"metric": {}, "value": [1, 5]}]), "not [time, \"value\"]"),
    (lambda p: ok("vector", [{"metric": {}, "value": ["soon", "5"]}]), "sample time that is not a number"),
    (lambda p: ok("vector", [{"metric": {}, "value": [1, "five"]}]), "sample value that is not a number"),
    (lambda p: ok("vector", [{"metric": {}, "value": [1, "1"]}] * (MAX_SERIES + 1)), "narrow --selector"),
])
def test_an_answer_that_lies_errs_or_overflows_is_one_line(answer, said):
    assert said in _raises(answer, lambda r: r.series('{__name__="x"}', 100.0))


def test_prometheus_down_is_one_line():
    reader = Prometheus(url="http://127.0.0.1:9", selector=None, client=Client())
    with pytest.raises(PrometheusError, match="Prometheus does not answer at http://127.0.0.1:9/api/v1/query"):
        reader.check()


def test_a_sample_no_engine_gives_is_no_figure():
    """NaN, infinite and negative counter samples are dropped as from /metrics: the delta is unknown, not NaN."""
    for lie in ("NaN", "+Inf", "-3"):
        with FakePrometheus(_vector_of("2", lie)) as fake:
            reader = _reader(fake)
            reader.names = {"preemptions": "vllm:num_preemptions_total"}
            snap = reader.snapshot(100.0, 100.0)
        assert snap.get("preemptions") == 2.0, lie  # the sane engine's alone: a wrong figure never
    with FakePrometheus(_vector_of("NaN")) as fake:
        reader = _reader(fake)
        reader.names = {"preemptions": "vllm:num_preemptions_total", "running": "vllm:num_requests_running"}
        assert reader.snapshot(100.0, 100.0).get("preemptions") is None


def test_two_replicas_are_summed_as_the_scraper_sums_engines():
    """Two replicas A and B, scraped at different times. Counters: the instant vectors at the window's marks
    (t=100, t=110). Gauges: every sample in between, each replica at its latest by then (worked by hand below)."""
    a, b = {"job": "vllm", "instance": "a:8000"}, {"job": "vllm", "instance": "b:8000"}
    at = {  # name -> replica -> value, at the start mark and at the end mark
        100.0: {"vllm:num_preemptions_total": (1, 2), "vllm:prompt_tokens_total": (100, 50),
                "vllm:num_requests_running": (0, 0), "vllm:kv_cache_usage_perc": (0.0, 0.0)},
        110.0: {"vllm:num_preemptions_total": (4, 2), "vllm:prompt_tokens_total": (164, 114),
                "vllm:num_requests_running": (0, 0), "vllm:kv_cache_usage_perc": (0.1, 0.0)},
    }
    window = {  # the gauges' samples in (100, 110]
        "vllm:num_requests_running": ([(101, 2), (103, 4)], [(102, 1), (104, 3)]),
        "vllm:kv_cache_usage_perc": ([(101, 0.5), (103, 0.75)], [(102, 0.9), (104, 0.25)]),
    }

    def answer(params):
        t = float(params["time"])
        if params["query"].endswith("ms]"):
            return ok("matrix", [{"metric": {"__name__": n, **lab}, "values": [[ts, str(v)] for ts, v in samples]}
                                 for n, pair in window.items() for lab, samples in zip((a, b), pair)])
        return ok("vector", [{"metric": {"__name__": n, **lab}, "value": [t - 0.2, str(v)]}
                             for n, pair in at[t].items() for lab, v in zip((a, b), pair)])

    with FakePrometheus(answer) as fake:
        reader = _reader(fake)
        reader.names = {"preemptions": "vllm:num_preemptions_total", "prompt_tokens": "vllm:prompt_tokens_total",
                        "running": "vllm:num_requests_running", "kv_usage": "vllm:kv_cache_usage_perc"}
        fig = reader.figures(100.0, 110.0)
    assert fig.source == "prometheus"
    assert fig.preemptions == (4 + 2) - (1 + 2)  # 3
    assert fig.prompt_tokens == (164 + 114) - (100 + 50)  # 128
    # running at t=101: A 2 (B not yet sampled) = 2; 102: 2+1 = 3; 103: 4+1 = 5; 104: 4+3 = 7
    assert fig.peak_running == 7 and fig.scrapes == 4
    assert fig.peak_kv_usage == 0.9  # the fullest replica's, never a sum
    assert [row[1] for row in fig.series] == [2, 3, 5, 7]


def test_a_counter_that_went_down_gives_no_figure():
    """A replica restarted inside the window: its counter fell, so the point's delta is unknown (as from /metrics)."""
    values = {100.0: "5", 110.0: "1"}

    def answer(params):
        if params["query"].endswith("ms]"):
            return ok("matrix", [])
        return ok("vector", [{"metric": {"__name__": "vllm:num_preemptions_total"},
                              "value": [float(params["time"]), values[float(params["time"])]]}])

    with FakePrometheus(answer) as fake:
        reader = _reader(fake)
        reader.names = {"preemptions": "vllm:num_preemptions_total", "running": "vllm:num_requests_running"}
        assert reader.figures(100.0, 110.0).preemptions is None


def test_the_window_waits_for_a_scrape_after_the_point():
    """The end mark is the first sample stamped after Prometheus' clock when the point ended: until then the bench
    polls; past --prometheus-wait it says so."""
    clock = {"now": 1000.0, "stamp": 999.5, "polls": 0}

    def answer(params):
        if params["query"] == "time()":
            return ok("scalar", [clock["now"], repr(clock["now"])])
        clock["polls"] += 1
        if clock["polls"] == 3:  # the third look finds the scrape begun after the point's end
            clock["stamp"] = 1000.25
        return ok("vector", [{"metric": {}, "value": [clock["now"], repr(clock["stamp"])]}])

    with FakePrometheus(answer) as fake:
        reader = _reader(fake)
        reader.names = {"running": "vllm:num_requests_running"}
        assert asyncio.run(reader.mark()) == 1000.25 and clock["polls"] == 3
        assert asyncio.run(reader.mark(reuse=True)) == 1000.25  # the next point starts where this one ended
        clock["now"] = 2000.0
        with pytest.raises(PrometheusError, match="no new sample of every selected engine within 0.3 s"):
            reader.wait_s = 0.3
            asyncio.run(reader.mark())


def _bench(engine: FakeServer, out, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(kvplan_cmd("--url", engine.url, "--sweep", "1", "--requests", "2", "--prompt", "8",
                                     "--output", "4", "--no-warmup", "--scrape-interval", "10", "--out", str(out),
                                     "--json", *args),
                          capture_output=True, text=True, timeout=120, env=bench_env())


def test_prometheus_down_before_a_run_is_one_line(tmp_path):
    with FakeServer(FakeBehaviour()) as engine:
        proc = _bench(engine, tmp_path, "--prometheus", "http://127.0.0.1:9")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: Prometheus does not answer at http://127.0.0.1:9/api/v1/query (check --prometheus (scheme, host, port))"]
    assert not any(tmp_path.iterdir())  # no run folder


@pytest.mark.parametrize(("args", "said"), [
    (("--selector", '{a="b"}'), "--selector and --prometheus-header are for --prometheus"),
    (("--prometheus", "ftp://x:9090"), "invalid --prometheus"),
    (("--prometheus", "http://x:9090/?q=1"), "invalid --prometheus"),
    (("--prometheus", "http://127.0.0.1:9", "--prometheus-header", "no colon"), "invalid --prometheus-header #1"),
    (("--prometheus", "http://127.0.0.1:9", "--prometheus-wait", "0"), "--prometheus-wait"),
])
def test_bad_prometheus_options_are_one_line(tmp_path, args, said):
    from helpers.harness import invoke

    r = invoke("bench", "--url", "http://127.0.0.1:9", "--out", str(tmp_path), *args)
    assert r.code == 2 and said in r.one_line_error(), r.stderr


def test_a_query_refused_during_a_point_fails_the_point_never_a_figure(tmp_path):
    world = FakeEngineWorld(instant=lambda p: (503, b'{"status": "error", "errorType": "unavailable", '
                                                    b'"error": "too many queries"}'))
    with FakeServer(FakeBehaviour()) as engine, FakePrometheus(world) as prom:
        proc = _bench(engine, tmp_path, "--prometheus", prom.url)
    assert proc.returncode == 4, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "the point at concurrency 1 failed: Prometheus: Prometheus refused the query" in line
    assert "unavailable: too many queries" in line
    run = next(tmp_path.iterdir())
    (point,) = [json.loads(line) for line in (run / "points.jsonl").read_text().splitlines()]
    assert point["status"] == "failed" and point["server"] == {}  # no figure Prometheus did not give
    assert point["server_scraped"]["preemptions"] == 0  # the engine's own /metrics, kept beside


def test_each_origin_gets_its_own_credentials_and_no_file_any(tmp_path):
    """The engine's key and header go to the engine only; Prometheus' URL credentials and header to Prometheus only;
    none of them reaches the run folder or the output, and a resume asks for the URL's credentials again."""
    engine_key, engine_header, prom_pass, prom_token = "sk-engine-only-1", "engine-header-2", "prom-pass-3", "prom-tok-4"
    world = FakeEngineWorld({"vllm:num_requests_running": 0.0, "vllm:num_preemptions_total": 7.0})
    with FakeServer(FakeBehaviour(api_key=engine_key)) as engine, FakePrometheus(world) as prom:
        url = prom.url.replace("http://", f"http://reader:{prom_pass}@")
        proc = _bench(engine, tmp_path, "--api-key", engine_key, "--header", f"X-Team: {engine_header}",
                      "--prometheus", url, "--selector", '{job="vllm"}', "--prometheus-header",
                      f"X-Prom-Token: {prom_token}")
        engine_seen = [h for _, h in engine.behaviour.seen]
    assert proc.returncode == 0, proc.stderr
    (point,) = json.loads(proc.stdout)["points"]
    assert point["server"]["preemptions"] == 0 and point["server"]["source"] == "prometheus"  # 7 - 7
    # one gauge sample in the window (this fake's): the point says a short KV wait could hide between scrapes
    assert any(n.startswith("Prometheus scraped the engines 1 time during this point") for n in point["notes"])
    basic = "Basic " + base64.b64encode(f"reader:{prom_pass}".encode()).decode()
    assert prom.seen and all(h.get("Authorization") == basic and h.get("X-Prom-Token") == prom_token
                             and "X-Team" not in h for _, _, h in prom.seen)
    assert engine_seen and not any("X-Prom-Token" in h or basic in h.values() for h in engine_seen)
    summary = json.loads(proc.stdout)
    assert summary["prometheus"]["url"] == prom.url and summary["prometheus"]["headers"] == ["X-Prom-Token: ***"]
    run = next(tmp_path.iterdir())
    assert json.loads((run / "run.json").read_text())["config"]["prometheus"]["credentials"] is True
    for text in [proc.stdout, proc.stderr] + [p.read_text(errors="replace") for p in run.rglob("*") if p.is_file()]:
        for secret in (engine_key, engine_header, prom_pass, prom_token, basic.split()[1]):
            assert secret not in text
    from helpers.harness import invoke

    r = invoke("bench", "--resume", str(run), "--url", "http://127.0.0.1:9", "--header", "X-Team: again")
    assert r.code == 2 and "its --prometheus URL held credentials" in r.one_line_error(), r.stderr
