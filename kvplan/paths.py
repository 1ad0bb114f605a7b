"""Where kvplan's data lives: ``profiles/`` beside the package in a source checkout, and
``kvplan/profiles`` in an installed wheel (pyproject maps one onto the other)."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _profiles_dir() -> Path:
    for candidate in (_PACKAGE / "profiles", _PACKAGE.parent / "profiles"):
        if (candidate / "gpus.json").is_file():
            return candidate
    return _PACKAGE.parent / "profiles"


PROFILES_DIR = _profiles_dir()
