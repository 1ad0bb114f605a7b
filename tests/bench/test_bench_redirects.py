"""One HTTP policy for every request of a run (issue 28, security): no request follows a redirect, so the
key, the --header values and the URL's credentials never reach an origin the user did not name; URL
credentials a server echoes back are masked in every file; `--resume` without `--url` does not hand
$OPENAI_API_KEY to the server the run folder names. Against the fake server on loopback and a second one
as the other origin (no engine)."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import pytest
from helpers.bench import bench_env, kvplan_cmd
from helpers.fake_server import FakeBehaviour, FakeServer

from kvplan.bench.client import credential_secrets

KEY = "sk-key-7d41c9e2b0"
TOKEN = "gw-token-5f1e9c0a"
URL_PASSWORD = "url-pw-c0ffee42"
ENV_KEY = "sk-env-9a8b7c6d5e"
SMALL = ["--sweep", "1", "--requests", "2", "--prompt", "8", "--output", "2", "--scrape-interval", "0.05",
         "--no-warmup", "--json"]


def _cli(args: list[str], **env: str) -> subprocess.CompletedProcess:
    full = bench_env()
    for var in ("OPENAI_API_KEY", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        full.pop(var, None)
    full.update(env)
    return subprocess.run(kvplan_cmd(*args), capture_output=True, text=True, timeout=120, env=full)


def _files_hold(root: Path, *secrets: str) -> list[str]:
    return [f"{s} in {p}" for p in root.rglob("*") if p.is_file() for s in secrets if s.encode() in p.read_bytes()]


def _with_credentials(url: str) -> str:
    return url.replace("http://", f"http://alice:{URL_PASSWORD}@")


@pytest.mark.parametrize("status", [302, 307])
@pytest.mark.parametrize("route", ["/v1/models", "/health", "/metrics", "/v1/completions"])
def test_no_request_follows_a_redirect_to_another_origin(tmp_path, route, status):
    with FakeServer(FakeBehaviour(tokens=2)) as other, FakeServer(FakeBehaviour(tokens=2)) as srv:
        srv.behaviour.redirect[route] = (status, other.url + route)
        proc = _cli(["--url", _with_credentials(srv.url), "--api-key", KEY, "--header", f"X-Gateway-Token: {TOKEN}",
                     *SMALL, "--out", str(tmp_path)])
        reached = list(other.behaviour.seen)
        redirected = [path for path, _ in srv.behaviour.seen if path == route]
    assert redirected, "the route was never asked for: the test would prove nothing"
    assert reached == [], reached  # not one request, so no credential, reached the other origin
    assert "Traceback" not in proc.stderr
    shown = proc.stdout + proc.stderr + "".join(p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file())
    assert "does not follow redirects" in shown, (proc.returncode, proc.stderr[-2000:])
    if route in ("/v1/models", "/health"):  # the probe: refused before any load, one line, exit 2
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.strip().splitlines()) <= 2 and f"HTTP {status}, a redirect" in proc.stderr
    if route == "/v1/completions":  # every request failed with the reason
        assert proc.returncode == 4, proc.stderr
        assert f"HTTP {status}, a redirect" in proc.stderr
    assert _files_hold(tmp_path, KEY, TOKEN, URL_PASSWORD) == []


def test_url_credentials_a_server_echoes_back_are_masked_in_every_file(tmp_path):
    with FakeServer(FakeBehaviour(status=500, echo_header="Authorization")) as srv:
        proc = _cli(["--url", _with_credentials(srv.url), *SMALL, "--out", str(tmp_path)])
        sent = [h.get("Authorization") for path, h in srv.behaviour.seen if path == "/v1/completions"]
    basic = base64.b64encode(f"alice:{URL_PASSWORD}".encode()).decode()
    assert sent and all(a == f"Basic {basic}" for a in sent)  # the server did get them (and echoed them)
    assert proc.returncode == 4, proc.stderr
    assert "you sent" in proc.stderr and basic not in proc.stdout + proc.stderr
    assert _files_hold(tmp_path, URL_PASSWORD, basic) == []
    assert "you sent 'Basic ***'" in (next(tmp_path.iterdir()) / "requests.jsonl").read_text()


def test_credential_secrets_by_hand():
    basic = base64.b64encode(b"alice:p%w").decode()
    assert set(credential_secrets("http://alice:p%25w@h:1/x")) == {"alice:p%25w", "p%w", "alice:p%w", "p%25w", basic}
    assert credential_secrets("http://TOKEN123@h") == ("TOKEN123", base64.b64encode(b"TOKEN123:").decode())
    assert credential_secrets("http://h:1") == ()


def _stopped_after_one_point(srv: FakeServer, tmp_path: Path) -> Path:
    first = _cli(["--url", srv.url, *SMALL[:1], "1,2", *SMALL[2:], "--out", str(tmp_path)])
    assert first.returncode == 0, first.stderr
    run = next(tmp_path.iterdir())
    lines = (run / "points.jsonl").read_text().splitlines()
    (run / "points.jsonl").write_text(lines[0] + "\n")  # as if stopped after the first point
    (run / "summary.json").unlink()
    return run


def test_resume_keeps_the_environment_key_from_the_server_the_run_folder_names(tmp_path):
    with FakeServer(FakeBehaviour(tokens=2)) as srv:
        run = _stopped_after_one_point(srv, tmp_path)
        srv.behaviour.seen.clear()
        resumed = _cli(["--resume", str(run), "--json"], OPENAI_API_KEY=ENV_KEY)
        without_url = [h.get("Authorization") for _, h in srv.behaviour.seen]
        (run / "summary.json").unlink()
        (run / "points.jsonl").write_text((run / "points.jsonl").read_text().splitlines()[0] + "\n")
        srv.behaviour.seen.clear()
        named = _cli(["--resume", str(run), "--url", srv.url, "--json"], OPENAI_API_KEY=ENV_KEY)
        with_url = [h.get("Authorization") for _, h in srv.behaviour.seen]
    assert resumed.returncode == 0, resumed.stderr
    assert without_url and not any(without_url), without_url  # the resumed point ran, with no key at all
    assert "$OPENAI_API_KEY is not sent to the server the run's run.json names" in resumed.stderr
    assert named.returncode == 0, named.stderr
    assert with_url and all(a == f"Bearer {ENV_KEY}" for a in with_url)  # the server named here gets it
    assert json.loads(named.stdout)["points"][-1]["concurrency"] == 2
