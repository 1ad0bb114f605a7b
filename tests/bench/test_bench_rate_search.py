"""`--sweep-rate auto`: the search for the highest request rate meeting the SLOs. The search itself is
a pure function (kvplan.bench.sweep.search_rate), tested with a fake measure of known threshold;
then once through the CLI against the fake server. The end-to-end run on the real CPU engine is in
test_bench_rate_search_engine.py."""

from __future__ import annotations

import json
import subprocess

import pytest
from helpers.bench import bench_env, kvplan_cmd
from helpers.fake_server import FakeBehaviour, FakeServer

from kvplan.bench.sweep import parse_sweep_rate, search_rate
from kvplan.errors import KvplanError


def _threshold(limit: float):
    calls: list[float] = []

    def meets(rate: float) -> bool:
        calls.append(rate)
        return rate <= limit

    return meets, calls


@pytest.mark.parametrize("limit", [0.013, 0.3, 1.0, 1.05, 2.9, 7.0, 12.5, 100.0, 333.0])
@pytest.mark.parametrize("start", [1.0, 4.0])
def test_search_brackets_the_threshold_within_the_resolution(limit, start):
    meets, calls = _threshold(limit)
    found = search_rate(meets, start=start, resolution=0.1, max_points=30)
    assert found.resolved and found.stopped == "resolved"
    assert found.highest_met <= limit < found.first_missed  # the true threshold is inside the bracket
    assert (found.first_missed - found.highest_met) / found.highest_met <= 0.1
    assert len(calls) == len(set(calls)) == len(found.measured)  # no rate measured twice
    assert all(met == (rate <= limit) for rate, met in found.measured)


def test_search_costs_few_points_and_reads_well():
    meets, calls = _threshold(12.5)
    found = search_rate(meets, start=1.0, resolution=0.1)
    # 1, 2, 4, 8, 16 (missed), then bisection of [8, 16]: 12, 14, 13, then [12, 13] is within 10%
    assert calls == [1.0, 2.0, 4.0, 8.0, 16.0, 12.0, 14.0, 13.0]
    assert (found.highest_met, found.first_missed) == (12.0, 13.0)
    meets, calls = _threshold(0.3)
    found = search_rate(meets, start=1.0, resolution=0.1)
    assert calls[:3] == [1.0, 0.5, 0.25]  # halving until one holds
    assert all(len(f"{r:g}") <= 6 for r in calls)  # four significant digits, not 0.28125000001


def test_search_stops_at_max_points_with_the_best_bracket_so_far():
    meets, calls = _threshold(1000.0)
    found = search_rate(meets, start=1.0, resolution=0.1, max_points=4)
    assert calls == [1.0, 2.0, 4.0, 8.0] and found.stopped == "max points" and not found.resolved
    assert (found.highest_met, found.first_missed) == (8.0, None)
    meets, calls = _threshold(5.0)
    found = search_rate(meets, start=1.0, resolution=0.01, max_points=6)
    assert len(calls) == 6 and found.stopped == "max points"
    assert found.highest_met <= 5.0 < found.first_missed


def test_search_reports_ceiling_and_floor():
    found = search_rate(lambda r: True, start=1.0, ceiling=10.0)
    assert found.stopped == "met up to the ceiling" and (found.highest_met, found.first_missed) == (8.0, None)
    found = search_rate(lambda r: False, start=1.0, floor=0.1)
    assert found.stopped == "missed down to the floor"
    assert (found.highest_met, found.first_missed) == (None, 0.125)


def test_known_points_are_not_measured_again():
    meets, calls = _threshold(12.5)
    first = search_rate(meets, start=1.0)
    known = dict(first.measured[:5])  # as if resumed after five points
    meets2, calls2 = _threshold(12.5)
    again = search_rate(meets2, start=1.0, known=known)
    assert calls2 == calls[5:]
    assert again.measured == first.measured


def test_a_failing_measure_ends_the_search():
    def meets(rate: float) -> bool:
        if rate > 3:
            raise RuntimeError("point failed")
        return True

    with pytest.raises(RuntimeError):
        search_rate(meets, start=1.0)


