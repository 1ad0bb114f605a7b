"""The wheel must carry every package and the data: a missed folder only shows after `pip install .`."""

import tomllib
from pathlib import Path

from kvplan.paths import PROFILES_DIR

ROOT = Path(__file__).resolve().parent.parent


def test_pyproject_lists_every_package_folder():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    on_disk = {
        ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "kvplan").rglob("__init__.py")
    }
    assert on_disk <= listed, f"add to pyproject packages: {sorted(on_disk - listed)}"
    assert config["package-dir"]["kvplan.profiles"] == "profiles"


def test_profiles_are_found():
    assert (PROFILES_DIR / "gpus.json").is_file()
    assert len(list((PROFILES_DIR / "models").glob("*.json"))) >= 30
