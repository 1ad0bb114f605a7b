"""The wheel must carry the data: profiles/ ships as kvplan/profiles (a link in the checkout)."""

from pathlib import Path

from kvplan.paths import PROFILES_DIR

ROOT = Path(__file__).resolve().parent.parent


def test_profiles_link_points_at_the_data():
    link = ROOT / "kvplan" / "profiles"
    assert link.is_symlink() and link.resolve() == (ROOT / "profiles").resolve()


def test_profiles_are_found():
    assert (PROFILES_DIR / "gpus.json").is_file()
    assert len(list((PROFILES_DIR / "models").glob("*.json"))) >= 30
