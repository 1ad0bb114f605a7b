"""What `kvplan check` writes: a terminal table (or its rows as CSV / Markdown), JUnit XML, a GitHub
step summary, annotations.

- JUnit: one ``<testcase>`` per deployment (``classname`` = the spec file, ``name`` = the
  deployment); a deployment that does not fit has a ``<failure>`` whose message is why. An
  invalid spec gives one ``<testcase name="spec">`` with an ``<error>`` per mistake.
- ``$GITHUB_STEP_SUMMARY``: a Markdown table appended to that file, only when the variable is set.
- Annotations: ``::error file=F,line=L,title=T::message`` workflow commands (GitHub reads them
  from the step's output), one per failing deployment or spec mistake.
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from kvplan.errors import KvplanError
from kvplan.gate.check import CheckReport, DeploymentResult
from kvplan.gate.spec import SpecIssue
from kvplan.paths import write_file_safely
from kvplan.term import Column, esc, fitted_table, left_out_note, make_console, printable
from kvplan.units import format_share, format_tokens

# --- text helpers -----------------------------------------------------------------------------
# Names, models, paths and reasons come from the user's spec (or a bench run folder): every writer
# makes them inert for its reader. The terminal: control characters escaped (no ESC sequences, OSC-8
# links or new lines), rich markup escaped, and workflow-command openers (``::``, ``##[``) broken with a
# zero-width space so no line GitHub reads can start a command. JUnit: characters XML 1.0 forbids are
# written as escapes. The step summary: HTML and Markdown punctuation as character references.

_ZWSP = "\u200b"
_COMMAND_RE = re.compile(r":(?=:)|#(?=#\[)")


def _no_commands(text: str) -> str:
    return _COMMAND_RE.sub(lambda m: m.group() + _ZWSP, text)


def term(text: object) -> str:
    """User text for a rich console line (markup escaped, controls escaped, no workflow commands)."""
    from rich.markup import escape

    return escape(_no_commands(printable(text)))



def _used(share: float | None) -> str:
    return format_share(share, free=False)


def _free(share: float | None) -> str:
    return format_share(share, free=True)


def gpu_label(r: DeploymentResult) -> str:
    return f"{r.gpu_count}x {r.gpu}" if r.gpu_count > 1 else r.gpu


def verdict_label(r: DeploymentResult) -> str:
    return "fits" if r.fits else "DOES NOT FIT"


# --- terminal ---------------------------------------------------------------------------------


#: The terminal table's columns (the records' keys are result_rows' where they are the same figure).
_TABLE_COLUMNS = (Column("deployment", "deployment", right=False, whole=True), Column("gpus", "GPUs", right=False),
                  Column("context", "context"), Column("conc", "conc."), Column("pool_used", "pool used"),
                  Column("margin", "margin"), Column("verdict", "verdict", right=False, whole=True),
                  Column("limiting_term", "limiting term", right=False), Column("suggestion", "suggested fix",
                                                                                right=False))


def render_table(report: CheckReport) -> None:
    from rich.text import Text

    console = make_console()
    cells = [[term(r.name), term(gpu_label(r)), format_tokens(r.context_tokens), str(r.concurrency), _used(r.pool_used),
              _free(r.margin), Text(verdict_label(r), style="green" if r.fits else "red"), term(r.limiting_term),
              term(r.suggestion or "")] for r in report.results]
    columns = list(_TABLE_COLUMNS)
    if not any(r.suggestion for r in report.results):  # no fix to suggest: no empty column to squeeze the others
        columns, cells = columns[:-1], [row[:-1] for row in cells]
    table, left_out = fitted_table(columns, cells, console.width, title=f"kvplan check {term(report.spec)}",
                                   title_justify="left")
    console.print(table)
    for r in report.results:
        if not r.fits:
            console.print(f"[red]x[/] {term(r.name)} ({term(r.file)}:{r.line}, {term(r.model)}): {term(r.reason)}")
    for note in report.notes:
        console.print(f"[yellow]note:[/] {term(note)}")
    color = "green" if report.ok else "red"
    console.print(f"[bold {color}]{report.passed} of {report.total} deployments fit[/]")
    note = left_out_note(left_out, console.width)
    if note:
        console.print(esc(note))


# --- CSV and Markdown (--format) -------------------------------------------------------------------


def result_rows(report: CheckReport) -> list[dict]:
    """One flat record per deployment: the table's columns as raw values, and where it is declared."""
    return [{"deployment": r.name, "model": r.model, "gpu": r.gpu, "gpu_count": r.gpu_count,
             "context_tokens": r.context_tokens, "concurrency": r.concurrency, "pool_blocks": r.pool_blocks,
             "blocks_needed": r.blocks_needed, "pool_used": r.pool_used, "margin": r.margin, "fits": r.fits,
             "limiting_term": r.limiting_term, "suggestion": r.suggestion, "reason": r.reason,
             "file": r.file, "line": r.line} for r in report.results]


