"""The hostile-input corpus: every bad input is exit 2, exactly one line on stderr, no traceback.

Generated parametrically; in-process (fast) through kvplan.cli.app.main_exit_code. Time and
memory bombs are in test_bombs.py (capped subprocesses)."""

from __future__ import annotations

import json
import os

import pytest
from helpers.harness import ROOT, invoke, not_a_file

TINY = ROOT / "tests" / "fixtures" / "tiny-llama"
MODEL = "meta-llama/Llama-3.1-8B"

BAD_TOKENS = ["inf", "-inf", "nan", "NaN", "-1", "0", "9" * 400, "1e400", "1e5", "32q", "", " ", "[/]", "[bold]x",
              "\x1b[31m8k", "1.5", "12,34", "0x100", "8k8k", "∞", "٣٢", "1" * 30, "-0", "+5"]
BAD_BYTES = ["inf", "nan", "-1GiB", "0", "0GiB", "9" * 400 + "GiB", "1e400", "24", "24XB", "GiB", "", "[/]",
             "9" * 25 + "GiB", "2000000000000TiB", "1.0.0GiB", "24 G i B"]
BAD_FRACTIONS = ["nan", "inf", "-inf", "0", "-0.5", "1.5", "200%", "9" * 400, "abc", "", "[/]", "0.9.1"]
BAD_FLOATS = ["nan", "inf", "-inf", "-1", "0", "1e400"]


def bad(*argv: str, env: dict | None = None) -> str:
    r = invoke(*argv, env=env)
    assert r.code == 2, f"exit {r.code} for {argv!r}:\n{r.stderr[-2000:]}\n{r.stdout[-500:]}"
    return r.one_line_error()


# --- size: option values --------------------------------------------------------------------------

@pytest.mark.parametrize("value", BAD_TOKENS)
@pytest.mark.parametrize("option", ["--ctx", "--prompt", "--output", "--shared-prefix"])
def test_size_token_options(option, value):
    if option in ("--output", "--shared-prefix") and value in ("0", "-0"):
        pytest.skip("zero output / shared prefix is allowed")
    bad("size", MODEL, "--gpu", "H100", option, value)


@pytest.mark.parametrize("value", BAD_BYTES)
@pytest.mark.parametrize("option", ["--gpu-mem", "--kv-memory"])
def test_size_byte_options(option, value):
    args = ["size", MODEL, option, value] + ([] if option == "--gpu-mem" else ["--gpu", "H100"])
    bad(*args)


@pytest.mark.parametrize("value", BAD_FRACTIONS)
def test_size_utilization(value):
    bad("size", MODEL, "--gpu", "H100", "--gpu-memory-utilization", value)


@pytest.mark.parametrize("name", ["[/]", "[bold red]x[/]", "a" * 5000, "\x1b]8;;http://x\x07y", "../../etc/passwd",
                                  "org/" + "n" * 300, "\x00", "m\nodel"])
def test_size_hostile_model_names(name):
    bad("size", name, "--gpu", "H100")


# --- size: hostile config.json ----------------------------------------------------------------------

