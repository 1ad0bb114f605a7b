"""`kvplan bench --prompt-sweep`: its lengths and requests, its round trip through the run folder
(RUN/prompt_sweep.json, typed at the JSON edge), `kvplan calibrate --bench` fitting it and reporting the price of a
prompt token, the note of a prediction outside the prompts the calibration saw, and bad input. No engine: the
records are what the client would have measured, built by hand."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers.harness import invoke

from kvplan.bench.latency import predict_run
from kvplan.bench.loadgen import RequestRecord
from kvplan.bench.outputs.text import latency_model_text
from kvplan.bench.prompt_sweep import (
    PROMPT_SWEEP_FILE,
    PromptSweep,
    SweepRequest,
    parse_prompt_sweep,
    read_prompt_sweep,
    sweep_from_records,
    sweep_lengths,
    sweep_specs,
    write_prompt_sweep,
)
from kvplan.bench.store import RunStore
from kvplan.errors import KvplanError

OLD_RUN = Path(__file__).resolve().parent / "data" / "old-run-conc"  # a CPU run: 8-token prompts at 1 and 4 streams
MODEL = "meta-llama/Llama-3.1-8B-Instruct"  # read offline from the bundled profiles (the run served a tiny model)


def test_the_sweep_spec_and_its_lengths():
    assert parse_prompt_sweep("16", 512) == (16, 510)  # the longest prompt leaves room for the two output tokens
    assert parse_prompt_sweep("4:100", None) == (4, 100)
    assert sweep_lengths(16, 512) == list(range(32, 513, 32))
    assert sweep_lengths(3, 10) == [3, 7, 10]
    for text, max_model_len in (("1", 512), ("x", 512), ("16", None), ("16:511", 512), ("16:8", 512), ("300:4000", None)):
        with pytest.raises(KvplanError):
            parse_prompt_sweep(text, max_model_len)


def test_each_length_goes_twice_with_prompts_of_its_own():
    specs = sweep_specs([3, 7], "nonce", (10, 1000), first_index=40)
    assert [(s.index, s.prompt_tokens, s.max_tokens) for s in specs] == [(40, 3, 2), (41, 3, 2), (42, 7, 2), (43, 7, 2)]
    assert all(len(s.prompt_token_ids) == s.prompt_tokens for s in specs)
    assert len({s.prompt_token_ids for s in specs}) == 4  # no prefix-cache hit between them


def _records(specs, ttft_ms, step_ms=lambda n: 8.0) -> list[RequestRecord]:
    """What the client records: request k scheduled at k s, its first token ``ttft_ms(n)`` later (the first of each
    pair, the cold one, 5 ms slower), its second ``step_ms(n)`` after that."""
    out = []
    for k, s in enumerate(specs):
        ttft = (ttft_ms(s.prompt_tokens) + (5.0 if k % 2 == 0 else 0.0)) / 1000
        second = k + ttft + step_ms(s.prompt_tokens) / 1000
        out.append(RequestRecord(index=s.index, stream=0, scheduled_s=float(k), first_token_s=k + ttft,
                                 end_s=second, chunk_times_s=[k + ttft, second], prompt_tokens=s.prompt_tokens,
                                 output_tokens=2, max_tokens=2, ok=True))
    return out


def test_the_sweep_records_each_requests_decode_step():
    """The gap from the first token to the second: one decode step of one sequence over the prompt (8 ms + 4 us a
    token here); a request whose two tokens came in one delivery has none."""
    specs = sweep_specs([100, 300], "n", (10, 1000), 0)
    records = _records(specs, lambda n: 20.0, lambda n: 8.0 + 0.004 * n)
    records[3].chunk_times_s = records[3].chunk_times_s[:1]
    records[3].chunk_tokens = [2]
    sweep = sweep_from_records([100, 300], specs, records)
    assert [(r.prompt_tokens, r.itl_s) for r in sweep.requests] == [(100, pytest.approx(0.0084)), (300, None)]
    assert sweep.decode_steps() == [(100, pytest.approx(0.0084))]
    old = PromptSweep.model_validate({"max_tokens": 2, "lengths": [100], "requests": [{"prompt_tokens": 100,
                                                                                         "ttft_s": 0.02}]})
    assert old.decode_steps() == [] and old.points() == [(100, 0.02)]  # a sweep recorded before the decode steps


def _with_sweep(tmp_path: Path, name: str = "run") -> tuple[Path, PromptSweep]:
    """The old run, and a 16-length sweep of 32-512 tokens at 20 ms + 0.12 ms a token (the CPU engine's regime)
    with +-1 ms of scatter, written to its folder."""
    run = tmp_path / name
    shutil.copytree(OLD_RUN, run)
    lengths = sweep_lengths(16, 512)
    specs = sweep_specs(lengths, "n", (10, 1000), 100)
    scatter = {n: (1.0 if i % 3 == 0 else -1.0 if i % 3 == 1 else 0.0) for i, n in enumerate(lengths)}
    sweep = sweep_from_records(lengths, specs, _records(specs, lambda n: 20.0 + 0.12 * n + scatter[n]))
    write_prompt_sweep(RunStore.open_existing(run), sweep)
    return run, sweep


def test_the_sweep_round_trips_through_the_run_folder(tmp_path):
    run, sweep = _with_sweep(tmp_path)
    assert [r.prompt_tokens for r in sweep.requests] == list(range(32, 513, 32))  # the second of each pair
    assert sweep.requests[0].ttft_s == pytest.approx((20.0 + 0.12 * 32 + 1.0) / 1000)  # not the cold 5 ms more
    assert read_prompt_sweep(run) == sweep
    assert read_prompt_sweep(OLD_RUN) is None  # a run without one


def test_calibrate_fits_the_sweep_and_prices_a_prompt_token(tmp_path):
    """The old run alone shows one prompt length (8 tokens): nothing to price a token with. With the sweep, the
    calibration saw 8-512 tokens and the data price a token at 0.12 ms (Theil-Sen over the 16 sweep requests and
    the run's 8 requests at one stream, 21.8 ms median at 8 tokens against the sweep's line's 20.96; Sen's interval
    holds it); --json carries both, the text says it in one line."""
    alone = tmp_path / "alone"
    shutil.copytree(OLD_RUN, alone)
    r = invoke("calibrate", "--bench", str(alone), "--model", MODEL, "--json")
    assert r.code == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["prompt_tokens_seen"] == [8, 8] and data["prompt_token_price"] is None
    assert data["prompt_sweep_requests"] == 0

    run, _ = _with_sweep(tmp_path)
    data = json.loads(invoke("calibrate", "--bench", str(run), "--model", MODEL, "--json").stdout)
    assert data["prompt_tokens_seen"] == [8, 512] and data["prompt_sweep_requests"] == 16
    price = data["prompt_token_price"]
    assert (price["requests"], price["prompt_min"], price["prompt_max"]) == (24, 8, 512)  # + the 8 of 1 stream
    assert price["data_ms_per_token"] == pytest.approx(0.12, abs=0.005)
    assert price["data_low_ms_per_token"] <= 0.12 <= price["data_high_ms_per_token"]
    stored = json.loads((run / "steptime.json").read_text())
    assert stored["prompt_tokens_seen"] == [8, 512] and stored["prompt_token_price"] == price
    text = invoke("calibrate", "--bench", str(run), "--model", MODEL).stdout
    assert "a prompt token: prompts of 8-512 tokens (16 from the prompt sweep)" in text and "95%" in text


def test_a_prediction_outside_the_calibrated_prompts_gets_one_note(tmp_path):
    """Calibrated on 8-512 tokens; the same run predicted again is inside (no note); a run of 1000-token prompts
    (its run.json says so) is outside: kvplan report --steptime's latency model says so in one line."""
    run, _ = _with_sweep(tmp_path)
    assert invoke("calibrate", "--bench", str(run), "--model", MODEL).code == 0
    doc = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps(dict(doc, model=MODEL)))
    assert predict_run(run, steptime=run).latency_model.note is None
    longer = tmp_path / "longer"
    shutil.copytree(run, longer)
    doc["config"]["workload"]["prompt_tokens"] = 1000
    (longer / "run.json").write_text(json.dumps(dict(doc, model=MODEL)))
    summary = predict_run(longer, steptime=run)
    note = summary.latency_model.note
    assert note is not None and "1000 tokens" in note and "8-512" in note and "\n" not in note
    assert f"Note: {note}." in latency_model_text(summary)  # the terminal, Markdown and HTML say it too