def _cell(value: object) -> str:
    return "" if value is None else str(value)


RESULT_COLUMNS = [Column("deployment", "deployment", right=False), Column("model", "model", right=False),
                  Column("gpu", "GPU", right=False), Column("gpu_count", "GPUs"),
                  Column("context_tokens", "context", format_tokens), Column("concurrency", "conc."),
                  Column("pool_used", "pool used", _used), Column("margin", "margin", _free),
                  Column("fits", "verdict", lambda fits: "fits" if fits else "DOES NOT FIT", right=False),
                  Column("limiting_term", "limiting term", right=False),
                  Column("suggestion", "suggested fix", _cell, right=False)]


# --- JUnit ------------------------------------------------------------------------------------


# XML 1.0 allows tab, LF, CR and U+0020-U+D7FF, U+E000-U+FFFD, U+10000-U+10FFFF; C1 controls are
# allowed but discouraged (and are terminal controls in a CI log): both are written as escapes.
_XML_BAD_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")


def xml_text(text: object) -> str:
    """``text`` with every character XML 1.0 forbids (NUL, ESC, lone surrogates...) as a visible escape."""
    return _XML_BAD_RE.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}",
                           str(text))


def _clean_tree(element: ET.Element) -> None:
    for el in element.iter():
        for key, value in el.attrib.items():
            el.set(key, xml_text(value))
        if el.text is not None:
            el.text = xml_text(el.text)
        if el.tail is not None:
            el.tail = xml_text(el.tail)


def junit_xml(report: CheckReport) -> str:
    suite = ET.Element("testsuite", name="kvplan check", tests=str(report.total), failures=str(report.failed),
                       errors="0", skipped="0")
    for r in report.results:
        case = ET.SubElement(suite, "testcase", classname=_classname(report.spec), name=r.name,
                             file=r.file, line=str(r.line), time="0")
        if not r.fits:
            failure = ET.SubElement(case, "failure", message=r.reason, type=r.limiting_term)
            failure.text = _failure_text(r)
        else:
            out = ET.SubElement(case, "system-out")
            out.text = r.reason
    return _document(suite)


def junit_xml_for_issues(spec_file: str, issues: list[SpecIssue]) -> str:
    suite = ET.Element("testsuite", name="kvplan check", tests="1", failures="0", errors="1", skipped="0")
    case = ET.SubElement(suite, "testcase", classname=_classname(spec_file), name="spec", file=spec_file,
                         line=str(issues[0].line or 1) if issues else "1", time="0")
    for issue in issues:
        err = ET.SubElement(case, "error", message=str(issue), type="invalid spec")
        err.text = str(issue)
    return _document(suite)


def _classname(spec_file: str) -> str:
    return "kvplan." + Path(spec_file).name


def _failure_text(r: DeploymentResult) -> str:
    lines = [
        f"{r.name}: {r.model} on {gpu_label(r)}, vLLM {r.vllm_version} rules",
        f"context {r.context_tokens:,} tokens, {r.concurrency} concurrent requests of {r.request_tokens:,} tokens",
        f"why: {r.reason}",
        f"limiting term: {r.limiting_term}",
    ]
    if r.suggestion:
        lines.append(f"suggested fix: {r.suggestion}")
    return "\n".join(lines)


def _document(suite: ET.Element) -> str:
    root = ET.Element("testsuites", name="kvplan", tests=suite.get("tests", "0"),
                      failures=suite.get("failures", "0"), errors=suite.get("errors", "0"))
    root.append(suite)
    _clean_tree(root)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_file(path: str, text: str) -> None:
    write_file_safely(path, text, make_parent=True)


# --- GitHub -----------------------------------------------------------------------------------


