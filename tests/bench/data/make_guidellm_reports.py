"""Build GuideLLM GenerativeBenchmarksReport JSON files field by field from its pydantic schema
(vllm-project/guidellm src/guidellm/benchmark/schemas/generative/{report,benchmark,metrics}.py,
src/guidellm/benchmark/schemas/base.py, src/guidellm/schemas/statistics.py, scheduler strategies)."""
import json
import sys

PCT = ("p001", "p01", "p05", "p10", "p25", "p50", "p75", "p90", "p95", "p99", "p999")
Q = (0.001, 0.01, 0.05, 0.10, 0.25, 0.50, 0.75, 0.90, 0.95, 0.99, 0.999)

def dist(values, count=None):
    if not values:
        return {"mean": 0.0, "median": 0.0, "mode": 0.0, "variance": 0.0, "std_dev": 0.0, "min": 0.0, "max": 0.0,
                "count": 0 if count is None else count, "total_sum": 0.0, "percentiles": dict.fromkeys(PCT, 0.0),
                "pdf": None}
    v = sorted(values)
    n = len(v)
    mean = sum(v) / n
    var = sum((x - mean) ** 2 for x in v) / n
    # Percentiles.from_pdf: value at the first cumulative probability >= q (uniform weights)
    import math
    pct = {k: v[min(n - 1, max(0, math.ceil(q * n - 1e-9) - 1))] for k, q in zip(PCT, Q)}
    count = n if count is None else count
    r = lambda x: round(x, 6)  # noqa: E731
    return {"mean": r(mean), "median": r(pct["p50"]), "mode": r(v[0]), "variance": r(var), "std_dev": r(var ** 0.5),
            "min": r(v[0]), "max": r(v[-1]), "count": count, "total_sum": r(mean * count),
            "percentiles": {k: r(x) for k, x in pct.items()}, "pdf": None}

def status(values, count=None, errored=()):
    ok = dist(values, count)
    return {"successful": ok, "incomplete": dist([]), "errored": dist(list(errored)),
            "total": dist(list(values) + list(errored))}

def spread(center, n, width):
    return [round(center * (1 - width + 2 * width * i / max(1, n - 1)), 4) for i in range(n)]

