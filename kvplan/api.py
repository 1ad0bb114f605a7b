"""kvplan from Python: the same plans as the command line, as typed records, for scripts that review capacity.

    from kvplan.api import size

    plan = size("meta-llama/Llama-3.1-8B", gpu="4090", ctx="32k")
    plan.fits, plan.kv_cache_tokens, plan.max_concurrency      # True, 39168, 1.1953
    plan.vllm_startup_lines                                      # what vLLM will print at start-up

    pools = size_engines("Qwen/Qwen3-8B", gpu="H100", ctx="32k")   # every engine kvplan sizes, side by side

``size`` returns the `SizePlan` that `kvplan size --json` prints (kvplan/plan/schema.py documents every field, with
units in the names); a bad input raises `kvplan.errors.KvplanError` (its ``message`` and ``hint`` are the command
line's one-line error). Engine arguments are `Settings` fields under vLLM's own names (``tensor_parallel_size=2``,
``kv_cache_dtype="fp8"``, ``max_num_seqs=64``...); token counts take ``32k``-style text or ints, sizes ``24GiB``.
Nothing here reads the network unless the model is not bundled and ``offline`` is False.
"""

from __future__ import annotations

from kvplan.deploy import load_model, plan_deployment, select_gpus
from kvplan.engines import ENGINES, EnginePool, engine_named
from kvplan.errors import KvplanError
from kvplan.plan.schema import Settings, SizePlan
from kvplan.units import parse_bytes, parse_tokens

__all__ = ["KvplanError", "EnginePool", "Settings", "SizePlan", "settings", "size", "size_engines"]


def settings(ctx: int | str | None = None, concurrency: int = 1, prompt: int | str | None = None,
             output: int | str | None = None, shared_prefix: int | str = 0, **engine_args: object) -> Settings:
    """The planner's `Settings`: the workload by name, the engine arguments as `Settings` fields."""
    unknown = set(engine_args) - set(Settings.__dataclass_fields__)
    if unknown:
        raise KvplanError(f"unknown engine argument(s): {', '.join(sorted(unknown))}",
                          "use the fields of kvplan.plan.schema.Settings (vLLM's own names)")
    for name in ("kv_cache_memory_bytes", "weights_bytes", "host_memory_bytes"):
        if isinstance(engine_args.get(name), str):
            engine_args[name] = parse_bytes(engine_args[name], name)  # type: ignore[arg-type]
    return Settings(
        max_model_len=None if ctx is None else parse_tokens(ctx, "context length"),
        concurrency=concurrency,
        prompt_tokens=None if prompt is None else parse_tokens(prompt, "prompt length"),
        output_tokens=None if output is None else parse_tokens(output, "output length", allow_zero=True),
        shared_prefix_tokens=parse_tokens(shared_prefix, "shared prefix", allow_zero=True),
        **engine_args,  # type: ignore[arg-type]
    )


def size(model: str, gpu: str | None = None, *, gpus: int | None = None, gpu_mem: str | None = None,
         ctx: int | str | None = None, concurrency: int = 1, prompt: int | str | None = None,
         output: int | str | None = None, shared_prefix: int | str = 0, vllm_version: str | None = None,
         source: str = "auto", offline: bool | None = None, **engine_args: object) -> SizePlan:
    """`kvplan size MODEL --gpu GPU ...` as a `SizePlan` (suggestions included when it does not fit)."""
    resolved = load_model(model, source=source, offline=offline)
    selection = select_gpus(gpu, gpus, gpu_mem)
    chosen = settings(ctx, concurrency, prompt, output, shared_prefix, **_tp_over_all_gpus(engine_args, selection))
    return plan_deployment(resolved, selection, chosen, vllm_version)


def _tp_over_all_gpus(engine_args: dict[str, object], selection) -> dict[str, object]:
    """As the command line: TP over all the GPUs (per pipeline stage) unless given."""
    if "tensor_parallel_size" in engine_args:
        return engine_args
    pp = engine_args.get("pipeline_parallel_size", 1)
    return {**engine_args, "tensor_parallel_size": max(1, selection.count // pp if isinstance(pp, int) and pp > 0 else 1)}


def size_engines(model: str, gpu: str | None = None, *, engines: tuple[str, ...] | None = None,
                 versions: dict[str, str] | None = None, gpus: int | None = None, gpu_mem: str | None = None,
                 ctx: int | str | None = None, concurrency: int = 1, prompt: int | str | None = None,
                 output: int | str | None = None, shared_prefix: int | str = 0, source: str = "auto",
                 offline: bool | None = None, **engine_args: object) -> list[EnginePool]:
    """`kvplan size MODEL --engine all`: one `EnginePool` per engine (``engines``: names; default every one kvplan
    sizes), each under its newest known release unless ``versions`` names one (``{"sglang": "0.5.3"}``)."""
    resolved = load_model(model, source=source, offline=offline)
    selection = select_gpus(gpu, gpus, gpu_mem)
    chosen = settings(ctx, concurrency, prompt, output, shared_prefix, **_tp_over_all_gpus(engine_args, selection))
    names = engines or tuple(ENGINES)
    return [engine_named(n).size(resolved, selection, chosen, (versions or {}).get(n)) for n in names]
