"""The scheduler simulator's onsets against the real vLLM CPU engine's, for length distributions,
a trace and a shared prefix (workloads the closed-form block rule cannot predict).

One engine (the bench tests' pinned pool: 17 blocks of 32, context 512) serves the module;
`kvplan bench --url --sweep LEVELS --no-warmup` measures each workload, and the simulator
replays the very requests bench sent (same lengths, same request numbers per point).

Why some workloads are borderline on the engine (the dropped pure-lognormal one was: onset 4 or 5
from run to run). The simulator's closed loop sends a stream's next request the step its previous
one ends; the real client is late by a varying amount: on this 2-core host the API server or the
client stalls for up to ~0.25 s (~80 engine steps), after which every stream's tokens arrive at once
and the streams send their next requests together, as one wave. Which requests overlap, and so
whether a level preempts, then depends on those delays. The simulator cannot predict the delays,
but it can say which onsets they cannot move (`timing_verdict`, `proven_onsets`): a level whose
streams' largest requests all fit at their peaks at once can never wait or preempt, and a level
whose first wave (request 0 of every stream, sent together at the start) overflows the pool before
any of its requests ends always preempts, however those first requests fall on the engine's first
steps (a margin in steps: a busy API server passes them on late). The dropped workload's 3 streams
can never wait (16 blocks at most), but at 4 its first wave fits the pool and its later requests
preempt only if they overlap: 4 was up to timing
(tests/plan/test_simulate.py: clients late by 0-64 steps at random move it to 5 about half the time).

The workloads added for issue 10's goal ("three workloads with length distributions or traces")
are proven in that sense (`test_onsets_are_timing_proof`, no engine needed); the two older ones are
not fully, and are kept because the engine has agreed with them in every run so far (see their
notes). Expected onsets are the engine's measurements, asserted equal to the simulator's. The proof
assumes the first wave reaches the engine within its margin (16-24 steps, ~50-70 ms here): with a
busy loop taking one of the 2 cores, the API server once passed the first requests on a whole
request apart and "normal+shared" measured 5 (once in two runs; every other run, (4, 4)).
"""

from __future__ import annotations

import json
import random
import subprocess
from dataclasses import replace

import pytest
from helpers.bench import (  # noqa: E402
    BLOCK_SIZE,
    POOL_BLOCKS,
    bench_env,
    engine_required,
    kvplan_cmd,
)

from kvplan.plan.blocks import BlockRule  # noqa: E402
from kvplan.plan.simulate import (  # noqa: E402
    Lengths,
    ProvenOnsets,
    SchedulerConfig,
    bench_levels_first_index,
    closed_loop,
    proven_onsets,
    sweep_onsets,
    timing_verdict,
)

PER_STREAM = 3

# A trace (JSONL, `kvplan bench --trace`): request i is line i mod 8, cycled over the sweep.
TRACE = ((116, 37), (110, 28), (59, 25), (55, 21), (114, 38), (37, 54), (120, 37), (103, 53))


@pytest.fixture(scope="module")
def cpu_engine(pinned_cpu_engine):
    """tests/bench's engine: the session's real CPU engine pinned to POOL_BLOCKS x BLOCK_SIZE."""
    return pinned_cpu_engine


# (bench flags, the Lengths they draw, shared fraction, levels, expected onsets (wait, preemption),
#  what no client timing can move: ProvenOnsets(wait, preemption, wait proven, preemption proven))
WORKLOADS = {
    # Half of every prompt shared: 48 tokens = 1 full block counted once: 1 + c x 3 <= 16 -> 5 fit,
    # 6 preempt (the block rule without sharing: 5). Proven: 5 can never wait (16 blocks at most) and
    # 6 always waits; whether it also preempts depends on which of the engine's first two steps
    # sees the sixth request (5 + 1 only waits), so far always preempted on the engine.
    "shared-prefix": (["--prompt", "96", "--output", "32", "--shared-prefix", "48"],  # tokens: half of 96
                      Lengths(96, 32), 0.5, [4, 5, 6, 7], (6, 6), ProvenOnsets(6, None, True, False)),
    # Both: 5 streams preempt (its first wave always does); at 4 the drawn requests peak at 14 of 16
    # blocks in the simulator, but 3 streams' largest requests sum to 18 blocks: not proven (the
    # engine has never waited there so far).
    "lognormal+shared": (["--prompt", "80", "--output", "48", "--dist", "lognormal", "--spread", "0.3", "--seed", "1",
                          "--shared-prefix", "50%"],
                         Lengths(80, 48, "lognormal", 0.3, 1), 0.5, [3, 4, 5, 6], (5, 5),
                         ProvenOnsets(None, None, False, False)),
    # The three below are proven even when their first wave reaches the engine spread over 17 steps
    # (~50 ms here; the trace and the normal one: 25). Their prompts are mostly 97-128 tokens (4 blocks) and their requests peak
    # at 5 blocks: 3 streams' largest requests fit at once (15-16 of 16 blocks) whatever the timing;
    # 4 streams' first requests take the 16 blocks at admission, and the first two to grow into a
    # fifth block, long before any of them ends, force a preemption.
    # Uniform lengths, prompt 83-125, output 32-48; the 4-stream wave: (113, 46), (110, 45), (99, 39),
    # (96, 34). Engine: (4, 4).
    "uniform": (["--prompt", "104", "--output", "40", "--dist", "uniform", "--spread", "0.2", "--seed", "0"],
                Lengths(104, 40, "uniform", 0.2, 0), 0.0, [2, 3, 4, 5], (4, 4), ProvenOnsets(4, 4, True, True)),
    # Normal lengths (std 20%), half of every prompt shared (1-2 full blocks counted once); the
    # 4-stream wave: (106, 54), (102, 41), (135, 37), (123, 54). Engine: (4, 4).
    "normal+shared": (["--prompt", "112", "--output", "40", "--dist", "normal", "--spread", "0.2", "--seed", "2",
                       "--shared-prefix", "50%"],
                      Lengths(112, 40, "normal", 0.2, 2), 0.5, [2, 3, 4, 5], (4, 4), ProvenOnsets(4, 4, True, True)),
    # The trace, long prompts with short answers and a few short chats; the 4-stream wave: (103, 53),
    # (116, 37), (110, 28), (59, 25). Engine: (4, 4).
    "trace": (["--trace", "{trace}"], Lengths(trace=TRACE), 0.0, [2, 3, 4, 5], (4, 4), ProvenOnsets(4, 4, True, True)),
}

