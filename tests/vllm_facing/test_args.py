"""The flags kvplan writes for vLLM (the `vllm serve` line and the bench launcher) are read back by
the installed vLLM's own argument parser into the values kvplan meant. (This folder is not named
``vllm``: on sys.path a ``tests/vllm`` folder would pass for the package where vLLM is not installed.)"""

from __future__ import annotations

import pytest

from kvplan.vllm.args import ENGINE_FIELDS, to_vllm_args

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


def test_vllms_own_parser_reads_back_every_value():
    parser = _vllm_parser()
    parsed = vars(parser.parse_args(["--model", "some/model", *to_vllm_args(VALUES)]))
    assert {field: parsed[field] for field in VALUES} == VALUES
    # utilization is the other way to size the pool (kvplan never writes both)
    util = vars(parser.parse_args(["--model", "m", *to_vllm_args({"gpu_memory_utilization": 0.85})]))
    assert util["gpu_memory_utilization"] == 0.85


def test_the_opposite_booleans_and_defaults():
    parser = _vllm_parser()
    args = to_vllm_args({"enable_prefix_caching": True, "async_scheduling": False, "enforce_eager": False,
                         "max_model_len": None})
    assert args == ["--enable-prefix-caching", "--no-async-scheduling"]
    parsed = vars(parser.parse_args(["--model", "m", *args]))
    assert parsed["enable_prefix_caching"] is True and parsed["async_scheduling"] is False
    assert parsed["enforce_eager"] is False


def test_floats_are_written_exactly_and_unknown_fields_refused():
    assert to_vllm_args({"gpu_memory_utilization": 0.9}) == ["--gpu-memory-utilization", "0.9"]
    assert to_vllm_args({"gpu_memory_utilization": 0.912345678}) == ["--gpu-memory-utilization", "0.912345678"]
    with pytest.raises(ValueError, match="max_tokens"):
        to_vllm_args({"max_tokens": 3})


def test_the_bench_launcher_can_carry_every_flag():
    from dataclasses import fields

    from kvplan.bench.engine import EngineConfig

    assert {f.name for f in fields(EngineConfig)} >= ENGINE_FIELDS


def test_a_kvplan_yaml_deployment_reaches_vllm_whole():
    """kvplan.yaml -> Settings -> engine arguments -> flags -> vLLM's own parser."""
    from kvplan.gate.spec import Deployment
    from kvplan.vllm.args import engine_values

    d = Deployment(name="chat", model="org/m", gpu="4xH100", context="32k", kv_cache_dtype="fp8",
                   gpu_memory_utilization="85%", max_num_seqs=64, enforce_eager=True, block_size=32,
                   max_num_batched_tokens="8k")
    parsed = vars(_vllm_parser().parse_args(["--model", "org/m", *to_vllm_args(engine_values(d.settings(4)))]))
    assert (parsed["max_model_len"], parsed["tensor_parallel_size"], parsed["kv_cache_dtype"]) == (32768, 4, "fp8")
    assert (parsed["gpu_memory_utilization"], parsed["max_num_seqs"], parsed["block_size"]) == (0.85, 64, 32)
    assert parsed["max_num_batched_tokens"] == 8192 and parsed["enforce_eager"] is True
