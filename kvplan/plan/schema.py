"""Pydantic models: the contract between the planner and its edges, and the --json schema."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Settings(BaseModel):
    """How a model is deployed: what `vllm serve` would be given, plus the workload asked."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tensor_parallel_size: int = Field(1, ge=1)
    pipeline_parallel_size: int = Field(1, ge=1)
    kv_cache_dtype: str = "auto"
    block_size: int | None = Field(None, ge=1)
    max_model_len: int | None = Field(None, ge=1)
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    kv_cache_memory_bytes: int | None = Field(None, gt=0)
    num_gpu_blocks_override: int | None = Field(None, ge=1)
    max_num_seqs: int | None = Field(None, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=1)
    enforce_eager: bool = False
    hybrid_kv_cache_manager: bool | None = None  # None: vLLM's default for the model
    usage_context: str = Field("serve", pattern="^(serve|llm)$")  # `vllm serve` or offline LLM()
    weights_bytes: int | None = Field(None, gt=0)  # loaded weights per device, if known
    # The workload: concurrent requests of prompt + output tokens, optionally sharing a prefix.
    concurrency: int = Field(1, ge=1)
    prompt_tokens: int | None = Field(None, ge=1)
    output_tokens: int | None = Field(None, ge=0)
    shared_prefix_tokens: int = Field(0, ge=0)


class MemoryTerm(BaseModel):
    """One named term of the per-device KV budget."""

    name: str
    bytes: int
    low_bytes: int
    high_bytes: int
    sign: int = Field(description="+1 adds to the KV budget, -1 takes from it, 0 informative")
    how: str


class KVGroupInfo(BaseModel):
    kind: str
    layers: int
    padding_layers: int
    block_size: int
    detail: str


class ConcurrencyCell(BaseModel):
    context_tokens: int
    concurrency: int
    blocks_needed: int
    pool_fraction: float
    fits: bool


class Suggestion(BaseModel):
    change: str
    flags: str
    result: str
    fits: bool


class SizePlan(BaseModel):
    """Everything `kvplan size` answers. Top-level names are stable for scripts."""

    model: str
    model_source: str
    model_source_detail: str
    gpu: str
    gpu_count: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    replicas: int
    vllm_version: str
    attention: str
    kv_cache_dtype: str
    kv_bytes_per_token: int = Field(description="whole model, every attention layer, one token")
    kv_bytes_per_token_per_device: float
    kv_bytes_per_token_all_devices: float
    block_size: int
    block_bytes: int = Field(description="one block id across its group's layers, per device")
    kv_groups: list[KVGroupInfo]
    memory_terms: list[MemoryTerm]
    available_kv_bytes: int
    available_kv_bytes_low: int
    available_kv_bytes_high: int
    weights_bytes: int = Field(description="loaded weights per device")
    weights_total_bytes: int
    weights_source: str
    num_blocks: int
    kv_cache_tokens: int = Field(description='"GPU KV cache size: N tokens" as that vLLM prints it')
    max_model_len: int
    max_concurrency: float = Field(description='"Maximum concurrency for L tokens per request" as printed')
    request_tokens: int
    concurrency: int
    blocks_per_request: int
    max_concurrency_at_request: int = Field(description="requests of request_tokens that fit at once, per replica x replicas")
    max_context_at_concurrency: int
    max_num_seqs: int
    max_num_batched_tokens: int
    fits: bool
    verdict: str
    limiting_term: str
    table: list[ConcurrencyCell]
    suggestions: list[Suggestion]
    vllm_serve_command: str
    notes: list[str]
