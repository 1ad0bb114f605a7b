"""The door for an inference engine: what sizing a deployment on it answers, and what the bench needs to run and
read it, engine by engine.

An engine is one module in this package that registers an ``Engine`` with ``@engine``; `kvplan size --engine NAME`
(and ``all``) finds it here. Each engine sizes one deployment with its own rules per release, read in its own
source and cited as ``path@version``: vLLM's are in kvplan/vllm/rules.py and kvplan/plan/ (the planner proper),
SGLang's in kvplan/sglang/. The result is an ``EnginePool``, the same record for every engine, so engines can be
printed side by side with the terms that differ.

The bench's half of the door: the command that starts the engine's server, and the pool a running engine reports
(``EngineCapacity``, read from its start-up log or its /metrics). vLLM's are in kvplan/engines/vllm.py; an engine
kvplan does not launch says so in one line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from kvplan.errors import KvplanError
from kvplan.plan.schema import MemoryTerm, Settings

if TYPE_CHECKING:
    from kvplan.deploy import ResolvedModel
    from kvplan.hardware.catalog import GpuSelection


@dataclass(frozen=True, eq=False)
class EnginePool:
    """One engine's KV pool for one deployment, per replica (per GPU where a name says so)."""

    engine: str  # registry name: "vllm", "sglang"
    engine_label: str  # "vLLM 0.33.0"
    model: str
    gpu: str
    gpu_count: int
    tensor_parallel_size: int
    replicas: int
    kv_cache_dtype: str
    kv_bytes_per_token_per_gpu: int
    page_tokens: int  # vLLM's block size, SGLang's page_size: the pool is allocated in these
    memory_terms: list[MemoryTerm]  # per GPU, as the engine's own budget names them
    kv_memory_bytes_per_gpu: int  # what the engine gives its KV pool on each GPU
    pool_tokens: int  # tokens of context the pool holds, as the engine prints it
    pool_pages: int
    max_model_len: int
    requests_at_context: float  # requests of max_model_len tokens that fit in the pool at once
    max_running_requests: int  # the engine's own cap on running requests
    request_tokens: int  # the asked workload: tokens a request holds at its end
    concurrency: int  # ... and how many at once
    fits: bool  # the engine starts and the asked concurrency of such requests fits
    verdict: str
    startup_lines: list[str]  # what the engine prints about its pool at start-up
    launch_command: str
    engine_flags: dict[str, str] = field(default_factory=dict)  # the engine's pool flags and the values used
    # An engine of several pools (SGLang's hybrid sliding-window pool): each pool's tokens as the engine prints
    # them ({"full_layer_tokens": N, "swa_layer_tokens": M}); one pool: {"max_total_num_tokens": N}
    pool_split: dict[str, int] = field(default_factory=dict)
    # ... and each pool's buffers per GPU as the engine allocates them (bytes)
    pool_bytes_per_gpu: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True, eq=False)
class EnginePools:
    """What `kvplan size --engine NAME|all --json` prints (`kvplan schema size-engines`)."""

    engines: list[EnginePool]
    # `--engine all`: an engine that does not size this deployment -> its reason (the others are still shown)
    refused: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineOptions:
    """Pool flags of one engine that no other engine has (`kvplan size --mem-fraction-static 0.9 --page-size 16`);
    an engine refuses the ones that are not its own."""

    mem_fraction_static: float | None = None  # SGLang's --mem-fraction-static
    page_size: int | None = None  # SGLang's --page-size
    swa_full_tokens_ratio: float | None = None  # SGLang's --swa-full-tokens-ratio
    enable_dp_attention: bool | None = None  # SGLang's --enable-dp-attention, with --dp-size the TP size
    mamba_full_memory_ratio: float | None = None  # SGLang's --mamba-full-memory-ratio
    free_gpu_memory_fraction: float | None = None  # TensorRT-LLM's kv_cache_config.free_gpu_memory_fraction
    tokens_per_block: int | None = None  # TensorRT-LLM's kv_cache_config.tokens_per_block
    max_num_tokens: int | None = None  # TensorRT-LLM's max_num_tokens (the dummy prefill's size)
    dummy_activation_bytes: int | None = None  # TensorRT-LLM: the dummy prefill's activation, where given

    def given(self, *own: str) -> list[str]:
        """The flags given that are not among ``own`` (field names): another engine's."""
        return [_FLAGS.get(name, f"--{name.replace('_', '-')}") for name, value in vars(self).items()
                if value is not None and name not in own]


    def keep(self, *own: str) -> EngineOptions:
        """Only the fields ``own``: what `--engine all` hands each engine."""
        return EngineOptions(**{name: value for name, value in vars(self).items() if name in own})


