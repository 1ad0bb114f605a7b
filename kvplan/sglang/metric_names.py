"""The names SGLang's ``/metrics`` (``--enable-metrics``) gives the quantities kvplan reads, as
kvplan/vllm/metric_names.py lists vLLM's: read in srt/metrics/collector.py@0.4.9.post6 and @0.5.6.post2 and
srt/observability/metrics_collector.py@0.5.23 (docs/engines-sglang-rules.md, section 6).

- Running and waiting: gauges ``sglang:num_running_reqs``, ``sglang:num_queue_reqs`` (every release read).
- KV usage: gauge ``sglang:token_usage``, the pool's used share (0-1, as vLLM's ``kv_cache_usage_perc``).
- Preemptions: SGLang retracts requests when decoding runs out of pool; the counter
  ``sglang:num_retracted_requests_total`` counts them (0.5.23; not in 0.5.6, whose gauge ``sglang:num_retracted_reqs``
  holds the last step's count, not a total, so a point cannot be judged by it).
- Tokens: counters ``sglang:prompt_tokens_total``, ``sglang:generation_tokens_total``.
- Histograms: ``sglang:time_to_first_token_seconds``, ``sglang:inter_token_latency_seconds``,
  ``sglang:e2e_request_latency_seconds``, ``sglang:queue_time_seconds``.

The ``sglang:`` prefix never meets vLLM's ``vllm:``, so the bench reads either engine's names (kvplan/bench/metrics.py).
"""

from __future__ import annotations

ALIASES: dict[str, tuple[str, ...]] = {
    "running": ("sglang:num_running_reqs",),
    "waiting": ("sglang:num_queue_reqs",),
    "kv_usage": ("sglang:token_usage",),
    "preemptions": ("sglang:num_retracted_requests_total",),
    "prompt_tokens": ("sglang:prompt_tokens_total",),
    "generation_tokens": ("sglang:generation_tokens_total",),
}
HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "ttft": ("sglang:time_to_first_token_seconds",),
    "itl": ("sglang:inter_token_latency_seconds",),
    "e2e": ("sglang:e2e_request_latency_seconds",),
    "queue": ("sglang:queue_time_seconds",),
}
