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


def _serve(handler_cls):
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler_cls)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _online_against(monkeypatch, server):
    """Point huggingface_hub at a loopback server and lift the suite's offline switch for it."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")


def test_a_hub_that_never_answers_falls_back_within_the_deadline(monkeypatch):
    # A loopback "Hub" that accepts connections and never replies: the planner must not wait
    # for huggingface_hub's retries, only for its own deadline.
    import http.server
    import time

    import kvplan.model.source as source

    class Hang(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):  # noqa: N802 - http.server's naming
            time.sleep(30)

        do_GET = do_HEAD

        def log_message(self, *args):
            pass

    server = _serve(Hang)
    _online_against(monkeypatch, server)
    monkeypatch.setattr(source, "HUB_TIMEOUT_S", 1)
    start = time.monotonic()
    found = source.resolve_model("meta-llama/Llama-3.1-8B", offline=False)
    assert time.monotonic() - start < 5
    assert found.source == "bundled" and any("did not answer" in n for n in found.notes)
    server.shutdown()


def test_a_hub_error_falls_back_to_the_bundled_profile(monkeypatch):
    import http.server

    import kvplan.model.source as source

    class Missing(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):  # noqa: N802
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_HEAD

        def log_message(self, *args):
            pass

    server = _serve(Missing)
    _online_against(monkeypatch, server)
    found = source.resolve_model("meta-llama/Llama-3.1-8B", offline=False)
    assert found.source == "bundled" and found.notes
    server.shutdown()


def _plain_json_floats(value):
    """transformers 5 re-saves write Infinity as {"__float__": "Infinity"}; the published files hold
    the literal JSON token, which is what a user's config.json has."""
    if isinstance(value, dict):
        if set(value) == {"__float__"}:
            return float(value["__float__"])
        return {k: _plain_json_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain_json_floats(v) for v in value]
    return value


def test_bundled_configs_as_plain_json_are_read_as_bundled(tmp_path):
    """Every bundled config, written out as a user's config.json (literal Infinity included, plus
    Granite-4.0-H's unused `time_step_limit: [0.0, Infinity]`), reads into the same architecture
    as the bundled profile: hostile-input rules never refuse what published configs contain."""
    from kvplan.model.arch import parse_architecture
    from kvplan.model.source import read_profile

    files = sorted(set(bundled_index().values()))
    assert len(files) >= 30
    for number, file in enumerate(files):
        config = _plain_json_floats(read_profile(file)["config"])
        config.setdefault("time_step_limit", [0.0, float("inf")])
        folder = tmp_path / str(number)
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))  # json writes inf as Infinity
        assert "Infinity" in (folder / "config.json").read_text()
        local = resolve_model(str(folder))
        assert local.source == "local"
        bundled = _plain_json_floats(read_profile(file)["config"])
        assert parse_architecture(local.config) == parse_architecture(dict(bundled, time_step_limit=[0.0, float("inf")])), file.name


def test_a_non_finite_value_in_a_field_kvplan_reads_is_refused_with_the_field():
    from kvplan.model.arch import parse_architecture

    config = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 100, "max_position_embeddings": 512}
    assert parse_architecture(dict(config, time_step_limit=[0.0, float("inf")])).num_hidden_layers == 2  # unread
    for field, value in (("head_dim", float("inf")), ("num_key_value_heads", float("nan")),
                         ("rope_scaling", {"rope_type": "yarn", "factor": float("inf")})):
        with pytest.raises(KvplanError, match=f"invalid {field} in config: it holds NaN or Infinity"):
            parse_architecture(dict(config, **{field: value}))
