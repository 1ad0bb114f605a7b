"""`kvplan bench --traffic FILE`: replay sessions, traces and shared prefixes on the engine, and
check vLLM's prefix cache against the prediction.

A point replays the first N sessions of the traffic (``--sessions N1,N2,...``; all of them by
default): each turn is sent at its timestamp, or its think time after the previous turn of its
session ended (kvplan.bench.loadgen.run_sessions; ``--time-scale`` multiplies every time). Prompts
are token ids built from the turns' segments (kvplan.traffic.tokens: identical segments are identical
ids, with a per-point nonce so one point's cache never serves another's), so the engine's prefix
cache sees exactly the reuse the traffic describes. Each point records the engine's prefix-cache
counters over the point (vllm:prefix_cache_queries / _hits: tokens of never-preempted requests),
the prompt tokens reused and computed, preemptions, the sessions in flight, TTFT of turns that hit
the cache and of those that did not (when the server reports ``cached_tokens``:
``--enable-prompt-tokens-details``), and the send skew.

The prediction, beside it: the simulator (kvplan.plan.simulate) replays the same turns on the
engine's reported pool with vLLM's block pool and counters (kvplan.plan.block_pool) -

- with the run's step-time model (a calibration, or a GPU's prior) when it has one: times in seconds;
- else, when every session starts at once and turns follow without think time (a closed loop per
  session), in engine steps: the order of events then does not depend on how long a step takes;
- else, for traffic whose requests do not overlap (arrivals further apart than a request lasts), the
  working set (kvplan.plan.prefix_cache): requests one at a time, no timing needed. A replay whose
  requests do overlap then gets no prediction rather than a wrong one (`predicted_by` says which).

All of it on the served model's KV cache groups (`served_groups`: its config read offline): a hybrid model's
sliding-window / chunked-local groups and recurrent-state groups in "align" mode through kvplan.plan.hybrid_sim,
under the rules of the release the engine reported (its log, or its /version); a recurrent-state model gets no
prediction when that release is unknown, or when the GPU decides its mixers' checkpoint page and is not given
(GDN from 0.33); a model kvplan cannot read is predicted as one full-attention group, and `predicted_by` says so.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from kvplan.bench.loadgen import RequestRecord, SessionSend
from kvplan.bench.results import LatencyStats, ReplayFigures, ServerFigures
from kvplan.bench.workload import RequestSpec
from kvplan.deploy import load_model, plan_deployment, select_gpus
from kvplan.errors import KvplanError
from kvplan.plan.hybrid_cache import FULL, MAMBA, MANAGER_OF_KIND, HybridGroups
from kvplan.plan.hybrid_sim import replay_one_at_a_time, simulate_groups
from kvplan.plan.prefix_cache import hybrid_sim_turns, traffic_load, traffic_working_set
from kvplan.plan.schema import Settings, settings_from_engine_args
from kvplan.plan.simulate import SchedulerConfig, SimResult, wave_scenarios
from kvplan.traffic.loaders import load_traffic
from kvplan.traffic.model import Traffic
from kvplan.traffic.tokens import prompt_token_ids


class TrafficReplay(BaseModel):
    """What `--traffic` asks for (stored in run.json, so ``--resume`` replays the same file)."""

    path: str
    kind: str = "auto"
    options: dict[str, float | int] = {}  # the loader's options (--traffic-option hash_block_tokens=32)
    time_scale: float = 1.0
    sessions: list[int] | None = None  # points: the first N sessions each; None: one point with all


def load_replay_traffic(spec: TrafficReplay) -> Traffic:
    if not 0 < spec.time_scale <= 1e6:
        raise KvplanError(f"invalid --time-scale {spec.time_scale:g}", "use a factor > 0 (0.5 replays twice as fast)")
    return load_traffic(Path(spec.path), spec.kind, **spec.options)


def first_sessions(traffic: Traffic, n: int) -> Traffic:
    """The turns of the first ``n`` sessions (in order of first appearance), in file order."""
    if n < 1:
        raise KvplanError(f"invalid --sessions level {n}", "replay at least 1 session")
    keep = list(traffic.sessions)[:n]
    if len(keep) < n:
        raise KvplanError(f"--sessions {n}: the traffic has {len(traffic.sessions)} sessions")
    chosen = set(keep)
    return Traffic(tuple(t for t in traffic.turns if t.session in chosen), traffic.source, traffic.notes)


def session_sends(traffic: Traffic, time_scale: float = 1.0) -> list[SessionSend]:
    """When each turn goes (request number = position in ``traffic.turns``)."""
    numbers: dict[str, int] = {}
    previous: dict[str, int] = {}
    sends = []
    for number, t in enumerate(traffic.turns):
        session = numbers.setdefault(t.session, len(numbers))
        if t.arrival_s is not None:
            sends.append(SessionSend(number, session, at_s=t.arrival_s * time_scale))
        else:
            sends.append(SessionSend(number, session, after=previous[t.session], think_s=t.think_s * time_scale))
        previous[t.session] = number
    return sends


def request_specs(traffic: Traffic, nonce: str):
    """``spec_for(number)``: turn ``number`` as token ids (kvplan.traffic.tokens)."""

    def spec_for(number: int) -> RequestSpec:
        turn = traffic.turns[number]
        ids = prompt_token_ids(turn, nonce)
        return RequestSpec(number, len(ids), turn.output_tokens, prompt_token_ids=tuple(ids))

    return spec_for


def lockstep(traffic: Traffic) -> bool:
    """Every session starts at once and its turns follow with no think time: a closed loop per session,
    whose order of events does not depend on the step time."""
    firsts = {t.arrival_s for t in traffic.turns if t.turn == 0}
    return len(firsts) == 1 and all(t.arrival_s is None and t.think_s == 0 for t in traffic.turns if t.turn > 0)


#: Client timings a lockstep replay is simulated under (in engine steps): the first turns of the sessions
#: reach the engine spread over up to `WAVE_SPREAD_STEPS` steps (an idle engine starts its first step on
#: the first request alone; kvplan.plan.simulate.timing_verdict), and each later turn comes 0 to 8 steps
#: after the previous one ended (the client reads the end, the API server passes the next one on), or one
#: session's later turns that late and the others' at once (a `.ci/run` of 2026-12-08: 3 sessions hit 480 of
#: 1,056 prompt tokens, as the simulator does with the second session's second turn 4 steps late, against 512
#: with every turn on time); and one session's first turn late by a quarter to a whole of a turn's output, or
#: the wave spread evenly over that long or split in two that far apart (a busy API server on a 2-core host
#: passes a wave's requests on that far apart: on CI, 5 sessions the simulator preempted at every tighter
#: timing did not preempt on the engine).
WAVE_SPREAD_STEPS = 3
TURN_DELAY_STEPS = (0, 1, 2, 4, 8)
LATE_SHARES = (0.25, 0.5, 0.75, 1.0)
MAX_WAVES = 30
MAX_LATE_SESSIONS = 16
#: Above this many turns a lockstep replay is simulated once (all at once, no delay), not per timing.
MAX_TIMED_TURNS = 5000
#: The same on a hybrid KV cache, whose simulator steps every decode step (kvplan.plan.hybrid_sim: ~20 times
#: the plain simulator's time on 128 agent turns, 0.4 s a run), so ~200 timings stay within a minute.
MAX_TIMED_HYBRID_TURNS = 100


@dataclass(frozen=True)
class Prediction:
    """The simulator's figures of a replay: at the nominal timing (``nominal``), and the range over the
    client timings it may meet (one value each when only the nominal one was simulated)."""

    nominal: SimResult
    how: str
    hit_rate_low: float | None
    hit_rate_high: float | None
    preemption: bool | None  # None: some timings preempt, others do not


def predict(traffic: Traffic, config: SchedulerConfig, time_scale: float = 1.0, step_time=None,
            groups: HybridGroups | None = None) -> Prediction | None:
    """The simulator's run of the replay (see the module doc); None when kvplan cannot time it honestly.
    ``groups``: the model's KV cache groups (None: one full-attention group)."""
    B = config.block_size
    if step_time is not None:
        sim = simulate_groups(config, traffic_load(traffic, B, time_scale), groups, step_time)
        return Prediction(sim, "simulator, step-time model", sim.prefix_hit_rate, sim.prefix_hit_rate, sim.preempted)
    if not lockstep(traffic):
        return None
    nominal = simulate_groups(config, traffic_load(traffic, B), groups)
    if traffic.num_requests > (MAX_TIMED_TURNS if groups is None else MAX_TIMED_HYBRID_TURNS):
        return Prediction(nominal, "simulator, in engine steps (sessions in lockstep; one timing)",
                          nominal.prefix_hit_rate, nominal.prefix_hit_rate, nominal.preempted)
    session_of = {name: i for i, name in enumerate(traffic.sessions)}
    timings: list = []
    for wave in wave_scenarios(len(session_of), WAVE_SPREAD_STEPS, MAX_WAVES, 0):
        for turn_delay in TURN_DELAY_STEPS:
            timings.append(lambda turn, wave=wave, d=turn_delay: float(wave[session_of[turn.session]])
                           if turn.turn == 0 else float(d))
    output = sum(t.output_tokens for t in traffic.turns) / traffic.num_requests  # ~ a turn's steps
    n = len(session_of)
    for share in LATE_SHARES:  # the wave spread evenly over a share of a turn, or split in two that far apart
        d = round(share * output)
        waves = [[round(i * d / max(1, n - 1)) for i in range(n)], *([0] * k + [d] * (n - k) for k in range(1, n))]
        for wave in waves:
            timings.append(lambda turn, wave=wave: float(wave[session_of[turn.session]]) if turn.turn == 0 else 0.0)
    for late in range(min(n, MAX_LATE_SESSIONS)):
        for share in LATE_SHARES:
            timings.append(lambda turn, late=late, d=round(share * output): float(d)
                           if turn.turn == 0 and session_of[turn.session] == late else 0.0)
        for turn_delay in TURN_DELAY_STEPS[1:]:  # one session's later turns late, the others' on time
            timings.append(lambda turn, late=late, d=turn_delay: float(d)
                           if turn.turn > 0 and session_of[turn.session] == late else 0.0)
    rates, preempts = [], set()
    for timing in timings:
        sim = simulate_groups(config, traffic_load(traffic, B, client_delay=lambda number, t=timing: t(traffic.turns[number])),
                              groups)
        rates.append(sim.prefix_hit_rate)
        preempts.add(sim.preempted)
    known = [r for r in rates if r is not None]
    return Prediction(nominal, "simulator, in engine steps (sessions in lockstep, over client timings)",
                      min(known) if known else None, max(known) if known else None,
                      preempts.pop() if len(preempts) == 1 else None)


