"""vLLM behind the engine door: the planner itself (kvplan/plan/, rules in kvplan/vllm/rules.py)."""

from __future__ import annotations

from kvplan.deploy import ResolvedModel, plan_deployment
from kvplan.engines.base import EngineOptions, EnginePool, engine
from kvplan.errors import KvplanError
from kvplan.hardware.catalog import GpuSelection
from kvplan.plan.schema import Settings, SizePlan
from kvplan.vllm.rules import KNOWN_VERSIONS, NEWEST_KNOWN


def pool_of(plan: SizePlan) -> EnginePool:
    """A vLLM plan as the engine-neutral record (every figure is the plan's own)."""
    cap = plan.capacity
    util = cap.settings.gpu_memory_utilization or cap.rules.default_gpu_memory_utilization
    return EnginePool(
        engine="vllm", engine_label=f"vLLM {plan.vllm_version}", model=plan.model, gpu=plan.gpu,
        gpu_count=plan.gpu_count, tensor_parallel_size=plan.tensor_parallel_size, replicas=plan.replicas,
        kv_cache_dtype=plan.kv_cache_dtype, kv_bytes_per_token_per_gpu=round(plan.kv_bytes_per_token_per_device),
        page_tokens=plan.block_size, memory_terms=list(plan.memory_terms),
        kv_memory_bytes_per_gpu=plan.available_kv_bytes, pool_tokens=plan.kv_cache_tokens,
        pool_pages=plan.num_blocks, max_model_len=plan.max_model_len, requests_at_context=plan.max_concurrency,
        max_running_requests=plan.max_num_seqs, request_tokens=plan.request_tokens, concurrency=plan.concurrency,
        fits=plan.fits, verdict=plan.verdict, startup_lines=list(plan.vllm_startup_lines),
        launch_command=plan.vllm_serve_command,
        engine_flags={"--gpu-memory-utilization": f"{util:g}",
                      "--block-size": str(plan.block_size), "--max-num-seqs": str(plan.max_num_seqs)},
        notes=list(plan.notes))


@engine
class Vllm:
    name = "vllm"
    label = "vLLM"
    known_versions = KNOWN_VERSIONS
    newest_known = NEWEST_KNOWN

    def size(self, model: ResolvedModel, gpus: GpuSelection, settings: Settings, version: str | None,
             options: EngineOptions = EngineOptions()) -> EnginePool:
        if options.given():
            raise KvplanError(f"{', '.join(options.given())} is not a vLLM flag",
                              "vLLM's are --gpu-memory-utilization and --block-size; or size with --engine sglang")
        return pool_of(plan_deployment(model, gpus, settings, version, suggest=False))