# HTML's specials as named references; Markdown's punctuation (emphasis, links, code spans, table
# pipes, headings, escapes) as numeric ones: GitHub shows the characters, and interprets none.
_MD_ESCAPES = {ord(c): f"&#{ord(c)};" for c in "\\`*_[]#|~"}
_MD_ESCAPES.update({ord("&"): "&amp;", ord("<"): "&lt;", ord(">"): "&gt;", ord('"'): "&quot;", ord("'"): "&#39;"})


def _md(text: object) -> str:
    """User text for the step summary: one line, controls escaped, HTML and Markdown inert."""

    return printable(text).translate(_MD_ESCAPES)


def step_summary_markdown(report: CheckReport) -> str:
    mark = "✅" if report.ok else "❌"
    out = [
        f"### {mark} kvplan check <code>{_md(report.spec)}</code>: {report.passed} of {report.total} deployments fit",
        "",
        "| deployment | model | GPUs | context | concurrency | pool used | margin | verdict | limiting term | suggested fix |",
        "|---|---|---|--:|--:|--:|--:|---|---|---|",
    ]
    for r in report.results:
        verdict = "✅ fits" if r.fits else "❌ does not fit"
        out.append(
            f"| {_md(r.name)} | {_md(r.model)} | {_md(gpu_label(r))} | {format_tokens(r.context_tokens)} | "
            f"{r.concurrency} | {_used(r.pool_used)} | {_free(r.margin)} | {verdict} | {_md(r.limiting_term)} | "
            f"{_md(r.suggestion or '')} |"
        )
    failing = [r for r in report.results if not r.fits]
    if failing:
        out.append("")
        out += [f"- **{_md(r.name)}** (<code>{_md(r.file)}:{r.line}</code>): {_md(r.reason)}" for r in failing]
    for note in report.notes:
        out.append(f"- note: {_md(note)}")
    return "\n".join(out) + "\n\n"


def step_summary_for_issues(spec_file: str, issues: list[SpecIssue]) -> str:
    out = [f"### ❌ kvplan check <code>{_md(spec_file)}</code>: the spec is invalid", ""]
    out += [f"- <code>{_md(str(i))}</code>" for i in issues]
    return "\n".join(out) + "\n\n"


def append_step_summary(markdown: str, environ: dict[str, str] | None = None) -> bool:
    """Append to $GITHUB_STEP_SUMMARY if set; True if written."""
    env = os.environ if environ is None else environ
    target = env.get("GITHUB_STEP_SUMMARY", "").strip()
    if not target:
        return False

    try:
        with open(target, "a", encoding="utf-8") as fh:
            fh.write(markdown)
    except OSError as exc:
        raise KvplanError(f"cannot append to $GITHUB_STEP_SUMMARY ({target}): {exc.strerror}") from None
    return True


def _escape_data(text: str) -> str:
    # actions/toolkit core/command.ts: escapeData; other control characters (ESC: colours, OSC-8
    # links) are written as visible escapes first, so the annotation is one plain line.

    text = "\n".join(printable(part, 4000) for part in str(text).replace("\r\n", "\n").split("\n"))
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    # actions/toolkit core/command.ts: escapeProperty
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def annotation(file: str, line: int | None, title: str, message: str) -> str:
    props = [f"file={_escape_property(_workspace_relative(file))}"]
    if line:
        props.append(f"line={line}")
    props.append(f"title={_escape_property(title)}")
    return f"::error {','.join(props)}::{_escape_data(message)}"


def _workspace_relative(file: str) -> str:
    """Annotations need a path relative to the repository root ($GITHUB_WORKSPACE)."""
    workspace = os.environ.get("GITHUB_WORKSPACE")
    path = Path(file)
    if workspace and path.is_absolute():
        try:
            return str(path.relative_to(workspace))
        except ValueError:
            return file
    return file


def annotations(report: CheckReport) -> list[str]:
    out = []
    for r in report.results:
        if r.fits:
            continue
        msg = r.reason + (f" Suggested fix: {r.suggestion}" if r.suggestion else "")
        out.append(annotation(r.file, r.line, f"kvplan: {r.name} does not fit", msg))
    return out


def annotations_for_issues(issues: list[SpecIssue]) -> list[str]:
    return [annotation(i.file, i.line, "kvplan: invalid spec", str(i)) for i in issues]


def annotations_wanted(flag: bool | None, environ: dict[str, str] | None = None) -> bool:
    """--github-annotations/--no-github-annotations; by default on inside GitHub Actions."""
    if flag is not None:
        return flag
    env = os.environ if environ is None else environ
    return env.get("GITHUB_ACTIONS", "").lower() == "true"