def replay_figures(traffic: Traffic, records: list[RequestRecord], server: ServerFigures, config: SchedulerConfig | None,
                   time_scale: float = 1.0, step_time=None, groups: ServedGroups | None = None) -> ReplayFigures:
    queries, hits = server.prefix_queries, server.prefix_hits
    fig: dict = dict(sessions=len(traffic.sessions), requests=len(records), prefix_queries=queries, prefix_hits=hits,
                     hit_rate=round(hits / queries, 6) if queries and hits is not None else None,
                     reused_prompt_tokens=hits,
                     computed_prompt_tokens=None if queries is None or hits is None else queries - hits,
                     send_skew=LatencyStats.of([max(0.0, r.sent_s - r.scheduled_s) for r in records if r.sent_s]),
                     peak_sessions_in_flight=_peak_sessions(records))
    reported = [r for r in records if r.ok and r.cached_tokens is not None and r.ttft_s is not None]
    if reported:
        fig.update(cached_tokens_reported=True,
                   ttft_hit=LatencyStats.of([r.ttft_s for r in reported if r.cached_tokens > 0]),
                   ttft_miss=LatencyStats.of([r.ttft_s for r in reported if r.cached_tokens == 0]))
    fig.update(_prediction(traffic, records, config, time_scale, step_time, groups or ServedGroups(None)))
    return ReplayFigures(**fig)


