"""examples/kubernetes/kvplan-bench-job.yaml (issue 26 item 4): the Job's own args, run as the Containerfile's
entrypoint (`kvplan bench`) runs them, against a loopback server in place of the cluster Service and a temporary
folder in place of the volume: the run folder lands on the volume and the summary is the JSON on stdout."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml
from helpers.bench import bench_env, kvplan_cmd
from helpers.fake_server import FakeBehaviour, FakeServer

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "examples" / "kubernetes" / "kvplan-bench-job.yaml"


def _job() -> tuple[dict, dict]:
    docs = list(yaml.safe_load_all(MANIFEST.read_text()))
    job = next(d for d in docs if d["kind"] == "Job")
    claim = next(d for d in docs if d["kind"] == "PersistentVolumeClaim")
    return job, claim


def test_the_job_keeps_its_results_on_a_volume_and_never_retries():
    job, claim = _job()
    spec = job["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert spec["restartPolicy"] == "Never" and job["spec"]["backoffLimit"] == 0
    args = container["args"]
    out = args[args.index("--out") + 1]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volume = next(v for v in spec["volumes"] if v["name"] == mounts[out])
    assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    # The key is read from a Secret through the environment, never given as an argument.
    assert "--api-key" not in args
    key = next(e for e in container["env"] if e["name"] == "OPENAI_API_KEY")
    assert "secretKeyRef" in key["valueFrom"]
    # The Containerfile's entrypoint is what the args are given to.
    assert 'ENTRYPOINT ["kvplan", "bench"]' in (ROOT / "Containerfile").read_text()


def test_the_jobs_args_run_a_bench_that_lands_on_the_volume(tmp_path):
    job, _ = _job()
    (container,) = job["spec"]["template"]["spec"]["containers"]
    args = list(container["args"])
    env = bench_env()
    env.pop("OPENAI_API_KEY", None)
    for e in container["env"]:
        if "value" in e:
            env[e["name"]] = e["value"]
    with FakeServer(FakeBehaviour(tokens=64)) as srv:
        args[args.index("--url") + 1] = srv.url
        args[args.index("--out") + 1] = str(tmp_path)
        proc = subprocess.run(kvplan_cmd(*args), capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout)
    loads = [p["concurrency"] for p in summary["points"]]
    assert loads == [1, 2, 4, 8]
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    for name in ("run.json", "points.jsonl", "summary.json", "report.md"):
        assert (run / name).is_file(), name
    assert json.loads((run / "summary.json").read_text())["points"] == summary["points"]