def _config_cases() -> dict[str, bytes]:
    base = json.loads((TINY / "config.json").read_text())
    cases = {
        "deep-list": b"[" * 100_000,
        "deep-object": b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
        # Non-finite values are refused where kvplan reads the field (an unread Infinity is accepted:
        # tests/model/test_source.py::test_bundled_configs_as_plain_json).
        "infinity": json.dumps(dict(base, max_position_embeddings=float("inf"))).encode(),
        "infinity-heads": json.dumps(dict(base, num_key_value_heads=float("-inf"))).encode(),
        "infinity-quant": json.dumps(dict(base, quantization_config={"quant_method": "gptq", "bits": float("inf")})).encode(),
        "nan": json.dumps(dict(base, hidden_size=float("nan"))).encode(),
        "rope-infinity": json.dumps(dict(base, rope_scaling={"type": "linear", "factor": float("inf")})).encode(),
        "huge-int": json.dumps(dict(base, hidden_size=12345)).replace("12345", "9" * 5000).encode(),
        "not-utf8": b'{"model_type": "llama", "name": "\xff\xfe"}',
        "utf16": json.dumps(base).encode("utf-16"),
        "not-json": b"model_type = llama",
        "empty": b"",
        "list": b"[1, 2, 3]",
        "string": b'"llama"',
        "truncated": json.dumps(base).encode()[:-10],
        "nul": b"\x00" * 100,
    }
    for name, patch in {  # negative or zero sizes that were planned as real (issue 21)
        "sliding-window-negative": {"model_type": "mistral", "sliding_window": -4096},
        "kv-shared-layers-negative": {"num_kv_shared_layers": -3},
        "max-position-negative": {"max_position_embeddings": -5},
        "gptq-bits-0": {"quantization_config": {"quant_method": "gptq", "bits": 0, "group_size": 128}},
        "gptq-bits-negative": {"quantization_config": {"quant_method": "gptq", "bits": -4, "group_size": 128}},
        "gptq-group-negative": {"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": -7}},
        "compressed-bits-0": {"quantization_config": {"quant_method": "compressed-tensors",
                                                      "config_groups": {"g": {"weights": {"num_bits": 0}}}}},
    }.items():
        cases[name] = json.dumps(dict(base, **patch)).encode()
    for field in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size"):
        for value in (0, -1, 10**7 if field == "num_hidden_layers" else 10**9, "eight", True, [1]):
            cases[f"{field}={value!r}"] = json.dumps(dict(base, **{field: value})).encode()
    return cases


CONFIGS = _config_cases()


