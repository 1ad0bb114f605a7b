"""The flags kvplan writes for vLLM (the `vllm serve` line and the bench launcher) are read back by
the installed vLLM's own argument parser into the values kvplan meant. (This folder is not named
``vllm``: on sys.path a ``tests/vllm`` folder would pass for the package where vLLM is not installed.)"""

from __future__ import annotations

import pytest

from kvplan.vllm.args import ENGINE_FIELDS, EngineArgs, to_vllm_args

VALUES = {
    "max_model_len": 32768,
    "data_parallel_size": 2,
    "enable_expert_parallel": True,
    "tensor_parallel_size": 4,
    "pipeline_parallel_size": 2,
    "kv_cache_memory_bytes": 8 * 1024**3,
    "kv_cache_dtype": "fp8_e4m3",
    "block_size": 32,
    "num_gpu_blocks_override": 1234,
    "max_num_seqs": 64,
    "max_num_batched_tokens": 4096,
    "enforce_eager": True,
    "language_model_only": True,
    "mm_processor_kwargs": {"max_pixels": 1048576},
    "skip_mm_profiling": True,
    "disable_hybrid_kv_cache_manager": True,
    "enable_prefix_caching": False,
    "async_scheduling": True,
    "mamba_ssm_cache_dtype": "float32",
    "decode_context_parallel_size": 2,
    "speculative_config": {"method": "mtp", "num_speculative_tokens": 3},
    "kv_offloading_size": 200.5,
    "kv_offloading_backend": "lmcache",
}


def _vllm_parser():
    pytest.importorskip("vllm")
    from vllm.engine.arg_utils import AsyncEngineArgs

    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # older releases
        from vllm.utils import FlexibleArgumentParser
    return AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())


def test_every_engine_field_is_in_the_round_trip():
    assert set(VALUES) | {"gpu_memory_utilization"} == ENGINE_FIELDS


def test_engine_args_is_the_flag_table_and_reads_a_stored_run_back():
    """One record of the engine arguments: its fields are the flag table's, in its order (launch facts stored
    beside them in run.json, such as the model and port, are not engine arguments and are left out)."""
    from dataclasses import fields

    from kvplan.vllm.args import ENGINE_FLAGS

    assert [f.name for f in fields(EngineArgs)] == [field for field, _, _ in ENGINE_FLAGS]
    stored = {"model": "org/m", "port": 8001, "extra_args": ["--seed", "1"], **VALUES}
    args = EngineArgs.from_stored(stored)
    assert args == EngineArgs(**VALUES) and args.stored() == {**dict.fromkeys(ENGINE_FIELDS), **VALUES}
    assert EngineArgs.from_stored(None) == EngineArgs() and EngineArgs().flags() == []


def test_vllms_own_parser_reads_back_every_value():
    parser = _vllm_parser()
    parsed = vars(parser.parse_args(["--model", "some/model", *to_vllm_args(EngineArgs(**VALUES))]))
    assert {field: parsed[field] for field in VALUES} == VALUES
    # utilization is the other way to size the pool (kvplan never writes both)
    util = vars(parser.parse_args(["--model", "m", *EngineArgs(gpu_memory_utilization=0.85).flags()]))
    assert util["gpu_memory_utilization"] == 0.85


def test_the_opposite_booleans_and_defaults():
    parser = _vllm_parser()
    args = EngineArgs(enable_prefix_caching=True, async_scheduling=False, enforce_eager=False,
                      max_model_len=None).flags()
    assert args == ["--enable-prefix-caching", "--no-async-scheduling"]
    parsed = vars(parser.parse_args(["--model", "m", *args]))
    assert parsed["enable_prefix_caching"] is True and parsed["async_scheduling"] is False
    assert parsed["enforce_eager"] is False


def test_floats_are_written_exactly_and_unknown_fields_refused():
    assert EngineArgs(gpu_memory_utilization=0.9).flags() == ["--gpu-memory-utilization", "0.9"]
    assert EngineArgs(gpu_memory_utilization=0.912345678).flags() == ["--gpu-memory-utilization", "0.912345678"]
    with pytest.raises(TypeError, match="max_tokens"):
        EngineArgs(max_tokens=3)


def test_the_bench_launcher_writes_every_flag_it_is_given():
    """The launcher's command carries the engine arguments whole, through the same writer as `vllm serve`."""
    from kvplan.bench.engine import EngineConfig, build_command

    cfg = EngineConfig(model="org/m", port=8001, args=EngineArgs(**VALUES), extra_args=("--seed", "1"))
    cmd = build_command(cfg, ["vllm", "serve"])
    assert cmd == ["vllm", "serve", "--model", "org/m", "--host", "127.0.0.1", "--port", "8001",
                   *to_vllm_args(EngineArgs(**VALUES)), "--seed", "1"]
    parsed = vars(_vllm_parser().parse_args(["--model", "org/m", *cmd[8:-2]]))  # (--host and --port are the server's)
    assert {field: parsed[field] for field in VALUES} == VALUES


def test_a_kvplan_yaml_deployment_reaches_vllm_whole():
    """kvplan.yaml -> Settings -> engine arguments -> flags -> vLLM's own parser."""
    from kvplan.gate.spec import Deployment
    from kvplan.vllm.args import engine_args

    d = Deployment(name="chat", model="org/m", gpu="4xH100", context="32k", kv_cache_dtype="fp8",
                   gpu_memory_utilization="85%", max_num_seqs=64, enforce_eager=True, block_size=32,
                   max_num_batched_tokens="8k")
    parsed = vars(_vllm_parser().parse_args(["--model", "org/m", *engine_args(d.settings(4)).flags()]))
    assert (parsed["max_model_len"], parsed["tensor_parallel_size"], parsed["kv_cache_dtype"]) == (32768, 4, "fp8")
    assert (parsed["gpu_memory_utilization"], parsed["max_num_seqs"], parsed["block_size"]) == (0.85, 64, 32)
    assert parsed["max_num_batched_tokens"] == 8192 and parsed["enforce_eager"] is True