@dataclass(frozen=True)
class ServedGroups:
    """The served model's KV cache groups as far as kvplan knows them: ``groups`` (None with ``unknown``: one
    full-attention group assumed, and said; None alone: one full-attention group), or ``refused``: why their
    prefix cache is not modelled (no prediction then)."""

    groups: HybridGroups | None
    unknown: str = ""
    refused: str = ""
    # the KV cache groups' spec kinds as kvplan plans the model (one a block table: vLLM's grouping), when planned
    kinds: tuple[str, ...] = ()

    @property
    def one_full_attention_group(self) -> bool | None:
        """Whether the pool is one full-attention group (MLA's included), as the block rule counts it; None: unknown."""
        if not self.kinds:
            return None
        return len(self.kinds) == 1 and MANAGER_OF_KIND.get(self.kinds[0]) == FULL


def served_groups(model: str | None, args, block_size: int, max_num_batched_tokens: int | None,
                  vllm_version: str | None = None, gpu: str | None = None) -> ServedGroups:
    """The KV cache groups kvplan plans for the served model (its config read offline; ``args``: the engine's flags,
    a kvplan.vllm.args.EngineArgs, when kvplan launched it), at the engine's block size, under the rules of the
    release the engine reported (``vllm_version``) on ``gpu`` (the bench's --gpu) when given.
    ``max_num_batched_tokens``: the engine's token budget where its flags do not set it (a window group's admission
    cap counts the tokens in flight)."""
    if not model:
        return ServedGroups(None, unknown="the model is unknown")
    try:
        resolved = load_model(model, offline=True)
    except Exception as exc:  # noqa: BLE001 - any model kvplan cannot read leaves the groups unknown
        return ServedGroups(None, unknown=f"kvplan cannot read {model}'s config ({type(exc).__name__})")
    try:
        extra = {} if max_num_batched_tokens is None or (args is not None and args.max_num_batched_tokens) else {
            "max_num_batched_tokens": max_num_batched_tokens}
        settings = settings_from_engine_args(args, **extra) if args is not None else Settings(**extra)
        plan = plan_deployment(resolved, select_gpus(gpu, None, "1TiB"), settings, vllm_version=vllm_version)
    except KvplanError as exc:
        return ServedGroups(None, refused=exc.message)
    except Exception as exc:  # noqa: BLE001 - a model kvplan cannot plan leaves the groups unknown
        return ServedGroups(None, unknown=f"kvplan cannot plan {model} ({type(exc).__name__})")
    layout = plan.capacity.layout
    kinds = tuple(g.spec.kind for g in (layout.groups[:1] if layout.shared_block_table else layout.groups))
    try:
        groups = HybridGroups.of_capacity(plan.capacity)
    except KvplanError as exc:
        return ServedGroups(None, refused=exc.message, kinds=kinds)
    if groups.full_attention_only:
        return ServedGroups(None, kinds=kinds)
    why = _state_groups_undecided(plan.capacity, vllm_version, gpu) if groups.has_mamba else ""
    if why:
        return ServedGroups(None, refused=f"the prefix cache of mamba KV groups is not modelled for this served "
                                          f"engine: {why}", kinds=kinds)
    return ServedGroups(dataclasses.replace(groups, block_size=block_size), kinds=kinds)


