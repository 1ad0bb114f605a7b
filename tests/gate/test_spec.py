"""kvplan.yaml: valid specs load; every kind of mistake names file:line and the key."""

from __future__ import annotations

import pytest

from kvplan.gate.spec import SpecErrors, load_spec, parse_spec_text

GOOD = """\
defaults:
  vllm_version: "0.11.0"
  gpu: H100
deployments:
  - name: chat
    model: meta-llama/Llama-3.1-8B-Instruct
    max_model_len: 32k
    concurrency: 16
    prompt: 2k
    output: 512
    headroom: 10%
  - name: big
    model: Qwen/Qwen3-32B
    gpu: 4xH100
    tensor_parallel_size: 4
    context: 131072
    kv_cache_dtype: fp8
    gpu_memory_utilization: 0.92
    kv_cache_memory: 40GiB
    shared_prefix: 1k
"""


def issues_of(text: str, file: str = "kvplan.yaml") -> list[str]:
    with pytest.raises(SpecErrors) as info:
        parse_spec_text(text, file)
    return [str(i) for i in info.value.issues]


def test_good_spec_maps_units_aliases_and_defaults():
    spec = parse_spec_text(GOOD, "kvplan.yaml")
    chat, big = (e.deployment for e in spec.entries)
    assert chat.context == 32 * 1024 and chat.prompt == 2048 and chat.output == 512
    assert chat.headroom == 0.10
    assert chat.gpu == "H100" and chat.vllm_version == "0.11.0"  # from defaults
    assert big.gpu == "4xH100" and big.tp == 4  # tensor_parallel_size is an alias of tp
    assert big.context == 131072 and big.kv_cache_dtype == "fp8"
    assert big.kv_cache_memory == 40 * 2**30 and big.shared_prefix == 1024
    assert big.gpu_memory_utilization == 0.92
    assert [e.line for e in spec.entries] == [5, 12]
    assert spec.entries[0].line_of("context") == 7  # written as max_model_len on line 7
    assert spec.entries[0].label("context") == "deployments[0].max_model_len"


def test_bare_list_is_accepted():
    spec = parse_spec_text("- name: a\n  model: meta-llama/Llama-3.1-8B\n  gpu: L4\n")
    assert spec.entries[0].deployment.name == "a"


def test_unknown_key_with_suggestion():
    text = GOOD.replace("    concurrency: 16\n", "    concurency: 16\n")
    (issue,) = issues_of(text)
    assert issue.startswith("kvplan.yaml:8: deployments[0].concurency: unknown key")
    assert "did you mean 'concurrency'" in issue


def test_unknown_top_level_key():
    unknown, missing = issues_of(GOOD.replace("deployments:", "deployment:"))
    assert unknown == "kvplan.yaml:4: deployment: unknown key (did you mean 'deployments'?)"
    assert missing == "kvplan.yaml:1: deployments: required key is missing (list the deployments to check)"


def test_wrong_type():
    (issue,) = issues_of(GOOD.replace("concurrency: 16", "concurrency: lots"))
    assert issue.startswith("kvplan.yaml:8: deployments[0].concurrency: ")
    assert "valid integer" in issue and "'lots'" in issue


def test_bad_unit():
    (issue,) = issues_of(GOOD.replace("max_model_len: 32k", "max_model_len: 32q"))
    assert issue.startswith("kvplan.yaml:7: deployments[0].max_model_len: invalid context length: '32q'")
    (issue,) = issues_of(GOOD.replace("kv_cache_memory: 40GiB", "kv_cache_memory: 40 gigs"))
    assert issue.startswith("kvplan.yaml:19: deployments[1].kv_cache_memory: invalid kv cache memory")
    (issue,) = issues_of(GOOD.replace("gpu_memory_utilization: 0.92", "gpu_memory_utilization: 1.5"))
    assert issue.startswith("kvplan.yaml:18: deployments[1].gpu_memory_utilization: ")
    (issue,) = issues_of(GOOD.replace("headroom: 10%", "headroom: 100%"))
    assert issue.startswith("kvplan.yaml:11: deployments[0].headroom: ")


def test_missing_required_key():
    (issue,) = issues_of(GOOD.replace("    model: Qwen/Qwen3-32B\n", ""))
    assert issue == "kvplan.yaml:12: deployments[1].model: required key is missing"


def test_unknown_kv_dtype_and_numeric_version():
    (issue,) = issues_of(GOOD.replace("kv_cache_dtype: fp8", "kv_cache_dtype: fp7"))
    assert issue.startswith("kvplan.yaml:17: deployments[1].kv_cache_dtype: ")
    # YAML reads 0.10 as the number 0.1: refuse it rather than plan for the wrong release.
    (issue,) = issues_of(GOOD.replace('vllm_version: "0.11.0"', "vllm_version: 0.10"))
    assert issue.startswith("kvplan.yaml:2: defaults.vllm_version: quote the version: YAML read it as the number")


def test_several_mistakes_are_all_reported():
    text = GOOD.replace("concurrency: 16", "concurrency: -1").replace("kv_cache_dtype: fp8", "kv_cache_dtpe: fp8")
    issues = issues_of(text)
    assert [i.split(":")[1] for i in issues] == ["8", "17"]


def test_duplicate_key_alias_clash_and_duplicate_name():
    (issue,) = issues_of(GOOD.replace("    prompt: 2k\n", "    prompt: 2k\n    prompt: 4k\n"))
    assert issue.startswith("kvplan.yaml:10: deployments[0].prompt: duplicate key")
    (issue,) = issues_of(GOOD.replace("    prompt: 2k\n", "    prompt: 2k\n    prompt_tokens: 4k\n"))
    assert issue.startswith("kvplan.yaml:10: deployments[0].prompt_tokens: 'prompt_tokens' and 'prompt'")
    (issue,) = issues_of(GOOD.replace("name: big", "name: chat"))
    assert issue.startswith("kvplan.yaml:12: deployments[1].name: name 'chat' is already used")


def test_yaml_syntax_error_names_its_line():
    (issue,) = issues_of(GOOD.replace("    output: 512\n", "    output: [512\n"))
    assert issue.startswith("kvplan.yaml:") and "not valid YAML" in issue


def test_missing_gpu_and_empty_and_missing_file(tmp_path):
    (issue,) = issues_of("deployments:\n  - name: a\n    model: m\n")
    assert issue.startswith("kvplan.yaml:2: deployments[0].gpu: required key is missing")
    (issue,) = issues_of("deployments: []\n")
    assert issue == "kvplan.yaml:1: deployments: the list is empty"
    (issue,) = issues_of("")
    assert "empty" in issue
    with pytest.raises(SpecErrors) as info:
        load_spec(tmp_path / "nope.yaml")
    assert str(info.value) == f"{tmp_path / 'nope.yaml'}: no such file (pass the path of your kvplan.yaml)"


def test_the_cpu_offload_tier_reaches_the_settings_and_bad_sizes_are_refused():
    text = "- name: a\n  model: meta-llama/Llama-3.1-8B\n  gpu: H100\n  kv_offloading_size: 200\n"
    settings = parse_spec_text(text).entries[0].deployment.settings(1)
    assert (settings.kv_offloading_size, settings.kv_offloading_backend) == (200, None)
    for bad in ("-5", "0", ".inf", "lots"):
        (issue,) = issues_of(text.replace("kv_offloading_size: 200", f"kv_offloading_size: {bad}"))
        assert "kv_offloading_size" in issue, bad
    (issue,) = issues_of(text + "  kv_offloading_backend: nfs\n")
    assert "kv_offloading_backend" in issue