@pytest.mark.parametrize("case", list(CONFIGS))
def test_size_hostile_config(case, tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_bytes(CONFIGS[case])
    bad("size", str(tmp_path / "m"), "--gpu", "H100", "--ctx", "512")


@pytest.mark.parametrize("target", ["/dev/zero", "/dev/null", "fifo", "folder", "missing", "symlink-loop"])
def test_size_config_not_a_file(target, tmp_path):
    path = tmp_path / "config.json"
    if target == "fifo":
        os.mkfifo(path)
    elif target == "folder":
        (path / "x").mkdir(parents=True)
    elif target == "symlink-loop":
        path.symlink_to(path)
    elif target.startswith("/dev"):
        path.symlink_to(target)
    arg = str(path) if target != "missing" else str(tmp_path / "nope" / "config.json")
    bad("size", arg, "--gpu", "H100")


@pytest.mark.parametrize("pair", ["x", "=1", "a=" + "[" * 10_000, "num_key_value_heads=Infinity",
                                  "num_key_value_heads=" + "9" * 5000, "num_hidden_layers=-3", "head_dim=0"])
def test_size_bad_set(pair):
    bad("size", str(TINY), "--gpu", "H100", "--set", pair)


# --- calibration profile ------------------------------------------------------------------------------

CALIBRATIONS = {
    "not-json": b"{",
    "deep": b"[" * 10_000,
    "not-utf8": b"\xff\xfe{}",
    "no-key": b"{}",
    "list": b"[]",
    "rows-not-list": b'{"calibrations": 5}',
    "row-not-object": b'{"calibrations": [1]}',
    "wrong-types": json.dumps({"calibrations": [{"gpu": 1, "vllm_version": [], "model_family": None}]}).encode(),
    "nan": b'{"calibrations": [{"gpu": "H100", "weights_gib": NaN}]}',
    "huge": b'{"calibrations": ' + b"9" * 5000 + b"}",
}


@pytest.mark.parametrize("case", list(CALIBRATIONS))
def test_malformed_calibration_profile(case, tmp_path):
    folder = tmp_path / "cal"
    folder.mkdir()
    (folder / "calibration.json").write_bytes(CALIBRATIONS[case])
    line = bad("size", MODEL, "--gpu", "H100", env={"KVPLAN_CONFIG_DIR": str(folder)})
    assert "calibration.json" in line


# --- check: hostile kvplan.yaml ----------------------------------------------------------------------

GOOD = {"name": "chat", "model": MODEL, "gpu": "H100", "context": "8k", "concurrency": 1}
SPEC_VALUES = {
    "context": [".inf", "-.inf", ".nan", "9" * 400, "-1", "0", "[1, 2]", "{a: 1}", "32q"],
    "concurrency": [".inf", ".nan", "0", "-1", "9" * 400, "x"],
    "gpu_mem": [".inf", ".nan", "-1GiB", "0"],
    "gpu_memory_utilization": [".inf", ".nan", "0", "2", "-1"],
    "headroom": [".inf", ".nan", "1", "-0.5"],
    "prompt": [".inf", "1e400", "-5"],
    "kv_cache_memory": [".inf", "nan", "0GiB"],
    "tp": [".inf", "0", "-2"],
    "block_size": [".nan", "0"],
}


@pytest.mark.parametrize("key,value", [(k, v) for k, values in SPEC_VALUES.items() for v in values])
def test_check_spec_bad_values(key, value, tmp_path):
    lines = [f"  - {k}: {json.dumps(v)}" if i == 0 else f"    {k}: {json.dumps(v)}"
             for i, (k, v) in enumerate(GOOD.items()) if k != key]
    lines.append(f"    {key}: {value}")
    spec = tmp_path / "kvplan.yaml"
    spec.write_text("deployments:\n" + "\n".join(lines) + "\n")
    line = bad("check", str(spec))
    assert f"{spec}:" in line and key in line


SPECS = {
    "alias-bomb": "\n".join([f'{chr(97 + i)}: &{chr(97 + i)} [' + ",".join([f"*{chr(96 + i)}"] * 9) + "]"
                             for i in range(1, 9)]).replace("[*`", '["lol"').replace(",*`", ',"lol"'),
    "self-alias": "deployments: &x\n  - *x\n",
    "deep": "deployments: " + "[" * 5000 + "]" * 5000 + "\n",
    "deep-map": "a:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 200)),
    "not-yaml": "deployments: [\n",
    "tab": "deployments:\n\t- name: x\n",
    "python-tag": "deployments: !!python/object/apply:os.system ['true']\n",
    "empty": "",
    "scalar": "42\n",
    "not-a-list": "deployments: 5\n",
    "empty-list": "deployments: []\n",
    "many-aliases": "x: &x 1\ndeployments:\n" + "".join("  - *x\n" for _ in range(500)),
    "merge-bomb": "a: &a {x: 1}\nb: &b {<<: [*a, *a, *a]}\n" + "".join(f"c{i}: {{<<: *b}}\n" for i in range(200)),
}


@pytest.mark.parametrize("case", list(SPECS))
def test_check_hostile_spec(case, tmp_path):
    spec = tmp_path / "kvplan.yaml"
    spec.write_text(SPECS[case])
    r = invoke("check", str(spec))
    assert r.code == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert r.stderr.splitlines() and all(line.startswith("error: ") for line in r.stderr.splitlines())


@pytest.mark.parametrize("data", [b"\xff\xfe\x00d", b"deployments:\n  - name: \xe9\n"])
def test_check_spec_not_utf8(data, tmp_path):
    spec = tmp_path / "kvplan.yaml"
    spec.write_bytes(data)
    assert "UTF-8" in bad("check", str(spec))


@pytest.mark.parametrize("target", ["dev-symlink", "fifo", "folder", "missing"])
def test_check_spec_not_a_file(target, tmp_path):
    bad("check", not_a_file(tmp_path / "kvplan.yaml", target))


SUMMARIES = {
    "deep": b"[" * 10_000, "not-json": b"{", "not-utf8": b"\xff", "list": b"[]", "no-model": b"{}",
    "nan": b'{"model": "x", "measured_first_preemption": NaN}',
    "huge": b'{"model": "x", "measured_first_preemption": ' + b"9" * 5000 + b"}",
}


@pytest.mark.parametrize("case", list(SUMMARIES))
def test_check_bad_bench_summary(case, tmp_path):
    spec = tmp_path / "kvplan.yaml"
    spec.write_text(f"deployments:\n  - name: chat\n    model: {MODEL}\n    gpu: H100\n    context: 8k\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_bytes(SUMMARIES[case])
    bad("check", str(spec), "--bench", str(run))


# --- check-log, calibrate: logs -------------------------------------------------------------------

@pytest.mark.parametrize("target", ["/dev/zero", "fifo", "folder", "missing", "dev-symlink"])
@pytest.mark.parametrize("command", ["check-log", "calibrate"])
def test_logs_that_are_not_files(command, target, tmp_path):
    extra = ["--gpu", "H100"] if command == "calibrate" else []
    bad(command, not_a_file(tmp_path / "engine.log", target), *extra)


@pytest.mark.parametrize("value", BAD_FLOATS + ["1", "2"])
def test_check_log_tolerance(value, tmp_path):
    log = tmp_path / "x.log"
    log.write_text("nothing\n")
    bad("check-log", str(log), "--tolerance", value)


LOGS = {
    "empty": "",
    "words": "word " * 8000,
    "digits": "KV cache size: " + "9" * 4000 + " tokens\n",
    "names-dev-zero": "INFO non-default args: {'model': '/dev/zero'}\nGPU KV cache size: 100 tokens\n",
    "markup": "INFO non-default args: {'model': '[/][bold]x'}\nGPU KV cache size: 100 tokens\n",
}


@pytest.mark.parametrize("case", list(LOGS))
def test_check_log_unusable_logs(case, tmp_path):
    log = tmp_path / "x.log"
    log.write_text(LOGS[case])
    bad("check-log", str(log))


# --- validate -----------------------------------------------------------------------------------------

REPORTS = {"empty": b"", "not-json": b"{\n", "deep": b"[" * 10_000 + b"\n", "not-utf8": b"\xff\xfe\n",
           "nan": b'{"x": NaN}\n', "huge": b"9" * 5000 + b"\n"}


@pytest.mark.parametrize("case", list(REPORTS))
def test_validate_bad_reports(case, tmp_path):
    file = tmp_path / "r.jsonl"
    file.write_bytes(REPORTS[case])
    bad("validate", str(file))


@pytest.mark.parametrize("target", ["/dev/zero", "fifo", "folder", "missing"])
def test_validate_reports_not_a_file(target, tmp_path):
    bad("validate", not_a_file(tmp_path / "r.jsonl", target))


# --- bench: option values (all refused before anything starts) ---------------------------------------

@pytest.mark.parametrize("value", BAD_FLOATS)
@pytest.mark.parametrize("option", ["--request-timeout", "--scrape-interval", "--startup-timeout"])
def test_bench_positive_floats(option, value, tmp_path):
    bad("bench", str(TINY), option, value, "--out", str(tmp_path))


@pytest.mark.parametrize("option,value", [("--spread", "nan"), ("--spread", "inf"), ("--spread", "-1"),
                                          ("--shared-prefix", "nan"), ("--shared-prefix", "2k"),
                                          ("--shared-prefix", "0.5"), ("--shared-prefix", "150%"),
                                          ("--shared-prefix", "nan%"),
                                          ("--engine-cmd", "python '"), ("--engine-cmd", ""), ("--port", "70000"),
                                          ("--port", "-1"), ("--sweep", "1,x"), ("--sweep", "0"), ("--dist", "weird"),
                                          ("--api", "x"), ("--tp", "0"), ("--block-size", "-1"),
                                          ("--url", "ftp://x"), ("--max-concurrency", "0")]
                         + [("--ctx", v) for v in BAD_TOKENS[:8]] + [("--prompt", v) for v in BAD_TOKENS[:8]]
                         + [("--kv-memory", v) for v in BAD_BYTES[:6]])
def test_bench_bad_options(option, value, tmp_path):
    bad("bench", str(TINY), option, value, "--out", str(tmp_path))


@pytest.mark.parametrize("option,value", [("--prometheus", v) for v in (
    "http://", "prometheus:9090", "http://[::1", "http://x:99999", "http://x:0", "\x1b[31mhttp://x", "http://x y",
    "http://" + "a" * 5000, "http://x:9090/#frag")]
                         + [("--selector", v) for v in ("", "{", "}", "{a}", '{a="b"', '{a="b"}}', "{" + "a" * 5000 + "}",
                                                        '{a="\x1b[31m"} or up', "[/]", '{__name__="x"}')]
                         + [("--prometheus-wait", v) for v in BAD_FLOATS]
                         + [("--prometheus-header", v) for v in ("", ":", "x", "a b: c", "Content-Length: 1")])
def test_bench_bad_prometheus_options(option, value, tmp_path):
    extra = [] if option == "--prometheus" else ["--prometheus", "http://127.0.0.1:9"]
    # refused for itself, before Prometheus (nothing answers there) is asked anything
    assert option in bad("bench", str(TINY), *extra, option, value, "--out", str(tmp_path))


TRACES = {"not-utf8": b"\xff\xfe\n", "deep": b"[" * 10_000 + b"\n", "not-json": b"{\n", "empty": b"",
          "huge-prompt": b'{"prompt_tokens": 1000000000000, "output_tokens": 1}\n',
          "nan": b'{"prompt_tokens": NaN, "output_tokens": 1}\n', "negative": b'{"prompt_tokens": -1, "output_tokens": 1}\n',
          "list": b"[1]\n"}


@pytest.mark.parametrize("case", list(TRACES))
def test_bench_bad_traces(case, tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(TRACES[case])
    bad("bench", str(TINY), "--trace", str(trace), "--out", str(tmp_path / "runs"))


@pytest.mark.parametrize("target", ["/dev/zero", "fifo", "folder"])
def test_bench_trace_not_a_file(target, tmp_path):
    bad("bench", str(TINY), "--trace", not_a_file(tmp_path / "t.jsonl", target), "--out", str(tmp_path))


RUN_JSON = {"deep": b"[" * 10_000, "not-json": b"{", "not-utf8": b"\xff", "no-config": b"{}", "list": b"[]",
            "env": json.dumps({"config": {"engine": {"model": "x", "env": [["LD_PRELOAD", "/tmp/evil.so"]]}}}).encode(),
            "engine-cmd": json.dumps({"config": {"engine": {"model": "x", "engine_cmd": ["sh", "-c", "touch pwned"]}}}).encode(),
            "engine-args": json.dumps({"config": {"engine": {"model": "x", "extra_args": ["--evil"]}}}).encode()}


@pytest.mark.parametrize("case", list(RUN_JSON))
def test_bench_resume_refuses_bad_or_untrusted_run_folders(case, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_bytes(RUN_JSON[case])
    bad("bench", "--resume", str(run))
    assert not (tmp_path / "pwned").exists()


# --- report: GuideLLM benchmarks reports saved as YAML (and as JSON) -----------------------------------

def _guidellm(**metric: object) -> dict:
    """A one-benchmark GuideLLM report (tests/bench/data/guidellm-concurrent.json) with a TTFT summary changed."""
    data = json.loads((ROOT / "tests" / "bench" / "data" / "guidellm-concurrent.json").read_text())
    data["benchmarks"] = data["benchmarks"][:1]
    data["benchmarks"][0]["metrics"]["time_to_first_token_ms"]["successful"].update(metric)
    return data


def _yaml(data: object) -> bytes:
    import yaml

    return yaml.dump(data).encode()  # as GuideLLM writes --output-path *.yaml


GUIDELLM_YAML = {
    "alias-bomb": ('a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
        f"{c}: &{c} [" + ",".join([f"*{p}"] * 9) + "]\n" for p, c in zip("abcdefgh", "bcdefghi"))).encode(),
    "torn-string": _yaml(_guidellm())[:3001] + b'"unterminated\n  x: [',
    "many-aliases": b"x: &x 1\nbenchmarks:\n" + b"".join(b"  - *x\n" for _ in range(20_000)),
    "self-alias": b"benchmarks: &x\n  - *x\n",
    "deep": b"benchmarks: " + b"[" * 5000 + b"]" * 5000 + b"\n",
    "deep-map": ("a:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 200))).encode(),
    "torn": _yaml(_guidellm())[:3001],
    "not-yaml": b"benchmarks: [\n",
    "tab": b"benchmarks:\n\t- metrics: {}\n",
    "two-documents": _yaml(_guidellm()) + b"---\n" + _yaml(_guidellm()),
    "empty": b"",
    "scalar": b"42\n",
    "list": b"- 1\n- 2\n",
    "not-a-report": b"deployments:\n  - name: chat\n",
    "python-tag": b"benchmarks: !!python/object/apply:os.system ['touch pwned']\n",
    "inf": _yaml(_guidellm(mean=float("inf"))),
    "nan": _yaml(_guidellm(percentiles={"p99": float("nan")})),
    "huge-float": _yaml(_guidellm(percentiles={"p99": 1.5})).replace(b"p99: 1.5", b"p99: 1.0e+400"),
    "huge-int": _yaml(_guidellm()).replace(b"count: 120", b"count: " + b"9" * 5000, 1),
    "not-utf8": b"benchmarks:\n- metrics: {x: \xff}\n",
    "utf16": _yaml(_guidellm()).decode().encode("utf-16"),
    "nul": b"\x00" * 100,
}


@pytest.mark.parametrize("suffix", [".yaml", ".yml"])
@pytest.mark.parametrize("case", list(GUIDELLM_YAML))
def test_report_hostile_guidellm_yaml(case, suffix, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / f"benchmarks{suffix}"
    path.write_bytes(GUIDELLM_YAML[case])
    assert str(path) in bad("report", str(path))
    assert not (tmp_path / "pwned").exists()


def test_report_hostile_guidellm_yaml_cases_are_what_they_say():
    assert b"p99: 1.0e+400" in GUIDELLM_YAML["huge-float"] and b"9" * 5000 in GUIDELLM_YAML["huge-int"]
    assert b".inf" in GUIDELLM_YAML["inf"] and b".nan" in GUIDELLM_YAML["nan"]


@pytest.mark.parametrize("case", ["inf", "nan", "huge-int", "torn", "list"])
def test_report_the_same_guidellm_reports_as_json(case, tmp_path):
    import yaml

    data = yaml.load(GUIDELLM_YAML[case], Loader=yaml.SafeLoader) if case not in ("huge-int", "torn") else None
    path = tmp_path / "benchmarks.json"
    if case == "huge-int":
        text = json.dumps(_guidellm()).replace('"count": 120', '"count": ' + "9" * 5000, 1)
    elif case == "torn":
        text = json.dumps(_guidellm())[:3001]
    else:
        text = json.dumps(data)
    path.write_text(text)
    bad("report", str(path))


@pytest.mark.parametrize("target", ["dev-symlink", "fifo", "folder", "missing"])
def test_report_guidellm_yaml_not_a_file(target, tmp_path):
    bad("report", not_a_file(tmp_path / "benchmarks.yaml", target))


def test_report_folder_with_a_hostile_benchmarks_yaml(tmp_path):
    (tmp_path / "benchmarks.yaml").write_bytes(GUIDELLM_YAML["alias-bomb"])
    assert "benchmarks.yaml" in bad("report", str(tmp_path))


# --- the global guard -------------------------------------------------------------------------------

def test_unexpected_exception_is_one_line_exit_3(monkeypatch):
    import kvplan.cli.catalog_cmd as catalog

    def boom(*a, **k):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(catalog, "gpu_rows", boom, raising=False)
    monkeypatch.setattr("kvplan.hardware.catalog.load_catalog", boom, raising=False)
    r = invoke("gpus")
    if r.code == 0:
        pytest.skip("gpus does not go through the patched function")
    assert r.code == 3 and "Traceback" not in r.stderr and len(r.stderr.splitlines()) == 1
    r = invoke("--debug", "gpus")
    assert r.code == 3 and "Traceback" in r.stderr


def test_markup_in_a_path_is_printed_not_interpreted(tmp_path):
    line = bad("check", str(tmp_path / "[red]x[/]" / "kvplan.yaml"))
    assert "[red]x[/]" in line