def _state_groups_undecided(cap, vllm_version: str | None, gpu: str | None) -> str:
    """Why the served engine's recurrent-state groups cannot be planned here ('' when they can). Whether a
    mixer adds a prefill checkpoint page (which lets the scheduler run the prompt's last chunk past its replay
    boundary) is the release's choice for Mamba-2 (0.32+, `MambaMixer2.get_kv_cache_spec`,
    model_executor/layers/mamba/mamba_mixer2.py@0.32.0) and for every other mixer, but the GPU's for GDN from
    0.33 (FlashInfer's GDN prefill, the auto choice on Hopper: kvplan.plan.capacity `checkpoint_variants`)."""
    if vllm_version is None:
        return ("the engine did not report its vLLM release, which decides whether its mixers add a prefill "
                "checkpoint page (Mamba-2's from 0.32)")
    gdn = any(g.spec.kind == MAMBA and g.spec.variant == "gated_delta_net" for g in cap.layout.groups)
    if gdn and cap.rules.gdn_checkpoint_page_on_hopper and gpu is None:
        return (f"in vLLM {vllm_version} whether its GDN mixers add a prefill checkpoint page depends on the GPU "
                "(Hopper's FlashInfer prefill), which kvplan does not know here (pass --gpu)")
    return ""


def _prediction(traffic: Traffic, records: list[RequestRecord], config: SchedulerConfig | None, time_scale: float,
                step_time, served: ServedGroups) -> dict:
    if config is None:
        return {"predicted_by": "none: the engine's KV pool is unknown"}
    if served.refused:
        return {"predicted_by": f"none: {served.refused}"}
    groups = served.groups
    assumed = f" (one full-attention KV group assumed: {served.unknown})" if served.unknown else ""
    try:
        pred = predict(traffic, config, time_scale, step_time, groups)
    except KvplanError as exc:
        return {"predicted_by": f"none: {str(exc).splitlines()[0]}"}
    if pred is not None:
        sim = pred.nominal
        return {"predicted_by": pred.how + assumed, "predicted_queries": sim.prefix_queries, "predicted_hits": sim.prefix_hits,
                "predicted_hit_rate": _round(sim.prefix_hit_rate), "predicted_hit_rate_low": _round(pred.hit_rate_low),
                "predicted_hit_rate_high": _round(pred.hit_rate_high), "predicted_preemption": pred.preemption}
    if not _one_at_a_time(records):
        return {"predicted_by": "none: requests overlapped and the run has no step-time model (--steptime RUN or "
                                "--gpu) to time them"}
    how = "working set (requests one at a time, in the traffic's order)"
    if groups is not None:  # the hybrid pool replayed one request at a time (kvplan.plan.hybrid_sim)
        try:
            queried, hits = replay_one_at_a_time(hybrid_sim_turns(traffic, config.block_size), groups,
                                                 config.usable_blocks, config.max_num_batched_tokens)
        except KvplanError as exc:
            return {"predicted_by": f"none: {str(exc).splitlines()[0]}"}
        rate = _round(hits / queried if queried else None)
        return {"predicted_by": f"{how} on {groups.describe()}", "predicted_queries": queried, "predicted_hits": hits,
                "predicted_hit_rate": rate, "predicted_hit_rate_low": rate, "predicted_hit_rate_high": rate,
                "predicted_preemption": False}
    ws = traffic_working_set(traffic, config.block_size)
    rate = _round(ws.hit_rate(config.usable_blocks))
    return {"predicted_by": how + assumed,
            "predicted_queries": ws.queried_tokens, "predicted_hits": ws.hit_blocks(config.usable_blocks) * ws.block_size,
            "predicted_hit_rate": rate, "predicted_hit_rate_low": rate, "predicted_hit_rate_high": rate,
            "predicted_preemption": False}


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


def _one_at_a_time(records: list[RequestRecord]) -> bool:
    """No request was sent before the one before it ended (the client's view)."""
    spans = sorted((r.sent_s, r.end_s or r.sent_s) for r in records)
    return all(b[0] >= a[1] for a, b in zip(spans, spans[1:]))


def _peak_sessions(records: list[RequestRecord]) -> int:
    events = sorted([(r.sent_s, 1) for r in records] + [(r.end_s if r.end_s is not None else r.sent_s, -1)
                                                          for r in records])
    now = peak = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak
