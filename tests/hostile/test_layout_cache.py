"""The `--layout engine` cache (issue 28, security): an entry decides a verdict without a probe, so it is
used only when it is the one its name claims (the config hash and the vLLM installed now, a successful
probe's layer specs) and only from a folder nobody else can write. The probe and the layout built from
its result are stand-ins here (the real ones: tests/twins/test_engine_layout.py); what is under test is
which entries are trusted."""

from __future__ import annotations

import json
import os

import pytest

from kvplan.vllm import engine_layout

GOOD = {"ok": True, "vllm_version": "0.32.0", "layer_specs": {"model.layers.0.self_attn.attn": {"kind": "full"}},
        "cache_config": {}}


@pytest.fixture
def probes(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(engine_layout, "installed_vllm_version", lambda: "0.32.0")
    monkeypatch.setattr(engine_layout, "probe_config", lambda config: calls.append(config) or dict(GOOD))
    monkeypatch.setattr(engine_layout, "layout_from_probe", lambda case, arch: case)
    return calls


def _plan(config=None):
    return engine_layout.engine_architecture(config or {"model_type": "x", "hidden_size": 8}, None, arch=None)


def _entries(tmp_path):
    return sorted((tmp_path / "cache" / "kvplan" / "layouts").glob("*.json"))


def test_an_entry_is_written_once_and_then_used(tmp_path, probes):
    _plan()
    _plan()
    assert len(probes) == 1
    (entry,) = _entries(tmp_path)
    assert json.loads(entry.read_text())["installed"] == "0.32.0"
    assert (entry.parent.stat().st_mode & 0o777) == 0o700


@pytest.mark.parametrize("tamper", ["another key", "another vLLM", "another named release", "control text in the release",
                                    "a failed probe", "no specs", "not JSON", "a list"])
def test_an_entry_that_is_not_what_its_name_claims_is_probed_again(tmp_path, probes, tamper):
    _plan()
    (entry,) = _entries(tmp_path)
    doc = json.loads(entry.read_text())
    planted = {"another key": dict(doc, key="0" * 24), "another vLLM": dict(doc, installed="0.31.0"),
               # the release the layout's source line names: it must be the installed one, as the key says
               "another named release": dict(doc, vllm_version="0.99.0"),
               "control text in the release": dict(doc, vllm_version="0.32.0\x1b[2J::error::x"),
               "a failed probe": dict(doc, ok=False), "no specs": dict(doc, layer_specs={})}.get(tamper)
    entry.write_text("{nope" if tamper == "not JSON" else "[1]" if tamper == "a list" else json.dumps(planted))
    _plan()
    assert len(probes) == 2


def test_a_planted_entry_with_the_right_name_but_an_old_format_is_not_trusted(tmp_path, probes):
    _plan()
    (entry,) = _entries(tmp_path)
    entry.write_text(json.dumps(GOOD))  # what the cache held before entries were tied to their claims
    _plan()
    assert len(probes) == 2


def test_a_folder_others_can_write_is_never_used(tmp_path, probes):
    folder = tmp_path / "cache" / "kvplan" / "layouts"
    folder.mkdir(parents=True)
    os.chmod(folder, 0o777)
    _plan()
    _plan()
    assert len(probes) == 2 and _entries(tmp_path) == []  # neither read nor written