_FLAGS = {"dummy_activation_bytes": "--dummy-activation-gib"}


@dataclass(frozen=True)
class EngineCapacity:
    """The KV pool a running engine reports. ``num_blocks`` counts vLLM's null block, as vLLM does. Also the
    ``capacity`` of a bench summary (kvplan.bench.results.BenchSummary); all None: nothing reported."""

    num_blocks: int | None = None
    block_size: int | None = None  # the engine's page: vLLM's block size, SGLang's page_size
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    max_concurrency_len: int | None = None
    source: str = ""  # "metrics", "log", or both joined by "+"
    vllm_version: str | None = None  # the release as the engine logged it (the name predates other engines)

    def merged(self, other: EngineCapacity) -> EngineCapacity:
        """Fill the fields this one lacks from ``other``."""
        return EngineCapacity(
            num_blocks=self.num_blocks if self.num_blocks is not None else other.num_blocks,
            block_size=self.block_size if self.block_size is not None else other.block_size,
            kv_cache_tokens=self.kv_cache_tokens if self.kv_cache_tokens is not None else other.kv_cache_tokens,
            max_concurrency=self.max_concurrency if self.max_concurrency is not None else other.max_concurrency,
            max_concurrency_len=self.max_concurrency_len
            if self.max_concurrency_len is not None
            else other.max_concurrency_len,
            source="+".join(s for s in (self.source, other.source) if s),
            vllm_version=self.vllm_version or other.vllm_version,
        )


class Engine(Protocol):
    """What kvplan needs of an engine to size a deployment on it, and to launch and read it in the bench."""

    name: str  # the registry name, `--engine NAME`
    label: str  # "vLLM", "SGLang"
    known_versions: tuple[str, ...]  # the releases whose source was read, oldest first
    newest_known: str
    own_options: tuple[str, ...]  # the EngineOptions fields that are this engine's flags

    def size(self, model: ResolvedModel, gpus: GpuSelection, settings: Settings, version: str | None,
             options: EngineOptions = EngineOptions()) -> EnginePool:
        """The pool of ``settings`` on ``gpus`` under release ``version`` (None: the newest known); a deployment the
        engine refuses, or another engine's option, raises KvplanError with the reason."""
        ...

    def server_command(self, model: str, host: str, port: int, served_model_name: str | None, args: Any,
                       prefix: Sequence[str] | None = None) -> list[str]:
        """The command that starts the engine's OpenAI-compatible server with the engine arguments ``args`` (the
        engine's own record: vLLM's EngineArgs), after ``prefix`` (None: found in this Python environment). An
        engine kvplan does not launch raises KvplanError saying so."""
        ...

    def capacity_from_log(self, text: str) -> EngineCapacity:
        """The pool the engine's start-up log reports (all None where it reports none)."""
        ...

    def capacity_from_metrics(self, cache_info: Mapping[str, str]) -> EngineCapacity:
        """The pool the labels of the engine's /metrics pool-info series report (all None where it has none)."""
        ...


ENGINES: dict[str, Engine] = {}


def engine(cls):
    """Class decorator: register one instance of an Engine under its ``name``."""
    instance = cls()
    if instance.name in ENGINES:
        raise KvplanError(f"two engines named {instance.name!r}")
    ENGINES[instance.name] = instance
    return cls


def engine_named(name: str) -> Engine:
    """The registered engine ``name``; an unknown name is a one-line error naming the known ones."""
    found = ENGINES.get(str(name).strip().lower())
    if found is None:
        raise KvplanError(f"unknown engine {name!r}", f"use one of {', '.join(sorted(ENGINES))}, or all")
    return found
