"""`kvplan bench --url https://...` (issue 27: TLS options for HTTPS gateways): a real TLS server on loopback with a
certificate made here by openssl (its own CA, the server's certificate for 127.0.0.1): untrusted by default, one line
and exit 2 naming the fix; trusted with --ca-bundle; unverified with --insecure, said in the run's files."""

from __future__ import annotations

import json
import ssl
import subprocess

import pytest
from helpers.bench import bench_env, kvplan_cmd
from helpers.fake_server import FakeBehaviour, FakeServer

SMALL = ["--sweep", "1", "--requests", "2", "--prompt", "8", "--output", "3", "--no-warmup", "--json"]


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")

    def openssl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=kvplan test CA")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
            "-subj", "/CN=127.0.0.1")
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.pem", "-days", "2", "-extfile", "san.ext")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(d / "server.pem", d / "server.key")
    return d, ctx


def _bench(srv, tmp_path, *extra):
    return subprocess.run(kvplan_cmd("--url", srv.url, *SMALL, "--out", str(tmp_path), *extra), capture_output=True,
                          text=True, timeout=120, env=bench_env())


def test_an_untrusted_certificate_is_one_line_naming_the_fix(certs, tmp_path):
    _, ctx = certs
    with FakeServer(FakeBehaviour(), ssl_context=ctx) as srv:
        proc = _bench(srv, tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "TLS certificate is not trusted" in lines[0] and "--ca-bundle" in lines[0], lines
    assert "Traceback" not in proc.stderr and not any(tmp_path.iterdir())  # no run folder left behind


def test_the_ca_bundle_verifies_and_every_request_goes_over_tls(certs, tmp_path):
    d, ctx = certs
    behaviour = FakeBehaviour()
    with FakeServer(behaviour, ssl_context=ctx) as srv:
        proc = _bench(srv, tmp_path, "--ca-bundle", str(d / "ca.pem"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout)
    (point,) = summary["points"]
    assert point["requests_ok"] == 2 and point["status"] == "ok"
    assert summary["tls"] == f"verified with --ca-bundle {d / 'ca.pem'}"
    assert behaviour.requests >= 2 and behaviour.scrapes >= 1  # the load and the scrapes, over TLS
    run = next(tmp_path.iterdir())
    assert json.loads((run / "run.json").read_text())["config"]["ca_bundle"] == str(d / "ca.pem")  # for --resume
    assert f"- TLS: verified with --ca-bundle {d / 'ca.pem'}" in (run / "report.md").read_text()


def test_insecure_skips_verification_and_says_so(certs, tmp_path):
    _, ctx = certs
    with FakeServer(FakeBehaviour(), ssl_context=ctx) as srv:
        proc = _bench(srv, tmp_path, "--insecure")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["tls"] == "NOT verified (--insecure)"
    run = next(tmp_path.iterdir())
    assert "TLS: NOT verified (--insecure)" in (run / "report.html").read_text()


def test_a_ca_bundle_that_cannot_be_read_is_one_line(certs, tmp_path):
    _, ctx = certs
    bad = tmp_path / "not-a-ca.pem"
    bad.write_text("not a certificate\n")
    with FakeServer(FakeBehaviour(), ssl_context=ctx) as srv:
        for path in (bad, tmp_path / "missing.pem"):
            proc = _bench(srv, tmp_path / "out", "--ca-bundle", str(path))
            assert proc.returncode == 2 and "cannot read --ca-bundle" in proc.stderr, proc.stderr
            assert "Traceback" not in proc.stderr
