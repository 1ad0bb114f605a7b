"""One replica of a `kvplan size` plan as a configuration of llm-d-inference-sim, the llm-d project's vLLM simulator
(`kvplan size ... --emit llm-d-sim`). Pure.

What the simulator takes, read in its source at llm-d/llm-d-inference-sim@eec055a (v0.10.2 + 41 commits; the keys
and the code quoted here are the same at v0.10.2):
- its YAML config's keys are its flags' names (pkg/common/parser.go, the ``yaml`` tags of pkg/common/config.go);
  a duration is a Go duration string (yaml.v3 decodes a ``time.Duration`` with ``time.ParseDuration``);
- ``latency-calculator: per-token`` (pkg/llm-d-inference-sim/latencies.go): the first token after
  ``(prefill-overhead + uncached prompt tokens x prefill-time-per-token) x load``, each later one after
  ``inter-token-latency x load``, where ``load = 1 + (time-factor-under-load - 1) x (running - 1) / (max-num-seqs - 1)``
  and ``running`` is the number of requests in flight at that moment (1 when ``max-num-seqs`` is 1);
- ``max-num-seqs`` workers serve requests, the rest wait in its queue (pkg/llm-d-inference-sim/simulator.go);
- with ``enable-kvcache``, a block cache of ``kv-cache-size`` blocks of ``block-size`` tokens (8 to 128) holds each
  running request's FULL PROMPT blocks only (no output tokens; pkg/kv-cache/kv_cache.go) and counts prefix hits,
  which shorten the prefill; a request whose new blocks do not fit beside the blocks in use FAILS with HTTP 500
  ("the kv cache does not have sufficient capacity", pkg/kv-cache/block_cache.go ``startRequest``) where vLLM would
  keep it waiting or preempt. So the simulator's pool is vLLM's for prefix hits and evictions, but its admission is
  not: kvplan's KV onsets (the first wait, the first preemption) are not reproduced by it.

The mapping, for one replica (kvplan.plan.steptime's model: the calibrated one with ``--steptime``, else the prior):
- ``kv-cache-size``: the plan's usable blocks (vLLM V1 holds block 0 back as the null block); a model with several KV
  groups draws every group's blocks from one pool, so a token costs one block per group: the size is one group's
  share, as vLLM's own "GPU KV cache size: N tokens" line counts it;
- ``inter-token-latency``: one decode step of one sequence at the mid-output context (prompt + output / 2, the
  context `kvplan size` prices TPOT at); ``time-factor-under-load``: the step of ``max-num-seqs`` sequences over it.
  A decode step is affine in the batch (overhead + the weights read once + each sequence's KV read and FLOPs) and the
  simulator's load is linear in the requests running, so its inter-token latency at every batch from 1 to
  ``max-num-seqs`` is kvplan's decode step at that batch (at that one context: the simulator's does not grow);
- ``prefill-overhead``: a step with no token in it (the step overhead + one read of the weights), plus the request's
  time outside the steps where a calibration measured one; ``prefill-time-per-token``: the rest of the prompt's
  prefill (chunked at ``max_num_batched_tokens`` as the engine does) over its tokens, so a prompt of the planned
  length alone gets kvplan's TTFT; a shorter one a little more, a longer one less (attention grows with the square
  of the prompt, the simulator's line does not).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kvplan.errors import KvplanError
from kvplan.plan.schema import SizePlan
from kvplan.plan.simulate import StepBatch
from kvplan.plan.steptime import StepTimeModel, decode_step_time, model_for, prefill_time

SIM_REPO = "llm-d/llm-d-inference-sim"
SIM_COMMIT = "eec055a39e6bbc1adbcb54f88f24f36b7f94e781"  # v0.10.2 + 41 commits, 2026-08-20
SIM_SOURCE = f"https://github.com/{SIM_REPO}/tree/{SIM_COMMIT} (v0.10.2 + 41 commits)"
#: `Configuration.validate` (pkg/common/config.go@eec055a): the block sizes and data-parallel ranks it takes.
SIM_BLOCK_SIZES = (8, 16, 32, 64, 128)
SIM_MAX_DATA_PARALLEL = 8
STEP_TIME_LABELS = {"prior": "prior: roofline x assumed efficiencies, uncalibrated",
                    "calibrated": "calibrated on a bench run"}


@dataclass(frozen=True)
class SimExport:
    """The simulator's configuration (its keys, in the order written) and how kvplan got each value."""

    config: dict[str, object]
    derivation: dict[str, object]
    notes: list[str]

    def to_json(self) -> dict:
        return {"llm_d_inference_sim": self.config, "derivation": self.derivation, "notes": self.notes,
                "simulator_source": SIM_SOURCE}


