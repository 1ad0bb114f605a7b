"""The shipped GitHub Action (action.yml) and workflow run `kvplan check` on the example spec."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def test_the_action_runs_kvplan_check_with_its_inputs_from_the_environment():
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    steps = action["runs"]["steps"]
    check = next(s for s in steps if s.get("name") == "kvplan check")
    assert 'kvplan check "$KVPLAN_SPEC" --junit "$KVPLAN_JUNIT"' in check["run"]
    assert "${{" not in check["run"]  # inputs reach the script through env only (no injection)
    assert any(s.get("uses", "").startswith("actions/upload-artifact@") for s in steps)


def test_the_shipped_workflow_checks_the_example_spec_and_it_fits(tmp_path):
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "kvplan-check.yml").read_text())
    (job,) = workflow["jobs"].values()
    step = next(s for s in job["steps"] if s.get("uses") == "./")
    spec = step["with"]["spec"]
    assert (ROOT / spec).is_file()
    # What the action's step runs, from a checkout, offline:
    env = dict(os.environ, HF_HUB_OFFLINE="1", GITHUB_ACTIONS="")
    env.pop("GITHUB_STEP_SUMMARY", None)
    out = subprocess.run([sys.executable, "-m", "kvplan", "check", spec, "--junit", str(tmp_path / "j.xml")],
                         cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert (tmp_path / "j.xml").read_text().startswith("<?xml")