def benchmark(index, strategy, n, ttft_ms, itl_ms, out_tokens, prompt_tokens, start, model):
    ttft = spread(ttft_ms, n, 0.4)
    itl = spread(itl_ms, n, 0.2)
    e2e = [round((t + i * (out_tokens - 1)) / 1000, 5) for t, i in zip(ttft, itl)]
    tpot = [round(e * 1000 / out_tokens, 4) for e in e2e]
    duration = 30.0
    rps = n / duration
    empty = status([])
    summary = {"input": empty, "input_per_second": None, "input_concurrency": None, "output": empty,
               "output_per_second": None, "output_concurrency": None, "total": empty, "total_per_second": None,
               "total_concurrency": None}
    return {
        "type_": "generative_benchmark",
        "config": {
            "id_": f"00000000-0000-4000-8000-00000000000{index}", "run_id": "11111111-2222-4333-8444-555555555555",
            "run_index": index, "strategy": strategy, "constraints": {"max_seconds": {"max_duration": duration}},
            "sample_requests": 20, "warmup": {"percent": None, "value": None, "mode": "prefer_duration"},
            "cooldown": {"percent": None, "value": None, "mode": "prefer_duration"}, "prefer_response_metrics": True,
            "profile": {"type_": "sweep"}, "requests": {"data": [f"prompt_tokens={prompt_tokens},output_tokens={out_tokens}"]},
            "backend": {"type_": "openai_http", "target": "http://localhost:8000", "model": model},
            "environment": {"platform": "linux"},
        },
        "scheduler_state": {"node_id": 0, "num_processes": 1, "start_time": start - 1.0, "end_time": start + duration + 1.0,
                            "created_requests": n, "queued_requests": 0, "pending_requests": 0, "processing_requests": 0,
                            "processed_requests": n, "successful_requests": n, "errored_requests": 0,
                            "cancelled_requests": 0},
        "scheduler_metrics": {
            "start_time": start - 1.0, "request_start_time": start, "measure_start_time": start,
            "measure_end_time": start + duration, "request_end_time": start + duration, "end_time": start + duration + 1.0,
            "requests_made": {"successful": n, "incomplete": 0, "errored": 0, "total": n},
            "queued_time_avg": 0.0002, "resolve_start_delay_avg": 0.0001, "resolve_targeted_start_delay_avg": 0.0003,
            "request_start_delay_avg": 0.0001, "request_targeted_start_delay_avg": 0.0004,
            "request_time_avg": sum(e2e) / n, "resolve_end_delay_avg": 0.0001, "resolve_time_avg": sum(e2e) / n,
            "finalized_delay_avg": 0.0001, "processed_delay_avg": 0.0001,
        },
        "metrics": {
            "request_totals": {"successful": n, "incomplete": 0, "errored": 0, "total": n},
            "requests_per_second": status([rps] * n),
            "request_concurrency": status([min(n, strategy.get("streams", 1) or 1)] * n),
            "request_latency": status(e2e),
            "request_streaming_iterations_count": status([out_tokens] * n),
            "prompt_token_count": status([prompt_tokens] * n),
            "output_token_count": status([out_tokens] * n),
            "total_token_count": status([prompt_tokens + out_tokens] * n),
            "time_to_first_token_ms": status(ttft),
            "time_to_first_output_token_ms": status(ttft),
            "time_per_output_token_ms": status(tpot, count=n * out_tokens),
            "inter_token_latency_ms": status(itl, count=n * (out_tokens - 1)),
            "prompt_tokens_per_second": status([rps * prompt_tokens] * n),
            "output_tokens_per_second": status([rps * out_tokens] * n),
            "tokens_per_second": status([rps * (prompt_tokens + out_tokens)] * n),
            "output_tokens_per_iteration": status([1.0] * n),
            "iter_tokens_per_iteration": status([1.0] * n),
            "text": {"tokens": summary, "words": summary, "characters": summary},
            "image": {"tokens": None, "images": None, "pixels": None, "bytes": None},
            "video": {"tokens": None, "frames": None, "seconds": None, "bytes": None},
            "audio": {"tokens": None, "samples": None, "seconds": None, "bytes": None},
            "tool_call": {"tokens": None, "mixed_tokens": None, "count": None},
        },
        "requests": {"successful": [], "incomplete": [], "errored": [], "total": None},
        "start_time": start, "end_time": start + duration, "duration": duration, "warmup_duration": 0.0,
        "cooldown_duration": 0.0,
    }

def report(benchmarks, model, profile):
    return {"args": {"target": "http://localhost:8000", "model": model, "profile": profile,
                     "data": ["prompt_tokens=256,output_tokens=128"], "backend": "openai_http",
                     "output_path": "benchmarks.json"},
            "benchmarks": benchmarks}

M = "meta-llama/Llama-3.1-8B-Instruct"
T = 1_733_000_000.0


def write(name: str, data: dict) -> None:
    with open(f"{sys.argv[1]}/{name}", "w") as fh:
        json.dump(data, fh, separators=(",", ":"))


if __name__ == "__main__":  # python make_guidellm_reports.py tests/bench/data
    conc = [benchmark(i, {"type_": "concurrent", "streams": s}, n, ttft, itl, 128, 256, T + 40 * i, M)
            for i, (s, n, ttft, itl) in enumerate(((4, 120, 85.0, 12.0), (16, 240, 240.0, 21.0), (64, 400, 900.0, 38.0)))]
    write("guidellm-concurrent.json", report(conc, M, "concurrent"))
    sweep = [benchmark(0, {"type_": "synchronous"}, 30, 60.0, 10.0, 128, 256, T, M),
             benchmark(1, {"type_": "throughput", "max_concurrency": None}, 500, 1500.0, 45.0, 128, 256, T + 40, M),
             benchmark(2, {"type_": "constant", "rate": 2.5, "initial_burst": True}, 75, 70.0, 11.0, 128, 256, T + 80, M),
             benchmark(3, {"type_": "poisson", "rate": 5.0, "initial_burst": True, "random_seed": 42}, 150, 130.0, 16.0,
                       128, 256, T + 120, M)]
    write("guidellm-sweep.json", report(sweep, M, "sweep"))