def go_duration(seconds: float) -> str:
    """``seconds`` as a Go duration string, to the nanosecond (``time.Duration``'s unit): "12.345678ms", "250us",
    "0s". The fraction has as many digits as the unit has nanoseconds' decimals, so ``time.ParseDuration`` reads
    back the very nanoseconds (its fraction times unit / scale is then an integer times 1)."""
    ns = round(seconds * 1e9)
    if ns < 0:
        raise KvplanError(f"a negative duration ({seconds} s) has no place in the simulator's config")
    if ns == 0:
        return "0s"
    for unit, size, digits in (("s", 10**9, 9), ("ms", 10**6, 6), ("us", 10**3, 3)):
        if ns >= size:
            whole, frac = divmod(ns, size)
            return f"{whole}.{frac:0{digits}d}".rstrip("0").rstrip(".") + unit
    return f"{ns}ns"


def llmd_sim_config(plan: SizePlan, steptime: StepTimeModel | None = None) -> SimExport:
    """The simulator's config for one replica of ``plan`` (which must carry its capacity and a prompt length)."""
    cap = plan.capacity
    settings = cap.settings
    if settings.prompt_tokens is None:
        raise KvplanError("--emit llm-d-sim prices the prompt's prefill and the decode at its context",
                          "give the prompt length with --prompt TOKENS (and --output TOKENS)")
    if settings.decode_context_parallel_size > 1:
        raise KvplanError("--emit llm-d-sim: the simulator has no decode context parallelism",
                          "size without --decode-context-parallel-size")
    if not plan.vllm_startup_lines:
        raise KvplanError("--emit llm-d-sim: vLLM stops at start-up with these settings (see `kvplan size` without "
                          "--emit): no pool to export")
    if plan.block_size not in SIM_BLOCK_SIZES:
        raise KvplanError(f"--emit llm-d-sim: the plan's blocks are {plan.block_size} tokens; the simulator takes "
                          f"block sizes {', '.join(map(str, SIM_BLOCK_SIZES))}",
                          "give --block-size with one of them if vLLM takes it for this model")
    if plan.replicas > SIM_MAX_DATA_PARALLEL:
        raise KvplanError(f"--emit llm-d-sim: {plan.replicas} replicas; the simulator runs at most "
                          f"{SIM_MAX_DATA_PARALLEL} data-parallel ranks a process",
                          "size one replica (--gpu with tp x pp GPUs) and start one simulator per replica")
    if steptime is None:
        try:
            steptime = model_for(cap)
        except KvplanError as exc:
            raise KvplanError(f"--emit llm-d-sim needs step times: {exc.message}",
                              "calibrate on a bench run and give it with --steptime RUN") from None

    groups = max(1, len(plan.kv_groups))
    kv_cache_blocks = cap.usable_blocks // groups
    prompt = settings.prompt_tokens
    output = max(1, settings.output_tokens or 1)
    decode_context = prompt + output // 2  # as kvplan.plan.steptime.quick_latency prices TPOT
    max_num_seqs = plan.max_num_seqs
    itl_one_s = decode_step_time(steptime, 1, decode_context)
    itl_full_s = decode_step_time(steptime, max_num_seqs, decode_context)
    empty_step_s = steptime(StepBatch(0, 0, 0, 0, 0))  # step overhead + the weights read once
    prefill_s = prefill_time(steptime, prompt, plan.max_num_batched_tokens)
    request_s = steptime.request_overhead_s
    per_token_s = (prefill_s - empty_step_s) / prompt

    config: dict[str, object] = {
        "model": plan.model,
        "max-model-len": plan.max_model_len,
        "max-num-seqs": max_num_seqs,
        "enable-kvcache": True,
        "kv-cache-size": kv_cache_blocks,
        "block-size": plan.block_size,
        "latency-calculator": "per-token",
        "prefill-overhead": go_duration(empty_step_s + request_s),
        "prefill-time-per-token": go_duration(per_token_s),
        "inter-token-latency": go_duration(itl_one_s),
        "time-factor-under-load": round(itl_full_s / itl_one_s, 6) if max_num_seqs > 1 else 1.0,
    }
    if plan.replicas > 1:
        config["data-parallel-size"] = plan.replicas

    notes = [
        "the simulator's KV cache holds only running requests' full prompt blocks and fails a request (HTTP 500) "
        "whose blocks do not fit, where vLLM waits or preempts: its prefix hits and evictions follow this pool, "
        "kvplan's KV onsets (first wait, first preemption) do not show in it",
        "enable-kvcache needs POD_IP in the simulator's environment, and a vLLM render service for a Hub model's "
        "tokens (or force-dummy-tokenizer: true)",
    ]
    if groups > 1:
        notes.append(f"the model's {groups} KV groups share vLLM's pool of {cap.usable_blocks:,} usable blocks, a "
                     f"block per group for each {plan.block_size} tokens: kv-cache-size is one group's share")
    if cap.arch.params.experts and steptime.source == "prior":
        notes.append("MoE: the prior step time counts every routed expert's FLOPs (kvplan.plan.steptime), so its "
                     "prefill terms are upper bounds; calibrate on a bench run (--steptime RUN)")
    fit_at_once = plan.max_concurrency_at_request // plan.replicas  # the plan's figure is over the replicas
    if 1 < fit_at_once < max_num_seqs:
        factor = decode_step_time(steptime, fit_at_once, decode_context) / itl_one_s
        notes.append(f"this pool holds {fit_at_once:,} requests of {plan.request_tokens:,} tokens at once; vLLM keeps "
                     f"the rest waiting, the simulator runs up to max-num-seqs: to queue where the pool would, give it "
                     f"max-num-seqs: {fit_at_once} and time-factor-under-load: {factor:.6f}")
    if steptime.request_overhead_per_rps_s2:
        notes.append("the calibration's request overhead grows with the request rate; the simulator takes a "
                     "constant: prefill-overhead holds the part at no load")
    derivation = {
        "step_time": STEP_TIME_LABELS.get(steptime.source, steptime.source),
        "prompt_tokens": prompt,
        "output_tokens": output,
        "decode_context_tokens": decode_context,
        "num_blocks": plan.num_blocks,
        "usable_blocks": cap.usable_blocks,
        "kv_groups": groups,
        "replicas": plan.replicas,
        "requests_fit_at_once": fit_at_once,
        "decode_step_1_seq_ms": round(itl_one_s * 1000, 6),
        "decode_step_max_num_seqs_ms": round(itl_full_s * 1000, 6),
        "empty_step_ms": round(empty_step_s * 1000, 6),
        "request_overhead_ms": round(request_s * 1000, 6),
        "prefill_ms": round(prefill_s * 1000, 6),
    }
    return SimExport(config, derivation, notes)