def test_bad_settings_and_parsing():
    for kw in ({"start": 0}, {"resolution": 0}, {"resolution": 1.5}, {"max_points": 0}):
        with pytest.raises(KvplanError):
            search_rate(lambda r: True, **kw)
    assert parse_sweep_rate(" Auto ") == "auto" and parse_sweep_rate("4,1,2,2") == [1.0, 2.0, 4.0]
    for bad in ("fast", "1,-2", "nan", ""):
        with pytest.raises(KvplanError):
            parse_sweep_rate(bad)


def _cli(args, timeout=180):
    try:
        return subprocess.run(kvplan_cmd(*args), capture_output=True, text=True, timeout=timeout, env=bench_env())
    except subprocess.TimeoutExpired as e:  # say which points it had measured, from its progress lines
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        pytest.fail(f"kvplan bench ran past {timeout} s; its stderr ended:\n{err[-3000:]}")


def test_cli_refuses_auto_without_slo_and_stray_settings(tmp_path):
    no_slo = _cli(["--url", "http://127.0.0.1:9", "--sweep-rate", "auto", "--out", str(tmp_path)])
    assert no_slo.returncode == 2 and "--slo" in no_slo.stderr and "Traceback" not in no_slo.stderr
    stray = _cli(["--url", "http://127.0.0.1:9", "--sweep-rate", "1,2", "--rate-points", "3", "--out", str(tmp_path)])
    assert stray.returncode == 2 and "--rate-points is for --sweep-rate auto" in stray.stderr
    bad = _cli(["--url", "http://127.0.0.1:9", "--sweep-rate", "auto", "--slo", "e2e_p99=1s", "--rate-resolution",
                "150%", "--out", str(tmp_path)])
    assert bad.returncode == 2 and "--rate-resolution" in bad.stderr


def test_cli_search_against_the_fake_server(tmp_path):
    # One request in flight at a time, each ~105 ms: above ~9 requests/s the queue grows, and the TTFT
    # counted from each request's scheduled time with it (measured p99: ~0.9-1.0 s at 16/s, 1.2 s at 32/s).
    # At 4-8/s the drawn arrivals' bunches give a TTFT p99 of 0.3-0.35 s, 0.65 s inside the SLO: a stalled
    # machine must not make the start rate miss, as each halving from there doubles a point's length
    # (16 requests at 1/s: 16 s). With 50 ms requests, start 2/s and a 250 ms SLO, that margin was ~0.1 s,
    # and two CI runs of 2026-12-06 ran past the timeout.
    with FakeServer(FakeBehaviour(tokens=3, first_token_delay_s=0.1, token_gap_s=0.002)) as srv:
        proc = _cli(["--url", srv.url, "--sweep-rate", "auto", "--rate-start", "4", "--rate-resolution", "25%",
                     "--rate-points", "8", "--max-concurrency", "1", "--requests", "16", "--prompt", "8",
                     "--output", "3", "--slo", "ttft_p99=1s", "--no-warmup", "--out", str(tmp_path), "--json"])
    assert proc.returncode == 0, proc.stderr
    s = json.loads(proc.stdout)
    search = s["rate_search"]
    assert s["load_mode"] == "rate" and "searched for the highest" in s["load_description"]
    assert search["points"] == len(s["points"]) <= 8
    assert search["highest_meeting_slo"] is not None and search["first_missing_slo"] is not None
    assert search["highest_meeting_slo"] < search["first_missing_slo"]
    assert s["highest_load_meeting_slo"] == search["highest_meeting_slo"]
    by_rate = {p["rate"]: p for p in s["points"]}
    assert by_rate[search["highest_meeting_slo"]]["slo_met"] is True
    assert by_rate[search["first_missing_slo"]]["slo_met"] is False
    assert 4.0 in by_rate  # started where asked
    # --json with stderr not a terminal (a CI log): a plain line as each point ends, the start rate's first
    lines = proc.stderr.splitlines()
    assert lines[0].startswith("rate 4/s: 16 of 16 requests in ") and "TTFT p99 " in lines[0], proc.stderr
    assert sorted(float(line.split("/s:")[0].removeprefix("rate ")) for line in lines) == sorted(by_rate)
    report = (next(tmp_path.iterdir()) / "report.md").read_text()
    assert "Automatic rate search: highest rate meeting the SLOs: " in report
    assert f"first rate missing them: {search['first_missing_slo']:g} requests/s" in report
    html = (next(tmp_path.iterdir()) / "report.html").read_text()
    assert "Automatic rate search: highest rate meeting the SLOs: " in html
