"""The bundled data in profiles/ has one shape, cites sources a reader can open, and a broken
model profile fails loudly (a KvplanError naming the file), never silently or with a traceback."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, field_validator

import kvplan.model.source as source
from kvplan.errors import KvplanError
from kvplan.paths import PROFILES_DIR

MODELS = sorted((PROFILES_DIR / "models").glob("*.json"))
GPUS_FILE = PROFILES_DIR / "gpus.json"
URL_RE = re.compile(r"https?://\S+")
NO_SOURCE = "no public source recorded"
# A path on someone's own machine: a home folder, a scratch or work area, a Windows drive, file://.
LOCAL_PATH_RE = re.compile(r"(?<![\w.:/])(/(home|Users|root|tmp|work|mnt|var/folders)/|[A-Za-z]:\\|file://)")


class ModelProfile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    id: str = Field(pattern=r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
    aliases: list[str]
    source: str = Field(pattern=r"^https://\S+$")  # one URL, nothing after it
    source_note: str = Field(min_length=1)
    params_published: str | None
    config: dict[str, Any]

    @field_validator("config")
    @classmethod
    def _config_has_a_shape(cls, v: dict[str, Any]) -> dict[str, Any]:
        assert "model_type" in v or "architectures" in v, "config names no model_type or architectures"
        return v


class GpuRow(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(min_length=1)
    vendor: Literal["nvidia", "amd"]
    # Where it is deployed (kvplan size suggests GPUs of the asked class first, never a desktop part for a
    # datacenter ask): datacenter accelerators, workstation cards, desktop (GeForce, DGX Spark GB10).
    class_: Literal["datacenter", "workstation", "desktop"] = Field(alias="class")
    aliases: list[str] = Field(min_length=1)
    memory_mib: int = Field(gt=0)
    memory_source: str = Field(min_length=1)
    cuda_total_gib: float | int | None = Field(default=None, gt=0)
    cuda_total_source: str | None
    bandwidth_gbps: float | int | None = Field(gt=0)
    bf16_dense_tflops: float | int | None = Field(gt=0)
    fp16_dense_tflops: float | int | None = Field(gt=0)
    perf_source: str = Field(min_length=1)
    # The link a host <-> GPU copy goes over (CPU offload reloads), its rate in one direction, and where it was
    # read ("not sourced: why" when it was not: then no link is given).
    host_link: str | None
    host_link_gbps: float | int | None = Field(gt=0)
    host_link_source: str = Field(min_length=1)
    notes: str
    ambiguous_aliases: list[str] = []
    # CPU and GPU share one memory (GB10): the host's own use counts as used GPU memory (kvplan validate says why it
    # does not judge a TensorRT-LLM or SGLang report's full budget on it).
    unified_memory: bool = False


class GpuCatalog(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    schema_: Literal[1] = Field(alias="schema")
    gpus: list[GpuRow] = Field(min_length=1)


def _strings(value: Any):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _all_data_files() -> list[Path]:
    files = [*MODELS, GPUS_FILE, PROFILES_DIR / "overhead.json", *sorted((PROFILES_DIR / "reports").iterdir())]
    assert len(files) > len(MODELS) + 3
    return files


def _strings_of(path: Path):
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        yield from _strings(json.loads(text))
    elif path.suffix == ".jsonl":
        for line in text.splitlines():
            if line.strip():
                yield from _strings(json.loads(line))
    else:
        yield text


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.name)
def test_each_model_profile_validates_and_is_named_after_its_id(path):
    profile = ModelProfile.model_validate(json.loads(path.read_text(encoding="utf-8")))
    assert path.name == profile.id.replace("/", "--") + ".json"
    assert profile.id.lower() not in {a.lower() for a in profile.aliases}


def test_ids_and_aliases_are_unique_across_profiles():
    owner: dict[str, str] = {}
    for path in MODELS:
        data = json.loads(path.read_text(encoding="utf-8"))
        for name in [data["id"], *data["aliases"]]:
            key = name.lower()
            assert key not in owner, f"{name!r} in {path.name} is already {owner[key]}'s"
            owner[key] = path.name


def test_gpus_json_validates_with_unique_names_and_aliases():
    catalog = GpuCatalog.model_validate(json.loads(GPUS_FILE.read_text(encoding="utf-8")))
    seen: dict[str, str] = {}
    for row in catalog.gpus:
        for name in [row.name, *row.aliases]:
            key = name.lower()
            assert seen.get(key, row.name) == row.name, f"{name!r} names both {seen[key]} and {row.name}"
            seen[key] = row.name
        assert set(row.ambiguous_aliases) <= set(row.aliases), row.name
        assert (row.cuda_total_gib is None) == (row.cuda_total_source is None), row.name
        assert (row.host_link is None) == (row.host_link_gbps is None) == row.host_link_source.startswith("not sourced")


def test_every_gpu_figure_cites_an_openable_source_or_says_it_has_none():
    rows = json.loads(GPUS_FILE.read_text(encoding="utf-8"))["gpus"]
    covers = {"memory_source": ("memory_mib",), "cuda_total_source": ("cuda_total_gib",),
              "perf_source": ("bandwidth_gbps", "bf16_dense_tflops", "fp16_dense_tflops"),
              "host_link_source": ("host_link", "host_link_gbps")}
    for row in rows:
        for field, values in covers.items():
            text = row[field]
            if all(row[v] is None for v in values):
                continue  # nothing to source
            assert URL_RE.search(text) or NO_SOURCE in text, f"{row['name']}.{field}: {text!r}"


def test_every_report_cites_its_origin():
    rows = [json.loads(line) for line in (PROFILES_DIR / "reports" / "vllm-startup-reports.jsonl")
            .read_text(encoding="utf-8").splitlines() if line.strip()]
    assert rows
    for row in rows:
        assert row["source"] and row["case_id"], row


@pytest.mark.parametrize("path", _all_data_files(), ids=lambda p: p.relative_to(PROFILES_DIR).as_posix())
def test_no_data_file_points_outside_the_repository(path):
    for text in _strings_of(path):
        assert "shared/reference" not in text, f"{path.name}: {text[:120]!r}"
        assert not re.search(r"\bshared reference\b", text, re.I), f"{path.name}: {text[:120]!r}"
        found = LOCAL_PATH_RE.search(text)
        assert not found, f"{path.name}: local path {text[max(0, found.start() - 40):found.end() + 40]!r}"


# --- a malformed profile fails loudly ------------------------------------------------------

GOOD = {"id": "acme/tiny", "aliases": ["acme/tiny-instruct"], "source": "https://example.org/config.json",
        "source_note": "test", "params_published": None,
        "config": {"model_type": "llama", "hidden_size": 64}}


@pytest.fixture
def profiles_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(source, "MODELS_DIR", tmp_path)
    source.bundled_index.cache_clear()
    yield tmp_path
    source.bundled_index.cache_clear()


def test_a_temporary_good_profile_loads(profiles_dir):
    (profiles_dir / "acme--tiny.json").write_text(json.dumps(GOOD))
    found = source.load_bundled("ACME/tiny-instruct")
    assert found is not None and found.name == "acme/tiny" and found.config["hidden_size"] == 64
    assert source.bundled_names() == ["acme/tiny"]


@pytest.mark.parametrize("text, says", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "not an object"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "config"}), "no 'config'"),
    (json.dumps({**GOOD, "config": [1]}), "'config' is a JSON list"),
    (json.dumps({**GOOD, "config": "llama"}), "'config' is a JSON str"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "id"}), "no 'id'"),
    (json.dumps({**GOOD, "aliases": "acme/x"}), "'aliases' is not a list"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "source"}), "no 'source'"),
    (b"\xff\xfe{}", "not valid JSON"),
])
def test_a_malformed_profile_is_a_kvplan_error_naming_the_file(profiles_dir, text, says):
    (profiles_dir / "acme--good.json").write_text(json.dumps({**GOOD, "id": "acme/good", "aliases": []}))
    broken = profiles_dir / "acme--broken.json"
    broken.write_bytes(text if isinstance(text, bytes) else text.encode())
    for call in (lambda: source.load_bundled("acme/good"), source.bundled_names, source.bundled_index):
        source.bundled_index.cache_clear()
        with pytest.raises(KvplanError) as err:
            call()
        assert "acme--broken.json" in str(err.value) and says in str(err.value), str(err.value)


def test_a_malformed_profile_is_exit_code_2_without_a_traceback(profiles_dir):
    from typer.testing import CliRunner

    from kvplan.cli.app import app

    (profiles_dir / "acme--broken.json").write_text('{"id": "acme/broken", "aliases": [], "source": "x"}')
    r = CliRunner().invoke(app, ["size", "acme/broken", "--gpu", "H100", "--ctx", "8k"])
    assert r.exit_code == 2, r.output
    assert "acme--broken.json" in r.output and "Traceback" not in r.output
