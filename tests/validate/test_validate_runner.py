"""`kvplan validate`'s runner on the shipped public reports.

Expected figures are what vLLM printed (the reports) and hand arithmetic from the configs.
"""

import json

import pytest

from kvplan.model.source import load_bundled
from kvplan.plan.overhead import load_overhead
from kvplan.validate.cases import page_math, resolve_case
from kvplan.validate.reports import DEFAULT_REPORTS, load_reports
from kvplan.validate.runner import validate


@pytest.fixture(scope="module")
def result():
    return validate()


def case(result, case_id, mode):
    return next(c for c in result.cases if c.case_id == case_id and c.mode == mode)


def test_gemma3_hybrid_page_math_matches_the_rocm_log(result):
    # kv040: 109.86 GiB = 117,961,276,784 B; gemma-3-27b: 52 sliding + 10 full layers, 16 KV heads of 128,
    # a 16-token page = 16 x 16 x 256 x 2 = 131,072 B; group_size 10 -> a block = 1,310,720 B.
    # 117,961,276,784 / 1,310,720 = 89,997.3 -> 89,997 blocks (the log: 89,994; 0.005 GiB is 4 blocks).
    # 7 groups (1 full + 6 sliding, "Add 8 padding layers"): 89,997 // 7 x 16 = 12,856 x 16 = 205,696.
    c = case(result, "kv040", "page")
    assert c.hybrid
    assert c.get("tokens").predicted == 205_696 == c.get("tokens").reported
    assert c.get("blocks").predicted == 89_997
    assert c.get("concurrency").predicted == 50.05  # 89,997 / (256 + 6 x 257) = 50.05


def test_llama_8b_page_math_matches_the_a100_log(result):
    # kv043 (0.15.1): 19.28 GiB / 2 MiB per 16-token block = 9,871.4 -> 9,871 blocks x 16 = 157,936.
    c = case(result, "kv043", "page")
    assert c.get("tokens").predicted == 157_936 == c.get("tokens").reported
    assert c.get("concurrency").predicted == 1.20  # 9,871 / 8,192 = 1.2050 -> "1.20x"


def test_mistral_small_page_math_within_the_rounding_of_the_printed_gib(result):
    # kv036: 40 layers x 2 x 8 x 128 x 2 B = 163,840 B/token; a 128-token block = 20,971,520 B.
    # 28.20 GiB / 20,971,520 = 1,443.8 -> 1,443 blocks -> 184,704 tokens; the engine had 1,444
    # (184,832), i.e. >= 28.2031 GiB, which prints as 28.20: one block lost to the rounding.
    c = case(result, "kv036", "page")
    assert c.get("tokens").predicted == 184_704
    assert abs(c.get("tokens").error_pct) <= c.rounding_bound_pct


def test_every_page_math_miss_but_eagle_is_within_the_rounding_bound(result):
    for c in (c for c in result.cases if c.mode == "page" and c.get("tokens")):
        t = c.get("tokens")
        if c.case_id in ("kv003", "kv048"):  # kv048: test_qwen3_235b_fp8_tp4_page_math_miss
            continue
        assert abs(t.error_pct) <= c.rounding_bound_pct, c.case_id
    for c in (c for c in result.cases if c.mode == "page" and c.get("blocks")):
        assert abs(c.get("blocks").error_pct) <= c.rounding_bound_pct, c.case_id


def test_kv003_eagle_draft_layer(result):
    # The EAGLE draft adds one Llama layer with the target's KV shape (the report's curation:
    # draft_layers 1): 33 layers make a 16-token block 2,162,688 B; 51.63 GiB / 2,162,688 =
    # 25,633.5 -> 25,633 x 16 = 410,128 tokens, what the engine printed.
    c = case(result, "kv003", "page")
    assert c.get("tokens").predicted == 410_128 == c.get("tokens").reported
    # Without the draft layer: 51.63 GiB / 2 MiB = 26,434.6 -> 26,434 x 16 = 422,944 (3.1% high).
    report = next(r for r in load_reports() if r.case_id == "kv003")
    plain = resolve_case(report)
    plain = plain.__class__(**{**plain.__dict__, "settings": plain.settings.replace(draft_layers=0)})
    assert page_math(plain, load_overhead()).kv_cache_tokens_reported == 422_944


def test_full_budget_llama_8b_on_h100(result):
    # kv032 (0.11.0): 79.18 GiB x 0.9 = 71.262 requested; weights 8,030,261,248 params x 2 B = 14.9575;
    # activation 38.3849 B x 1,024 x 128,256 = 4.6950 GiB + 8,192 x 4,096 x 2 B = 0.0625 -> 4.7575;
    # non-torch 0.132: 71.262 - 14.9575 - 4.7575 - 0.132 = 51.415 (the log: 51.38).
    c = case(result, "kv032", "full")
    kv = c.get("available_kv_gib")
    assert kv.predicted == pytest.approx(51.415, abs=0.005)
    assert kv.reported == 51.38
    assert c.get("weights_gib").predicted == pytest.approx(14.9575, abs=1e-4)
    assert kv.in_range


def test_no_gpu_and_known_limits_are_reported_not_hidden(result):
    assert case(result, "kv040", "full").status == "no GPU"
    assert any("V0" in x for x in case(result, "kv001", "full").limits)
    assert any("assumed" in x for x in case(result, "kv013", "full").assumptions)
    assert any("config of meta-llama/Llama-3.3-70B-Instruct" in x for x in case(result, "kv031", "full").assumptions)


def test_a_hybrid_reported_at_0_24_is_exact_in_page_math(result):
    # kv044 (club-3090#612): Qwen3.6-35B-A3B, fp8 KV, prefix caching on, vLLM 0.24.0, 5.98 GiB printed;
    # the engine printed 567,978 tokens and 4.33x for 131,072 tokens.
    tokens = case(result, "kv044", "page").get("tokens")
    assert (tokens.predicted, tokens.reported) == (567_978, 567_978)
    assert case(result, "kv044", "page").get("concurrency").predicted == pytest.approx(4.33, abs=0.005)


def test_goals_as_the_shipped_reports_give_them(result):
    goals = {g.name: g for g in result.goals}
    page = goals["page math: KV tokens"]
    # kv044 and kv047 (hybrids at 0.24.0) and kv049 (0.21.0) among them; kv048's lines may be two ranks' (1.15%
    # apart): shown, named, not judged (test_qwen3_235b_fp8_tp4_page_math_miss).
    assert page.met and page.achieved.startswith("9/9 (100%)")
    assert "not judged (lines of different ranks): kv048" in page.achieved
    full = next(s for s in result.summaries if s.mode == "full" and s.quantity == "available_kv_gib" and s.subset == "all")
    assert full.n == 18 and full.median_abs_pct <= 5
    # The median goal and the "of requested" goal hold; the p90 goal is MISSED (docs/accuracy.md, "Misses"):
    # - kv030 (gpt-oss-120b, 0.11.0): its figures contradict each other (64.38 + 7.38 + 3.33 GiB exceed the
    #   requested 71.26); with the MXFP4 weights as vLLM loads them (64.18 GiB against the printed 64.38)
    #   kvplan predicts no KV memory at all (-0.45 GiB), as vllm#33155 reports for gpt-oss-120b on one H100.
    # - kv048 (Qwen3-235B-A22B-FP8, TP 4, no settings) on the release its date gives (0.9.2): 0.9 x 79.18
    #   = 71.26 GiB requested, predicted 10.04 GiB against 8.11: +23.9%, but +2.7% of the requested memory.
    # kv044, kv047 (nvidia/Qwen3.6-35B-A3B-NVFP4 on an RTX 5090, 0.24.0) were +6.0% / +5.9% of the requested
    # memory until the vision encoder's pass in the profile run was counted (1.74 GiB at its peak against
    # 0.30 GiB for the text run); 0.92 x 31.40 = 28.89 GiB requested, 5.98 and 6.01 GiB printed.
    # kv013 (-3.2%) passes since its container's vLLM (0.19.0) is known: no CUDA-graph term.
    assert not goals["full budget: available KV memory (all reports)"].met
    assert not goals["full budget: available KV memory (V1-engine reports)"].met
    assert full.p90_abs_pct > 10
    of_requested = goals["full budget: available KV memory vs the requested GPU memory"]
    assert of_requested.met and of_requested.achieved.startswith("17/18")
    assert "kv030" in of_requested.achieved
    for case_id, reported in (("kv044", 5.98), ("kv047", 6.01)):
        kv = case(result, case_id, "full").get("available_kv_gib")
        assert kv.reported == reported and abs(kv.error_of_requested_pct) < 1.5, case_id
    assert "kv048" not in of_requested.achieved
    assert "kv013" not in of_requested.achieved
    assert full.loo_median_abs_pct is not None


