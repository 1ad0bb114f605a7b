"""Issue 28, over limits: every bench load option is bounded where the configuration is built, so the
command line and a resumed run.json are refused alike, in one line and exit 2, before any server is
contacted or memory is held (kvplan.bench.limits)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers.harness import invoke

from kvplan.plan.simulate import MAX_DRAWN_TOKENS, draw_lengths

OLD_RUN = Path(__file__).resolve().parents[1] / "bench" / "data" / "old-run-conc"
NOWHERE = "http://127.0.0.1:9"  # discard port: nothing answers, and nothing must be asked


@pytest.mark.parametrize("args, flag", [
    (["--sweep", "10000000"], "--sweep"),
    (["--sweep", ",".join(str(i) for i in range(1, 1100))], "--sweep"),
    (["--rate", "1e-300"], "--rate"),
    (["--rate", "1e6", "--duration", "5s"], "--rate"),
    (["--rate", "1000", "--duration", "2000s"], "--rate"),
    (["--rate", "1", "--burstiness", "1e-300"], "--burstiness"),
    (["--prompt", str(2**40)], "--prompt"),
    (["--output", str(2**40)], "--output"),
    (["--requests", "100000000"], "--requests"),
    (["--sweep", "1000", "--requests-per-stream", "100000"], "--requests-per-stream"),
])
def test_bench_refuses_a_load_option_out_of_bounds(tmp_path, args, flag):
    r = invoke("bench", "--url", NOWHERE, "--out", str(tmp_path / "runs"), *args)
    assert r.code == 2, (r.code, r.stderr[-2000:])
    line = r.one_line_error()
    assert line.startswith(f"error: invalid {flag}"), line
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # refused before a run folder


@pytest.mark.parametrize("field, value", [("sweep", [1, 10**7]), ("rates", [1e-300]), ("burstiness", 1e-300),
                                          ("requests", 10**9)])
def test_resume_refuses_the_same_values_from_run_json(tmp_path, field, value):
    run = tmp_path / "run"
    shutil.copytree(OLD_RUN, run)
    (run / "summary.json").unlink()
    doc = json.loads((run / "run.json").read_text())
    doc["config"][field] = value
    (run / "run.json").write_text(json.dumps(doc))
    r = invoke("bench", "--resume", str(run), "--url", NOWHERE)
    assert r.code == 2, (r.code, r.stderr[-2000:])
    assert "invalid" in r.one_line_error()


def test_a_wide_lognormal_draws_at_most_the_longest_request():
    # sigma 100: exp(N(log 512, 100)) overflows a float or reaches 10^40 tokens; the draw stops at the cap
    draws = [draw_lengths(i, 512, 128, "lognormal", 100.0) for i in range(200)]
    assert all(1 <= p <= MAX_DRAWN_TOKENS and 1 <= o <= MAX_DRAWN_TOKENS for p, o in draws)
    assert max(p for p, _ in draws) == MAX_DRAWN_TOKENS  # some draws did hit the cap: the test is not idle
