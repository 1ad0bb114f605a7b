"""`kvplan check` as the gate tests run it: a spec with three deployments at the edge of the pool (SPEC), one of
them kept (only), run with no GitHub environment (run), and bench run folders that say what was measured (run_dir)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from kvplan.cli.app import app

runner = CliRunner()
NO_GITHUB = {"GITHUB_ACTIONS": None, "GITHUB_STEP_SUMMARY": None, "GITHUB_WORKSPACE": None}

SPEC = """\
defaults:
  model: meta-llama/Llama-3.1-8B-Instruct
  gpu: H100
  vllm_version: "0.11.0"
  kv_cache_memory: 16GiB
  context: 32k
  prompt: 8k
  output: 1
  headroom: 0.1
deployments:
  - name: fits14
    concurrency: 14
  - name: headroom15
    concurrency: 15
  - name: pool17
    concurrency: 17
    headroom: 0
"""



def run(args: list[str], **env):
    return runner.invoke(app, args, env={**NO_GITHUB, **env})


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "kvplan.yaml"
    path.write_text(text)
    return path


def only(name: str) -> str:
    """SPEC with one deployment kept."""
    head, _, body = SPEC.partition("deployments:\n")
    blocks = ["  - " + b for b in body.split("  - ")[1:]]
    return head + "deployments:\n" + "".join(b for b in blocks if f"name: {name}\n" in b)


def run_dir(root: Path, name: str, **summary) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder
