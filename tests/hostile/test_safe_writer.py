"""kvplan's one safe writer (kvplan.paths.write_file_safely), used by every file kvplan writes: a symlink
planted at the target or at a predictable temporary name is never written through; a folder, FIFO or
missing folder is one line and exit 2; a failed write (a full disk) leaves the old file whole and no
temporary file behind (issue 28)."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest
from helpers.harness import invoke

from kvplan.errors import KvplanError
from kvplan.paths import write_file_safely

OLD_RUN = Path(__file__).resolve().parents[1] / "bench" / "data" / "old-run-conc"


def test_a_symlink_at_the_target_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    target = tmp_path / "out.json"
    target.symlink_to(victim)
    write_file_safely(target, "new\n")
    assert victim.read_text() == "precious\n"
    assert not target.is_symlink() and target.read_text() == "new\n"


def test_a_symlink_planted_at_the_old_temporary_names_is_never_used(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    target = tmp_path / "steptime.json"
    for planted in ("steptime.json.tmp", "steptime.tmp", ".steptime.json.tmp"):  # what kvplan used to write to
        (tmp_path / planted).symlink_to(victim)
    write_file_safely(target, "{}\n")
    assert victim.read_text() == "precious\n" and target.read_text() == "{}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["victim.txt", "steptime.json", "steptime.json.tmp", "steptime.tmp", ".steptime.json.tmp"])


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_target_that_is_no_regular_file_is_refused(tmp_path, kind):
    target = tmp_path / "x.html"
    os.mkfifo(target) if kind == "fifo" else target.mkdir()
    with pytest.raises(KvplanError, match="not a regular file"):
        write_file_safely(target, "x")


def test_a_full_disk_leaves_the_old_file_whole_and_no_temporary_file(tmp_path, monkeypatch):
    target = tmp_path / "calibration.json"
    target.write_text("old\n")

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)  # a fake for the failure path: the disk fills during the write
    with pytest.raises(KvplanError, match="No space left on device"):
        write_file_safely(target, "new\n" * 1000, "the calibration profile")
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["calibration.json"]


def test_the_file_is_readable_like_the_run_folders_other_files(tmp_path):
    path = write_file_safely(tmp_path / "a.txt", "x")
    assert path.stat().st_mode & 0o777 == 0o644


# ------------------------------------------------------------------ through the CLI


def _run_copy(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(OLD_RUN, run)
    return run


def test_report_html_through_a_planted_symlink_does_not_touch_its_target(tmp_path):
    run = _run_copy(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    link = tmp_path / "kvplan-report.html"
    link.symlink_to(victim)
    r = invoke("report", str(run), "--html", str(link), "--format", "json")
    assert r.code == 0, r.stderr
    assert victim.read_text() == "precious\n"
    assert not link.is_symlink() and "<html" in link.read_text().lower()
    json.loads(r.stdout)


@pytest.mark.parametrize("where", ["fifo", "missing folder"])
def test_report_html_to_a_place_it_cannot_write_is_one_line_and_exit_2(tmp_path, where):
    run = _run_copy(tmp_path)
    target = tmp_path / ("report.html" if where == "fifo" else "no/such/folder/report.html")
    if where == "fifo":
        os.mkfifo(target)
    r = invoke("report", str(run), "--html", str(target))
    assert r.code == 2, (r.code, r.stderr[-1500:])
    assert "Traceback" not in r.stderr and str(target) in r.one_line_error()