@pytest.mark.parametrize("content", ['{"max_tokens": 1, "lengths": [32], "requests": [{"prompt_tokens": 32, '
                                     '"ttft_s": -1}]}', "[1, 2", '{"max_tokens": 1, "lengths": [], "requests": [], '
                                     '"extra": 1}'])
def test_a_bad_sweep_file_is_one_line(tmp_path, content):
    run = tmp_path / "run"
    shutil.copytree(OLD_RUN, run)
    (run / PROMPT_SWEEP_FILE).write_text(content)
    r = invoke("calibrate", "--bench", str(run), "--model", MODEL)
    assert r.code == 2 and PROMPT_SWEEP_FILE in r.one_line_error()
    assert not (run / "steptime.json").exists()


def test_bench_refuses_a_bad_sweep_before_anything_starts(tmp_path):
    """Attached (no --max-model-len known): COUNT alone cannot be spread; nothing is contacted or written."""
    r = invoke("bench", "--url", "http://127.0.0.1:9", "--prompt-sweep", "16", "--out", str(tmp_path / "runs"))
    assert r.code == 2 and "--prompt-sweep" in r.one_line_error()
    assert not (tmp_path / "runs").exists()
    assert SweepRequest(prompt_tokens=1, ttft_s=0.5).ttft_s == 0.5


def test_bench_records_the_sweep_against_a_server(tmp_path):
    """`kvplan bench --prompt-sweep 4:64` against a local stand-in server (the engine's timing is not what is tested
    here): four lengths of 16-64 tokens, each sent twice with prompts of its length, two output tokens; the second
    of each recorded in RUN/prompt_sweep.json with the gap to its second token, before the point's requests."""
    from helpers.fake_server import FakeBehaviour, FakeServer

    with FakeServer(FakeBehaviour(tokens=2, first_token_delay_s=0.002, token_gap_s=0.02)) as srv:
        r = invoke("bench", "--url", srv.url, "--sweep", "1", "--requests", "2", "--prompt", "8", "--output", "2",
                   "--no-warmup", "--prompt-sweep", "4:64", "--out", str(tmp_path / "out"), "--json")
        bodies = list(srv.behaviour.bodies)
    assert r.code == 0, r.stderr[-2000:]
    run = Path(json.loads(r.stdout)["run_dir"])
    sweep = read_prompt_sweep(run)
    assert [q.prompt_tokens for q in sweep.requests] == [16, 32, 48, 64] and sweep.lengths == [16, 32, 48, 64]
    assert all(q.ttft_s >= 0.002 for q in sweep.requests)
    # The server sleeps 0.02 s between the two tokens, but the client can read the first one late and the gap it sees
    # is then shorter (a `.ci/run` of 2026-12-07: TTFT 5.9 ms, gap 18.3 ms): the second token comes >= 0.002 + 0.02 s
    # after the request is sent, whenever the first is read.
    assert all(0 < q.itl_s < 1 and q.ttft_s + q.itl_s >= 0.022 for q in sweep.requests)
    sent = [(len(b["prompt"]), b["max_tokens"]) for b in bodies if isinstance(b, dict) and "prompt" in b]
    assert sent[:8] == [(16, 2), (16, 2), (32, 2), (32, 2), (48, 2), (48, 2), (64, 2), (64, 2)]
    assert sent[8:] == [(8, 2), (8, 2)]
    assert json.loads((run / "run.json").read_text())["config"]["prompt_sweep"] == "4:64"


def test_calibrate_holds_the_request_overhead_at_the_engines_own_split(tmp_path):
    """The old run's 1-stream point given vLLM's queue and prefill means (0.1 ms and 20.0 ms): its 8 requests all have
    8-token prompts (no line to draw), so the time outside the steps is their mean TTFT less both, 24.174 - 0.1 -
    20.0 = 4.074 ms, at the point's 19.79 requests/s. The fitted overhead's line goes through it, --json and
    steptime.json say so, the text in one line; a run without the split says null."""
    run = tmp_path / "split"
    shutil.copytree(OLD_RUN, run)
    points = [json.loads(line) for line in (run / "points.jsonl").read_text().splitlines()]
    points[0]["server"].update(server_queue_mean_s=0.0001, server_prefill_mean_s=0.020)
    (run / "points.jsonl").write_text("".join(json.dumps(p) + "\n" for p in points))
    r = invoke("calibrate", "--bench", str(run), "--model", MODEL, "--json")
    assert r.code == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["request_overhead_held_ms"] == pytest.approx(4.074, abs=0.001)
    assert data["request_overhead_held_at_rps"] == pytest.approx(19.787, abs=0.001)
    model = data["steptime"]
    at_rate = model["request_overhead_s"] + model["request_overhead_per_rps_s2"] * 19.7867
    assert at_rate == pytest.approx(0.004074, abs=1e-6)
    assert json.loads((run / "steptime.json").read_text())["request_overhead_held_ms"] == data["request_overhead_held_ms"]
    text = invoke("calibrate", "--bench", str(run), "--model", MODEL).stdout
    assert "vLLM's own split of the 1-stream TTFT" in text and "4.07 ms outside the steps at 19.79 requests/s" in text
    alone = tmp_path / "alone"
    shutil.copytree(OLD_RUN, alone)
    assert json.loads(invoke("calibrate", "--bench", str(alone), "--model", MODEL, "--json").stdout)[
        "request_overhead_held_ms"] is None