def test_kv013_rules_are_the_container_s_vllm(result):
    # The report names nvcr.io/nvidia/tritonserver:26.05-vllm-python-py3; Triton's compatibility table
    # (branch r26.05) lists vLLM 0.19.0+6bc3197f for that tag. 0.19 subtracts no CUDA-graph estimate.
    c = case(result, "kv013", "full")
    assert c.vllm_rules == "0.19.0"
    assert any("tritonserver:26.05-vllm-python-py3" in a for a in c.assumptions)
    # L4 x 0.7 = 15.435 GiB requested - weights 2.875 - activation 1.396 - non-torch 0.132 = 11.03 GiB
    # against "about 11.4 GiB".
    assert c.get("available_kv_gib").predicted == pytest.approx(11.03, abs=0.01)


def test_kv048_runs_on_the_release_of_its_date(result):
    # vllm#21348 was filed 2025-07-22 and prints no version: PyPI's newest vLLM then was 0.9.2 (2025-07-08;
    # 0.10.0 came 2025-07-25). 0.9.2 defaults to utilization 0.9 and subtracts no CUDA-graph estimate.
    c = case(result, "kv048", "full")
    assert c.vllm_rules == "0.9.2"
    assert any("2025-07-22" in a for a in c.assumptions)
    assert any(a == "gpu_memory_utilization not given: the version default 0.9" for a in c.assumptions)


def test_qwen3_235b_fp8_tp4_page_math_miss(result):
    # kv048 (vllm#21348): 94 layers, 4 KV heads / TP 4 = 1 head of 128 per GPU, bf16: a 16-token block
    # = 16 x 94 x 2 x 1 x 128 x 2 B = 770,048 B; 8.11 GiB = 8,708,190,453 B -> 11,308 blocks -> 180,928
    # tokens. The engine printed 178,880 = 11,180 blocks (8.02 GiB): 128 blocks fewer, far outside the
    # printing's rounding. vLLM 0.9.2 prints "Available KV cache memory" in every worker and "GPU KV cache size"
    # once per rank from that rank's memory, then keeps the smallest rank's blocks (v1/engine/core.py@0.9.2
    # `_initialize_kv_caches`: get_kv_cache_config per worker, then unify_kv_cache_configs): the report quotes one
    # line of each of 4 GPUs, so they may be two ranks'. 11,180 x 770,048 B = 8,609,136,640 B = 8.018 GiB.
    c = case(result, "kv048", "page")
    t = c.get("tokens")
    assert (t.predicted, t.reported) == (180_928, 178_880)
    assert c.ranks_unpaired
    assert any("178,880 tokens are 8.018 GiB" in lim and "-0.092 GiB" in lim for lim in c.limits)
    # A single-GPU report, or one of a release that prints once after the minimum (0.11.1+), is judged.
    assert not case(result, "kv049", "page").ranks_unpaired
    assert not case(result, "kv036", "page").ranks_unpaired


