"""The scheduler simulator's onsets against the real vLLM CPU engine's, for length distributions
and a shared prefix (workloads the closed-form block rule cannot predict).

One engine (the bench tests' pinned pool: 17 blocks of 32, context 512) serves the module;
`kvplan bench --url --sweep LEVELS --no-warmup` measures each workload, and the simulator
replays the very requests bench sent (same lengths, same request numbers per point)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from bench_helpers import (  # noqa: E402
    bench_env,
    cpu_engine_fixture,
    engine_required,
    kvplan_cmd,
)

from kvplan.plan.blocks import BlockRule  # noqa: E402
from kvplan.plan.simulate import Lengths, SchedulerConfig, closed_loop, sweep_onsets  # noqa: E402

pytestmark = [pytest.mark.engine, engine_required]

PER_STREAM = 3


@pytest.fixture(scope="module")
def cpu_engine(tmp_path_factory):
    """tests/bench's engine: one real CPU engine pinned to POOL_BLOCKS x BLOCK_SIZE."""
    yield from cpu_engine_fixture(tmp_path_factory)


# (bench flags, the Lengths they draw, shared fraction, levels, expected onsets (wait, preemption))
WORKLOADS = {
    # (A pure-lognormal workload, 64/64 with spread 0.4, was dropped: the simulator says its drawn
    # requests first preempt at 4 streams, the engine preempted at 4 in some runs and only at 5 in
    # others (two of four CI runs): a borderline case, by a margin the client's timing decides.)
    # Half of every prompt shared: 48 tokens = 1 full block counted once: 1 + c x 3 <= 16 -> 5 fit,
    # 6 preempt (the block rule without sharing: 5).
    "shared-prefix": (["--prompt", "96", "--output", "32", "--shared-prefix", "0.5"],
                      Lengths(96, 32), 0.5, [4, 5, 6, 7], (6, 6)),
    # Both: 5 streams preempt (4 to 7 times, with any client delay between 0 and 16 steps in the
    # simulator); at 4 the drawn requests peak at 14 of 16 blocks.
    "lognormal+shared": (["--prompt", "80", "--output", "48", "--dist", "lognormal", "--spread", "0.3", "--seed", "1",
                          "--shared-prefix", "0.5"],
                         Lengths(80, 48, "lognormal", 0.3, 1), 0.5, [3, 4, 5, 6], (5, 5)),
}


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_simulated_onsets_match_the_engine(cpu_engine, tmp_path, name):
    flags, lengths, shared, levels, expected = WORKLOADS[name]
    proc = subprocess.run(
        kvplan_cmd("--url", cpu_engine.cfg.base_url, "--out", str(tmp_path), "--json", "--no-warmup",
                   "--sweep", ",".join(map(str, levels)), "--requests-per-stream", str(PER_STREAM), *flags),
        capture_output=True, text=True, timeout=300, env=bench_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    cap = summary["capacity"]
    cfg = SchedulerConfig(num_blocks=cap["num_blocks"], block_size=cap["block_size"], max_num_seqs=128,
                          max_num_batched_tokens=2048, admit_full_prompt=True, max_model_len=512)
    first_index = {p["concurrency"]: p["first_index"] for p in summary["points"]}
    onsets = sweep_onsets(cfg, levels, lambda c: closed_loop(c, lengths, PER_STREAM, first_index[c],
                                                               shared_prefix=shared))
    predicted = (onsets.first_kv_wait, onsets.first_preemption)
    measured = (summary["measured_first_kv_wait"], summary["measured_first_preemption"])
    detail = {p["concurrency"]: (p["server"].get("preemptions"), p["server"].get("peak_waiting"),
                                 onsets.results[p["concurrency"]].preemptions) for p in summary["points"]}
    assert predicted == expected, detail
    assert measured == predicted, detail
    if name == "shared-prefix":  # the closed-form rule, blind to sharing, is one stream short
        rule = BlockRule(num_blocks=cap["num_blocks"], block_size=cap["block_size"], prompt_tokens=96,
                         output_tokens=32, max_num_seqs=128)
        assert rule.first_preemption == 5 != measured[1]