def _yaml_scalar(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))  # a JSON string is a YAML double-quoted scalar: any model name stays one line


def to_yaml(export: SimExport, plan: SizePlan) -> str:
    """The config as the simulator's ``--config`` file, its derivation in comments above the keys."""
    d = export.derivation
    gpus = f"{plan.gpu_count}x {plan.gpu}" if plan.gpu_count > 1 else plan.gpu
    head = [
        f"# llm-d-inference-sim config from kvplan: {json.dumps(plan.model)} on {gpus} (TP {plan.tensor_parallel_size}"
        f", PP {plan.pipeline_parallel_size}), vLLM {plan.vllm_version} rules; one replica" +
        (f" (data-parallel-size: the {plan.replicas} replicas)" if plan.replicas > 1 else ""),
        f"# keys and their meaning: {SIM_SOURCE}",
        f"# kv-cache-size: {d['num_blocks']:,} blocks less vLLM's null block = {d['usable_blocks']:,}"
        + (f", / {d['kv_groups']} KV groups" if d["kv_groups"] > 1 else "") + f"; block-size {plan.block_size} tokens",
        f"# step times ({d['step_time']}): a decode step of 1 sequence at {d['decode_context_tokens']:,} tokens "
        f"{d['decode_step_1_seq_ms']:.3f} ms, of {plan.max_num_seqs:,} {d['decode_step_max_num_seqs_ms']:.3f} ms "
        "(the simulator's linear load factor gives every batch in between)",
        f"# a prompt of {d['prompt_tokens']:,} tokens alone: {d['prefill_ms']:.3f} ms of steps "
        f"(+ {d['request_overhead_ms']:.3f} ms outside them) = prefill-overhead + {d['prompt_tokens']:,} x "
        "prefill-time-per-token",
        *(f"# note: {n}" for n in export.notes),
    ]
    body = [f"{key}: {_yaml_scalar(value)}" for key, value in export.config.items()]
    return "\n".join(head + body) + "\n"


__all__ = ["SimExport", "go_duration", "llmd_sim_config", "to_yaml", "SIM_SOURCE", "SIM_BLOCK_SIZES"]