def test_qwen3_8b_page_math_at_0_21(result):
    # kv049 (LMCache#3430, vLLM 0.21.0): 36 layers x 2 x 8 KV heads x 128 x 2 B = 147,456 B/token, a
    # 16-token block 2,359,296 B; 6.37 GiB / 2,359,296 = 2,899.05 -> 2,899 blocks; from 0.20.1 the tokens
    # line is int(max_concurrency x max_model_len) = int(2,899 / 1,024 x 16,384) = 46,384. The engine
    # printed 46,368 (2,898 blocks = 6.3677 GiB, which also prints as 6.37) and 2.83x (2,899 / 1,024 = 2.831).
    c = case(result, "kv049", "page")
    assert (c.get("tokens").predicted, c.get("tokens").reported) == (46_384, 46_368)
    assert c.get("concurrency").predicted == 2.83
    assert case(result, "kv049", "full").status == "no GPU"  # RTX A5000: not in the catalog


def test_a_second_hybrid_report_at_0_24_is_exact_in_page_math(result):
    # kv047 (club-3090#652): same rig and settings as kv044, 6.01 GiB printed; the engine printed
    # 569,878 tokens and 4.35x for 131,072 tokens.
    c = case(result, "kv047", "page")
    assert (c.get("tokens").predicted, c.get("tokens").reported) == (569_878, 569_878)
    assert c.get("concurrency").predicted == pytest.approx(4.35, abs=0.005)


def test_gpt_oss_weights_against_model_loading_took(result):
    # MXFP4 experts priced as the logged kernel lays them out (tests/model/test_weights_budget.py):
    # Triton on an H100 (kv029 0.11.0, kv030 0.11.0, kv045 0.14.1) and Marlin (kv046, August 2025).
    for case_id, reported in (("kv029", 13.47), ("kv030", 64.38), ("kv045", 64.38), ("kv046", 65.9651),
                              ("kv050", 14.2474), ("kv051", 13.72)):
        # kv050: Qwen3-30B-A3B bf16 over TP 4 (vllm#17469); kv051: gpt-oss-20b on an A100 (Marlin), 0.19.0
        w = case(result, case_id, "full").get("weights_gib")
        assert w.reported == reported
        assert abs(w.error_pct) < 1.0, case_id


def test_a_model_without_config_says_so_and_configs_dir_fixes_it(tmp_path):
    row = {"case_id": "x1", "source": "test", "model": "acme/Unknown-8B", "gpu": "NVIDIA H100 80GB",
           "max_model_len": 8192, "reported_kv_memory_gib": 2.0, "reported_kv_tokens": 16384,
           "vllm_version": "0.11.0"}
    f = tmp_path / "r.jsonl"
    f.write_text(json.dumps(row) + "\n")
    res = validate(f, leave_one_out=False)
    assert {c.status for c in res.cases} == {"no config"}
    # The same Llama-3.1-8B config under the unknown name: 2 GiB / 2 MiB = 1,024 blocks x 16 = 16,384.
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "acme--Unknown-8B.json").write_text(json.dumps(load_bundled("meta-llama/Llama-3.1-8B").config))
    res = validate(f, configs, leave_one_out=False)
    page = next(c for c in res.cases if c.mode == "page")
    assert page.status == "ok" and page.get("tokens").predicted == 16_384


def test_shipped_reports_keep_the_source_fields_verbatim():
    shared = [json.loads(line) for line in DEFAULT_REPORTS.read_text().splitlines()]
    for row in shared:
        assert row["source"] and row["quote"]
        extra = set(row) - {"kvplan"}
        assert "config_model" not in extra  # curation lives under "kvplan", with its reasons
        cur = row.get("kvplan", {})
        if "config_model" in cur:
            assert cur.get("config_note")


def test_docs_accuracy_shows_the_current_figures(result):
    # docs/accuracy.md is generated by benchmarks/fit_overhead.py; a rule change must update it.
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "accuracy.md").read_text()
    for s in (s for s in result.summaries if s.n):
        row = f"| {s.mode} | {s.quantity} | {s.subset} | {s.n} | {s.median_abs_pct:.2f}% | {s.p90_abs_pct:.2f}% |"
        assert row in doc, row
