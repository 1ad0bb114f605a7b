"""`kvplan size --workload FILE --kv-offloading-size GiB`: the CPU tier behind the pool (kvplan.plan.tier_cache),
on a four-request trace small enough to work by hand."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from kvplan.cli.app import app


def run(*args):
    if args[:1] in (("size",), ("fit",)) and "--vllm-version" not in args:
        args = (*args, "--vllm-version", "0.33.0")  # the release these figures were worked for
    return CliRunner().invoke(app, list(args))

# Mooncake lines, one 16-token block per hash id (hash_block_tokens=16); each prompt ends with one token of a
# block of its own, so (P + 3 - 1) % 16 != 0 and a partial block holds one GPU slot after every request.
TRACE = [
    {"timestamp": 0, "input_length": 33, "output_length": 3, "hash_ids": [1, 2, 10]},
    {"timestamp": 1000, "input_length": 33, "output_length": 3, "hash_ids": [3, 4, 11]},
    {"timestamp": 2000, "input_length": 33, "output_length": 3, "hash_ids": [1, 2, 12]},
    {"timestamp": 3000, "input_length": 49, "output_length": 3, "hash_ids": [1, 2, 5, 13]},
]


def test_size_workload_with_a_cpu_tier(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in TRACE))
    # Llama-3.1-8B, block 16: a block of every layer is 2 MiB on one GPU, so 6 MiB (0.005859375 GiB) is 3 chunks;
    # 4 GPU blocks are 3 usable (the null block), 2 cached after each request.
    args = ("size", "meta-llama/Llama-3.1-8B", "--gpu", "L4", "--ctx", "1k", "--num-gpu-blocks-override", "4",
            "--workload", str(trace), "--workload-option", "hash_block_tokens=16", "--kv-offloading-size", "0.005859375")
    result = run(*args, "--json")
    w = json.loads(result.stdout)["workload"]
    t = w["tier"]
    assert (t["tier_chunks"], t["blocks_per_chunk"]) == (3, 1)
    # blocks (ids): r0 (1, 2), r1 (3, 4), r2 (1, 2), r3 (1, 2, 5); 148 prompt tokens.
    # r0, r1 miss and store (r1 evicts 2: tier [1, 4, 3]); the GPU keeps r1's (3, 4).
    # r2: GPU miss, tier hit block 1 (16 tokens), its store of 2 evicts the 1 it loaded -> [4, 3, 2].
    # r3: GPU hits 1, 2 (32 tokens); the tier has no 5: no tier hit.
    assert t["gpu_hit_rate"] == round(32 / 148, 6) and t["tier_hit_rate"] == round(16 / 148, 6)
    assert t["miss_rate"] == round(100 / 148, 6)
    # A tier that never evicts: r2 finds 1 and 2 (32 tokens). 2 chunks: every request evicts the last's: 0;
    # 3 chunks: 16 tokens (50%); 4 chunks keep r0's blocks for r2: 32 (100%)
    assert t["unbounded_tier_hit_rate"] == round(32 / 148, 6)
    assert t["tier_for_share"] == {"50%": 3, "90%": 4, "99%": 4}
    assert t["tier_share_used"] == {"50%": 1.0, "90%": 1.3333, "99%": 1.3333}
    assert t["failed_stores"] == 0
    text = run(*args)
    assert "With the CPU tier" in text.stdout and "tier hits 10.8%" in text.stdout
    assert "90% of an unbounded tier's hits: 4 chunks (64 tokens)" in text.stdout


def test_no_tier_without_the_offloading_size(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in TRACE))
    result = run("size", "meta-llama/Llama-3.1-8B", "--gpu", "L4", "--ctx", "1k", "--workload", str(trace),
                 "--workload-option", "hash_block_tokens=16", "--json")
    assert json.loads(result.stdout)["workload"]["tier"] is None


def test_the_tier_under_arc_and_a_store_threshold(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in TRACE))
    args = ("size", "meta-llama/Llama-3.1-8B", "--gpu", "L4", "--ctx", "1k", "--num-gpu-blocks-override", "4",
            "--workload", str(trace), "--workload-option", "hash_block_tokens=16", "--kv-offloading-size", "0.005859375")
    # the defaults, said: LRU, every offer stored
    t = json.loads(run(*args, "--json").stdout)["workload"]["tier"]
    assert (t["eviction_policy"], t["store_threshold"]) == ("lru", 0)
    # store_threshold 2: r0 offers 1, 2 and r1 3, 4 (once each: not stored); r2 (1, 2) misses the tier and offers
    # them again: stored; r3 hits 1, 2 in the GPU: no tier hit at any size
    result = run(*args, "--kv-offloading-store-threshold", "2", "--json")
    assert result.exit_code == 1, result.output  # (4 GPU blocks do not fit the 1k context)
    t = json.loads(result.stdout)["workload"]["tier"]
    assert (t["eviction_policy"], t["store_threshold"]) == ("lru", 2)
    assert (t["tier_hit_rate"], t["unbounded_tier_hit_rate"]) == (0, 0)
    assert any("store_threshold 2" in n for n in t["notes"]) and any("below the store threshold" in n for n in t["notes"])
    # ARC: r0 T1 [2, 1]; r1 stores 3, 4 evicting T1's 2 (-> B1) -> T1 [1, 4, 3]; r2 hits 1 (16 tokens); its store
    # of 2 (a B1 hit: the target rises to 1) evicts T1's LRU, the 1 it just loaded (a reuse counts when the
    # request finishes: too late) -> T1 [4, 3, 2]. r3: as LRU, no tier hit. The same hits as LRU here.
    result = run(*args, "--kv-offloading-eviction-policy", "arc", "--json")
    t = json.loads(result.stdout)["workload"]["tier"]
    assert (t["eviction_policy"], t["store_threshold"], t["tier_hit_rate"]) == ("arc", 0, round(16 / 148, 6))
    assert any("ARC (eviction_policy arc)" in n for n in t["notes"])
    text = run(*args, "--kv-offloading-eviction-policy", "arc", "--kv-offloading-store-threshold", "3").stdout
    assert "tokens, ARC, store threshold 3): GPU hits" in text


def test_the_tier_settings_need_the_tier_and_a_workload(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in TRACE))
    base = ("size", "meta-llama/Llama-3.1-8B", "--gpu", "L4", "--ctx", "1k")
    for option in (("--kv-offloading-eviction-policy", "arc"), ("--kv-offloading-store-threshold", "2")):
        result = run(*base, "--workload", str(trace), *option)
        assert result.exit_code == 2
        assert f"{option[0]} is for the CPU offload tier" in result.output and "--kv-offloading-size" in result.output
        result = run(*base, "--kv-offloading-size", "1", *option)
        assert result.exit_code == 2 and "is for --workload" in result.output
    result = run(*base, "--workload", str(trace), "--kv-offloading-size", "1", "--kv-offloading-eviction-policy", "fifo")
    assert result.exit_code == 2 and "lru and arc" in result.output
