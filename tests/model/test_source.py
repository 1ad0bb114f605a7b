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
