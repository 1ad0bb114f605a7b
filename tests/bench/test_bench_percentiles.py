"""`kvplan bench --percentiles 50,90,99,99.9` (issue 27): chosen percentiles of every latency beside the fixed ones,
in the JSON and report.md; bad values are one line."""

from __future__ import annotations

import json
import subprocess

from helpers.bench import bench_env, kvplan_cmd
from helpers.fake_server import FakeBehaviour, FakeServer
from helpers.harness import invoke

from kvplan.bench.results import LatencyStats


def test_chosen_percentiles_by_hand():
    values = [i / 1000 for i in range(1, 1001)]  # 1..1000 ms
    s = LatencyStats.of(values, [99.9, 75])
    # numpy's linear rule: p99.9 of 1..1000 is at rank 0.999 x 999 = 998.001 -> 999.001 ms; p75 at 749.25 -> 750.25 ms
    assert set(s.chosen) == {"p99.9", "p75"}
    assert abs(s.chosen["p99.9"] - 0.999001) < 1e-12 and abs(s.chosen["p75"] - 0.75025) < 1e-12
    assert s.p99 is not None and LatencyStats.of(values).chosen is None


def test_a_run_carries_them(tmp_path):
    with FakeServer(FakeBehaviour(tokens=8, token_gap_s=0.002)) as srv:
        proc = subprocess.run(kvplan_cmd("--url", srv.url, "--sweep", "1", "--requests", "4", "--prompt", "8",
                                         "--output", "8", "--no-warmup", "--percentiles", "99.9,75", "--out",
                                         str(tmp_path), "--json"),
                              capture_output=True, text=True, timeout=120, env=bench_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    (point,) = json.loads(proc.stdout)["points"]
    for metric in ("ttft", "itl", "e2e"):
        chosen = point[metric]["chosen"]
        assert set(chosen) == {"p75", "p99.9"} and chosen["p75"] <= chosen["p99.9"], metric
    run = next(tmp_path.iterdir())
    assert json.loads((run / "run.json").read_text())["config"]["percentiles"] == [75.0, 99.9]
    report = (run / "report.md").read_text()
    assert "## Chosen percentiles (--percentiles)" in report and "TTFT p99.9 ms" in report


def test_bad_percentiles_are_one_line():
    for text in ("0", "100", "50,abc", "-1", ",", ",".join(["50"] * 9), "nan"):
        r = invoke("bench", "--url", "http://127.0.0.1:9", "--percentiles", text)
        assert r.code == 2 and "--percentiles" in r.one_line_error(), (text, r.stderr)
