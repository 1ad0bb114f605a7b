"""TensorRT-LLM behind the engine door: what kvplan can and cannot size of it yet.

Its page math (kvplan/trtllm/pool.py: the bytes a token, blocks of 32 rounded up) is built and judged against public
start-ups by `kvplan check-log` and `kvplan validate --engine trtllm`. Its budget from a GPU is not: TensorRT-LLM
gives ``free_gpu_memory_fraction`` of what a profiling run leaves (device total - profiled peak + the estimation
pool, `_torch/pyexecutor/_util.py@b35ac1b` `_cal_max_memory`), and kvplan has no model of that peak (the weights as
loaded, a ``max_num_tokens`` dummy prefill's activations, CUDA graphs). So `kvplan size --engine trtllm` says so in
one line, with the bytes a token it would page by, rather than print a pool it cannot stand behind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvplan.deploy import ResolvedModel
from kvplan.engines.base import EngineCapacity, EngineOptions, EnginePool, engine
from kvplan.errors import KvplanError
from kvplan.hardware.catalog import GpuSelection
from kvplan.plan.schema import Settings
from kvplan.trtllm.pool import cell_of
from kvplan.trtllm.rules import READ_RELEASES, parse_version
from kvplan.trtllm.startup_log import parse_trtllm_log


@engine
class Trtllm:
    name = "trtllm"
    label = "TensorRT-LLM"
    known_versions = READ_RELEASES
    newest_known = READ_RELEASES[-1]

    def size(self, model: ResolvedModel, gpus: GpuSelection, settings: Settings, version: str | None,
             options: EngineOptions = EngineOptions()) -> EnginePool:
        if options.given():
            raise KvplanError(f"{', '.join(options.given())} is not a TensorRT-LLM flag",
                              "TensorRT-LLM's are kv_cache_config.free_gpu_memory_fraction and tokens_per_block")
        if version is not None:
            parse_version(version)  # a malformed release is its own error
        cell = cell_of(model.arch, settings.tensor_parallel_size,
                       None if settings.kv_cache_dtype == "auto" else settings.kv_cache_dtype)
        raise KvplanError(
            "kvplan does not size TensorRT-LLM's pool from a GPU yet: its budget is free_gpu_memory_fraction x (device "
            "total - the profiled peak + the estimation pool), and that peak (weights, a max_num_tokens dummy prefill, "
            "CUDA graphs) is not modelled",
            f"its page math is: {cell.manager_bytes:,} B a token on each GPU here, in blocks of 32; check a start-up "
            "log with kvplan check-log")

    def server_command(self, model: str, host: str, port: int, served_model_name: str | None, args: Any,
                       prefix: Sequence[str] | None = None) -> list[str]:
        raise KvplanError("kvplan does not launch TensorRT-LLM", "start `trtllm-serve` and attach with kvplan bench --url")

    def capacity_from_log(self, text: str) -> EngineCapacity:
        """The pool TensorRT-LLM prints: the last 'Allocated ... paged KV cache (N)' line's tokens, in blocks of
        its tokens per block where the log states them."""
        log = parse_trtllm_log(text)
        if log.pool is None:
            return EngineCapacity()
        per_block = log.tokens_per_block
        return EngineCapacity(num_blocks=log.pool.tokens // per_block if per_block else None, block_size=per_block,
                              kv_cache_tokens=log.pool.tokens, source="log")

    def capacity_from_metrics(self, cache_info: Mapping[str, str]) -> EngineCapacity:
        return EngineCapacity()  # kvplan reads no pool size from TensorRT-LLM's metrics