CONFIG = SchedulerConfig(num_blocks=POOL_BLOCKS, block_size=BLOCK_SIZE, max_num_seqs=128, max_num_batched_tokens=2048,
                         admit_full_prompt=True, max_model_len=512)


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_onsets_are_timing_proof(name):
    """What the client's timing can and cannot move, per workload (no engine: bench's request numbers
    per point are known from the levels)."""
    _, lengths, shared, levels, expected, proof = WORKLOADS[name]
    first = bench_levels_first_index(levels, PER_STREAM)
    loads = {c: closed_loop(c, lengths, PER_STREAM, first[c], shared_prefix=shared) for c in levels}
    onsets = sweep_onsets(CONFIG, levels, loads.__getitem__)
    assert (onsets.first_kv_wait, onsets.first_preemption) == expected
    assert proven_onsets({c: timing_verdict(CONFIG, loads[c]) for c in levels}) == proof
    if proof.proven:  # also when the first wave reaches the engine over 17 steps (~50 ms on the CPU engine)
        assert proven_onsets({c: timing_verdict(CONFIG, loads[c], spread_steps=16) for c in levels}) == proof
        for seed in range(6):  # nor clients late by 0-100 steps at random after the first wave
            def late_load(c, seed=seed):
                def delay(n):
                    return 0.0 if n < first[c] + c else random.Random(f"{seed}:{n}").uniform(0, 100)

                return replace(loads[c], client_delay=delay)

            late = sweep_onsets(CONFIG, levels, late_load)
            assert (late.first_kv_wait, late.first_preemption) == expected


#: Measured on the engine: every workload but this one, whose onsets no client timing can be proven not
#: to move (ProvenOnsets(None, None, False, False)): it measured (5, 5) in every run until CI's of
#: 2026-12-02 measured (6, 6), as the pure lognormal one before it (dropped, see the module notes).
#: Its simulated onsets stay checked above (test_onsets_are_timing_proof).
NOT_ON_THE_ENGINE = {"lognormal+shared"}


@pytest.mark.engine
@engine_required
@pytest.mark.parametrize("name", [n for n in WORKLOADS if n not in NOT_ON_THE_ENGINE])
def test_simulated_onsets_match_the_engine(cpu_engine, tmp_path, name):
    flags, lengths, shared, levels, expected, _ = WORKLOADS[name]
    if "{trace}" in flags:
        trace = tmp_path / "trace.jsonl"
        trace.write_text("".join(json.dumps({"prompt_tokens": p, "output_tokens": m}) + "\n" for p, m in TRACE))
        flags = [str(trace) if f == "{trace}" else f for f in flags]
    proc = subprocess.run(
        kvplan_cmd("--url", cpu_engine.cfg.base_url, "--out", str(tmp_path / "runs"), "--json", "--no-warmup",
                   "--sweep", ",".join(map(str, levels)), "--requests-per-stream", str(PER_STREAM), *flags),
        capture_output=True, text=True, timeout=300, env=bench_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    cap = summary["capacity"]
    cfg = SchedulerConfig(num_blocks=cap["num_blocks"], block_size=cap["block_size"], max_num_seqs=128,
                          max_num_batched_tokens=2048, admit_full_prompt=True, max_model_len=512)
    first_index = {p["concurrency"]: p["first_index"] for p in summary["points"]}
    assert first_index == bench_levels_first_index(levels, PER_STREAM)  # what the timing proof assumed
    onsets = sweep_onsets(cfg, levels, lambda c: closed_loop(c, lengths, PER_STREAM, first_index[c],
                                                               shared_prefix=shared))
    predicted = (onsets.first_kv_wait, onsets.first_preemption)
    measured = (summary["measured_first_kv_wait"], summary["measured_first_preemption"])
    detail = {p["concurrency"]: (p["server"].get("preemptions"), p["server"].get("peak_waiting"),
                                 onsets.results[p["concurrency"]].preemptions) for p in summary["points"]}
    assert predicted == expected, detail
    proof = WORKLOADS[name][5]
    if proof.preemption_proven:
        assert measured == predicted, detail
    else:  # shared-prefix: its wait onset is proven; whether that level also preempts is up to which of the
        # engine's first steps sees its last stream, so the preemption may come a level later
        assert proof.wait_proven and measured[0] == predicted[0], detail
        assert measured[1] in [c for c in levels if c >= predicted[1]], detail
    if name == "shared-prefix":  # the closed-form rule, blind to sharing, is one stream short
        rule = BlockRule(num_blocks=cap["num_blocks"], block_size=cap["block_size"], prompt_tokens=96,
                         output_tokens=32, max_num_seqs=128)
        assert rule.first_preemption == 5 != measured[1]
