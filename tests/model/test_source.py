import json
import os

import pytest

from kvplan.errors import KvplanError
from kvplan.model.source import bundled_index, bundled_names, load_bundled, resolve_model


def test_local_folder_and_file(tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 64}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert resolve_model(str(tmp_path)).source == "local"
    assert resolve_model(str(tmp_path / "config.json")).config == cfg


def test_offline_falls_back_to_the_bundled_profile_with_a_note():
    found = resolve_model("meta-llama/Llama-3.1-8B")  # tests run with HF_HUB_OFFLINE=1
    assert found.source == "bundled"
    assert any("offline" in note for note in found.notes)


def test_aliases_resolve_case_insensitively():
    assert resolve_model("meta-llama/llama-3.1-8b-instruct", source="bundled").source == "bundled"


def test_hub_cache_is_used_offline(tmp_path, monkeypatch):
    # The hub cache layout huggingface_hub writes: models--org--name/{refs,snapshots}.
    repo = tmp_path / "models--acme--tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    found = resolve_model("acme/tiny")
    assert found.source == "hub-cache" and found.config["hidden_size"] == 64


def test_unknown_model_suggests_bundled_names():
    with pytest.raises(KvplanError, match="did you mean"):
        resolve_model("meta-llama/Llama-3.1-8X")


def test_at_least_30_bundled_profiles_each_with_a_source():
    names = bundled_names()
    assert len(names) >= 30
    for file in set(bundled_index().values()):
        data = json.loads(file.read_text())
        assert data["source"] and isinstance(data["config"], dict), file.name
    assert load_bundled("openai/gpt-oss-20b").config["model_type"] == "gpt_oss"
    assert os.environ["HF_HUB_OFFLINE"] == "1"
