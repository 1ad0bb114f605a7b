"""`kvplan bench --prometheus` against a real Prometheus server (Debian's package, started here on loopback with a
250 ms scrape interval) scraping the session's real vLLM CPU engine. In the same run the bench also scrapes the
engine's /metrics itself, so each point carries both sets of figures, read over the same window.

The pool is pinned to 16 usable blocks of 32 tokens, and each request holds 64 prompt + 64 output tokens = 4
blocks at its peak. So 4 requests fit at once: 2 streams never wait, and 8 streams (32 blocks asked of 16)
preempt. The counters' expected
values come from the workload (requests x tokens); the same run's scraped figures are the other reference."""

from __future__ import annotations

import json
import subprocess

import pytest
from helpers.bench import bench_env, engine_required, kvplan_cmd
from helpers.prometheus import running_prometheus

pytestmark = [pytest.mark.engine, engine_required]

PROMPT, OUTPUT, PER_STREAM = 64, 64, 3
SELECTOR = '{namespace="kvplan-test"}'
PROM_SECRET = "prom-token-5f1c9a"  # a --prometheus-header value: must reach no file
#: Figures counted by the engine (counters and histograms): Prometheus' must equal the scraper's within 1%.
COUNTED = ("preemptions", "prompt_tokens", "generation_tokens", "prefix_queries", "prefix_hits",
           "server_ttft_count", "server_ttft_mean_s", "server_ttft_p50_s", "server_ttft_p99_s",
           "server_itl_count", "server_itl_mean_s", "server_itl_p50_s", "server_itl_p99_s")


@pytest.fixture(scope="module")
def prometheus(cpu_engine, tmp_path_factory):
    """Prometheus scraping the engine's /metrics every 250 ms, under the label namespace="kvplan-test"."""
    target = cpu_engine.cfg.base_url.split("://", 1)[1]
    with running_prometheus(tmp_path_factory.mktemp("prometheus"), [target], "250ms",
                            labels={"namespace": "kvplan-test"}) as url:
        yield url


def _bench(engine_url: str, out, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(kvplan_cmd("--url", engine_url, "--out", str(out), "--json", "--prompt", str(PROMPT),
                                     "--output", str(OUTPUT), *args),
                          capture_output=True, text=True, timeout=300, env=bench_env())


def _close(a, b) -> bool:
    return a == b or (a is not None and b is not None and abs(a - b) <= 0.01 * max(abs(a), abs(b)))


def test_promql_figures_equal_the_scraped_ones(cpu_engine, prometheus, tmp_path):
    proc = _bench(cpu_engine.cfg.base_url, tmp_path, "--sweep", "2,8", "--requests-per-stream", str(PER_STREAM),
                  "--scrape-interval", "0.05", "--no-warmup", "--prometheus", prometheus, "--selector", SELECTOR,
                  "--prometheus-header", f"X-Prom-Token: {PROM_SECRET}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["prometheus"] == {"url": prometheus, "selector": SELECTOR, "headers": ["X-Prom-Token: ***"],
                                     "engine_metrics": True}
    for point in summary["points"]:
        c, prom, scraped = point["concurrency"], point["server"], point["server_scraped"]
        assert prom["source"] == "prometheus" and "source" not in scraped
        requests = c * PER_STREAM
        # counted by the engine, from the workload: every request's prompt and output tokens, one TTFT each and
        # OUTPUT - 1 inter-token gaps each
        assert (prom["prompt_tokens"], prom["generation_tokens"]) == (requests * PROMPT, requests * OUTPUT), c
        assert (prom["server_ttft_count"], prom["server_itl_count"]) == (requests, requests * (OUTPUT - 1)), c
        for key in COUNTED:
            assert prom.get(key) is not None and _close(prom[key], scraped.get(key)), (c, key, prom.get(key),
                                                                                        scraped.get(key))
        # the gauges are sampled (every 250 ms by Prometheus, every 50 ms by the bench): their peaks can differ
        # by a moment the other missed, but the point's verdicts rest on counters and plateaus both saw
        assert (prom["preemptions"] > 0) == (scraped["preemptions"] > 0) == (c == 8), c
        assert (prom["peak_waiting_capacity"] > 0) == (scraped["peak_waiting_capacity"] > 0) == (c == 8), c
        assert prom["scrapes"] >= 1 and len(prom["series"]) == prom["scrapes"]
    assert summary["measured_first_preemption"] == 8  # the onset, judged on Prometheus' figures
    # the source is recorded without the secret; the header value is in no file of the run
    run = next(tmp_path.iterdir())
    stored = json.loads((run / "run.json").read_text())["config"]["prometheus"]
    assert stored == {"url": prometheus, "selector": 'namespace="kvplan-test"', "header_names": ["X-Prom-Token"],
                      "credentials": False, "wait_s": 60.0}
    assert "Prometheus " + prometheus in (run / "report.md").read_text()
    for path in run.rglob("*"):
        if path.is_file():
            assert PROM_SECRET not in path.read_text(errors="replace"), path
    assert PROM_SECRET not in proc.stdout + proc.stderr


@pytest.mark.parametrize(("selector", "said"), [
    ('{namespace="nope"}', 'has no vLLM or SGLang series matching {namespace="nope"}'),
    # Prometheus' own refusal of a matcher it cannot compile (RE2), said in one line
    ('{namespace=~"("}', "Prometheus refused the query"),
])
def test_a_selector_the_real_server_cannot_serve_is_one_line(cpu_engine, prometheus, tmp_path, selector, said):
    proc = _bench(cpu_engine.cfg.base_url, tmp_path, "--sweep", "1", "--requests", "1", "--no-warmup",
                  "--prometheus", prometheus, "--selector", selector)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
