"""`kvplan check`'s CI outputs stay inert under hostile deployment names, models and paths.

Names carry control characters (NUL, ESC, an OSC-8 link, newlines), GitHub workflow commands
(``::error::``, ``::add-mask::``, ``##[error]``), rich markup and HTML. The JUnit XML must parse
with xml.etree (XML 1.0 forbids most C0 controls); no line of the console output or of the
annotations may start (after leading blanks, as the Actions runner reads it) a workflow command
that kvplan did not mean; no ESC reaches the terminal; the step summary has no live HTML or
Markdown link.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from typer.testing import CliRunner

from kvplan.cli.app import app

runner = CliRunner()
NO_GITHUB = {"GITHUB_ACTIONS": None, "GITHUB_STEP_SUMMARY": None, "GITHUB_WORKSPACE": None}

ESC_LINK = "\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\"
HOSTILE_NAMES = [
    "nul\x00bell\x07vt\x0bff\x0cesc\x1b[31mred",
    "line\n::error file=x.py,line=1::injected",
    "::add-mask::secret",
    "::set-output name=x::y",
    "##[error]v1 command",
    "link " + ESC_LINK,
    "[bold red]markup[/] [/]",
    "<script>alert(1)</script> & <img src=x onerror=alert(2)>",
    "[click](https://evil.example/) `code` **bold** | pipe",
    "c1\x85\x9b31m",
    "\ufffe\uffff",
]

SPEC_HEAD = """\
defaults:
  model: meta-llama/Llama-3.1-8B-Instruct
  gpu: H100
  vllm_version: "0.11.0"
  kv_cache_memory: 16GiB
  context: 32k
  prompt: 8k
  output: 1
deployments:
"""


def _yaml_str(text: str) -> str:
    return json.dumps(text, ensure_ascii=True)  # a JSON string is a YAML double-quoted scalar


def _spec(tmp_path: Path, fits: bool) -> Path:
    body = "".join(f"  - name: {_yaml_str(n)}\n    concurrency: {14 if fits else 40}\n" for n in HOSTILE_NAMES)
    path = tmp_path / "kvplan.yaml"
    path.write_text(SPEC_HEAD + body)
    return path


def _command_lines(text: str) -> list[str]:
    """Lines the GitHub runner would read as workflow commands (v2 ``::`` and v1 ``##[``)."""
    return [ln for ln in text.splitlines() if ln.lstrip().startswith(("::", "##["))]


def _run(tmp_path: Path, fits: bool, *extra: str, **env):
    spec = _spec(tmp_path, fits)
    junit = tmp_path / "out" / "junit.xml"
    summary = tmp_path / "summary.md"
    result = runner.invoke(app, ["check", str(spec), "--junit", str(junit), *extra],
                           env={**NO_GITHUB, "GITHUB_STEP_SUMMARY": str(summary), **env})
    return result, junit, summary


def test_junit_is_valid_xml_with_control_characters(tmp_path):
    for fits in (True, False):
        result, junit, _ = _run(tmp_path, fits)
        assert result.exit_code == (0 if fits else 1), result.output
        raw = junit.read_bytes()
        root = ET.fromstring(raw)  # raises on a character XML 1.0 forbids
        cases = root.findall(".//testcase")
        assert len(cases) == len(HOSTILE_NAMES)
        names = [c.get("name") for c in cases]
        assert not any(re.search("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ufffe\uffff]", n) for n in names)
        assert "nul\\x00bell\\x07vt\\x0bff\\x0cesc\\x1b[31mred" in names  # escaped, not lost
        assert "[bold red]markup[/] [/]" in names and "<script>alert(1)</script> & <img src=x onerror=alert(2)>" in names
        if not fits:
            failures = root.findall(".//failure")
            assert len(failures) == len(HOSTILE_NAMES)
            assert all("\x1b" not in (f.text or "") + (f.get("message") or "") for f in failures)


def test_console_and_annotations_carry_no_injected_commands_or_escapes(tmp_path):
    result, _, _ = _run(tmp_path, False, "--github-annotations")
    assert result.exit_code == 1, result.output
    out = result.stdout
    assert "\x1b" not in out and "\x07" not in out and "\x00" not in out and "\x9b" not in out
    commands = _command_lines(out)
    # Only kvplan's own annotations: one ::error per failing deployment, each a single line.
    assert len(commands) == len(HOSTILE_NAMES), commands
    for line in commands:
        assert line.startswith("::error file=") and "::" in line[2:]
        head, _, message = line[2:].partition("::")
        assert "\n" not in line and "\x1b" not in line
        # properties escape ':' and ',' so a name cannot add a property or end the command early
        props = dict(p.split("=", 1) for p in head[len("error "):].split(","))
        assert set(props) == {"file", "line", "title"}
    # rich markup in a name is printed as written, not interpreted
    assert "[bold red]markup[/] [/]" in out
    assert "OSC" not in out and "https://evil.example/" in out  # the link target shows as text, no live link


def test_console_without_annotations_has_no_command_lines(tmp_path):
    for fits in (True, False):
        result, _, _ = _run(tmp_path, fits, "--no-github-annotations", COLUMNS="40")
        assert result.exit_code == (0 if fits else 1), result.output
        assert _command_lines(result.stdout) == [], result.stdout
        assert "\x1b" not in result.stdout


def test_step_summary_is_html_escaped(tmp_path):
    result, _, summary = _run(tmp_path, False)
    assert result.exit_code == 1, result.output
    text = summary.read_text(encoding="utf-8")
    assert "<script>" not in text and "<img" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; &lt;img src=x onerror=alert(2)&gt;" in text
    assert "](https://evil.example/)" not in text  # no Markdown link: the brackets are references
    assert "\x1b" not in text and "\x00" not in text
    assert _command_lines(text) == []
    # the only live HTML is kvplan's own <code> spans
    assert set(re.findall(r"<(/?\w+)", text)) <= {"code", "/code"}
    # one table row per deployment: no name adds a row or a cell
    rows = [ln for ln in text.splitlines() if ln.startswith("| ") and "deployment" not in ln]
    assert len(rows) == len(HOSTILE_NAMES)
    assert all(ln.count("|") == 11 for ln in rows), rows


def test_hostile_spec_path_and_invalid_spec(tmp_path):
    folder = tmp_path / "::error::b [red]x[ <b>"
    folder.mkdir()
    spec = folder / "kvplan.yaml"
    spec.write_text(SPEC_HEAD + '  - name: "x\\e[2J"\n    concurrency: 0\n')
    summary = tmp_path / "summary.md"
    junit = tmp_path / "j.xml"
    result = runner.invoke(app, ["check", str(spec), "--junit", str(junit), "--github-annotations"],
                           env={**NO_GITHUB, "GITHUB_STEP_SUMMARY": str(summary)})
    assert result.exit_code == 2, result.output
    ET.fromstring(junit.read_bytes())
    text = summary.read_text(encoding="utf-8")
    assert "<b>" not in text and "\x1b" not in text
    assert all(ln.startswith("::error file=") for ln in _command_lines(result.stdout))
