"""Time and memory bombs: linear parsing, bounded memory, secrets masked."""

from __future__ import annotations

import time

from helpers.harness import invoke, invoke_capped
from hypothesis import given, settings
from hypothesis import strategies as hs

from kvplan.errors import KvplanError
from kvplan.units import parse_bytes, parse_fraction, parse_tokens
from kvplan.vllm.startup_log import parse_startup_log, redact

BOMB = "\n".join(f"{c}: &{c} [" + ",".join([f"*{p}"] * 9) + "]" for p, c in zip("abcdefgh", "bcdefghi"))
BOMB = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + BOMB + "\n"


def test_yaml_alias_bomb_is_refused_fast(tmp_path):
    spec = tmp_path / "kvplan.yaml"
    spec.write_text(BOMB)
    start = time.perf_counter()
    r = invoke("check", str(spec))
    assert time.perf_counter() - start < 1.0
    assert r.code == 2 and "aliases" in r.one_line_error()


def test_guidellm_yaml_bombs_are_refused_fast_in_bounded_memory(tmp_path):
    """A GuideLLM report saved as YAML (`kvplan report benchmarks.yaml`): an alias bomb, a wide one (many aliases
    to one big node) and a flat list of more nodes than a report may hold; each one error, in seconds, in 1 GB."""
    cases = {
        "bomb": BOMB.replace("a:", "benchmarks:", 1),
        "wide": "big: &b [" + ",".join(["1"] * 5000) + "]\nbenchmarks:\n" + "".join("- *b\n" for _ in range(300)),
        "flat": "benchmarks: [" + "0," * 1_000_001 + "]\n",
    }
    for name, text in cases.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(text)
        start = time.perf_counter()
        r = invoke_capped("report", str(path), timeout=120, memory_mb=1024)
        line = r.one_line_error()
        assert r.code == 2 and "nodes" in line, line
        assert time.perf_counter() - start < 60, name


def test_log_parser_is_linear():
    for text in ("word " * 8000, "w" * 40_000, "x" * 1_000_000, "# GPU blocks: " * 70_000, "9" * 1_000_000):
        start = time.perf_counter()
        parse_startup_log(text)
        assert time.perf_counter() - start < 1.0


def test_huge_log_streams_in_bounded_memory(tmp_path):
    log = tmp_path / "big.log"
    line = b"INFO 01-01 00:00:00 [x.py:1] some ordinary line of a long-running engine\n"
    with open(log, "wb") as fh:
        for _ in range(100):
            fh.write(line * 14_000)  # ~100 MB
        fh.write(b"INFO GPU KV cache size: 1,024 tokens\nMaximum concurrency for 512 tokens per request: 2.00x\n")
    r = invoke_capped("check-log", str(log), "--model", "tests/fixtures/tiny-llama", timeout=60, memory_mb=1200)
    assert "Traceback" not in r.stderr and "MemoryError" not in r.stderr


def test_secrets_are_masked():
    text = ("vllm serve m --api-key sk-live-123 --hf-token=hf_abcdefghijklmnopqrstuvwxyz12 http://bob:pw@h:1/x "
            "non-default args: {'api_key': ['sk-live-123'], 'hf_token': 'hf_abcdefghijklmnopqrstuvwxyz12'}")
    out = redact(text)
    for secret in ("sk-live-123", "hf_abcdefghijklmnopqrstuvwxyz12", "bob:pw"):
        assert secret not in out
    assert "--max-num-batched-tokens 8192" in redact("--max-num-batched-tokens 8192")


def test_run_files_never_hold_secrets(tmp_path):
    from kvplan.bench.store import RunStore

    store = RunStore(tmp_path)
    secrets = ["sk-live-123", "hf_abcdefghijklmnopqrstuvwxyz12", "bob:pw"]
    store.write_run({"config": {"url": "http://bob:pw@h:1", "engine": {"extra_args": ["--api-key", "sk-live-123"]},
                                "hf_token": "hf_abcdefghijklmnopqrstuvwxyz12"}})
    store.append_point({"error": "401 for http://bob:pw@h:1 with --api-key sk-live-123"})
    store.write_text("report.md", "command: vllm serve --hf-token hf_abcdefghijklmnopqrstuvwxyz12\n")
    for file in tmp_path.iterdir():
        body = file.read_text()
        assert not any(s in body for s in secrets), (file, body)


def test_torn_last_line_is_repaired_before_appending(tmp_path):
    from kvplan.bench.store import RunStore

    store = RunStore(tmp_path)
    store.append_point({"seq": 0})
    with open(tmp_path / "points.jsonl", "a") as fh:
        fh.write('{"seq": 1, "tor')
    store.append_point({"seq": 2})
    assert [p["seq"] for p in store.read_points()] == [0, 2]


def test_writers_do_not_follow_planted_symlinks(tmp_path):
    import pytest

    from kvplan.bench.store import RunStore

    victim = tmp_path / "victim"
    victim.write_text("keep")
    run = tmp_path / "run"
    run.mkdir()
    (run / "points.jsonl").symlink_to(victim)
    (run / "summary.json.tmp").symlink_to(victim)
    store = RunStore(run)
    with pytest.raises(KvplanError):
        store.append_point({"seq": 0})
    store.write_text("summary.json", "{}")
    assert victim.read_text() == "keep"


@settings(max_examples=300, deadline=None)
@given(hs.text(max_size=60))
def test_units_parsers_raise_only_kvplan_errors(text):
    for parse in (parse_tokens, parse_bytes, parse_fraction):
        try:
            value = parse(text)
        except KvplanError:
            continue
        assert value == value and value > 0 and value != float("inf")


@settings(max_examples=200, deadline=None)
@given(hs.integers(min_value=1, max_value=2**40))
def test_token_counts_round_trip(n):
    assert parse_tokens(str(n)) == n and parse_tokens(f"{n:,}") == n


def test_a_huge_requests_file_is_streamed_in_bounded_memory(tmp_path):
    """Issue 28, over limits: requests.jsonl grows with every request of a run, and `report --slo` held every
    request it parsed. 80 requests whose error text is 8 MB each (640 MB in all) are judged under a 512 MB
    address-space cap (`report` of such a run peaked at 162 MB resident): one request at a time, only the tallies kept."""
    import shutil

    from helpers.harness import ROOT, invoke_capped

    run = tmp_path / "run"
    shutil.copytree(ROOT / "tests" / "bench" / "data" / "old-run-conc", run)
    error = "x" * (8 * 1024 * 1024)
    line = ('{"index":0,"stream":0,"ok":false,"error":"' + error + '","scheduled_s":0.0,"sent_s":0.01,'
            '"first_token_s":null,"end_s":1.0,"prompt_tokens":8,"output_tokens":0,"max_tokens":6,"chunk_times_s":[],'
            '"concurrency":1,"seq":0}\n')
    with open(run / "requests.jsonl", "w") as f:
        for _ in range(80):
            f.write(line)
    r = invoke_capped("report", str(run), "--slo", "ttft_p99=500ms", "--format", "json", timeout=60,
                      memory_mb=512)
    assert r.code in (0, 1), r.stderr[-2000:]
    assert "Traceback" not in r.stderr
