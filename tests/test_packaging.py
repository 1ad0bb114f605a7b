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


def test_the_built_wheel_installs_and_sizes_offline(tmp_path):
    """The wheel itself (not the checkout's link) carries the code and the profiles: build it, install
    it into a folder of its own (no dependencies: this venv provides them; no network), and run
    `kvplan size` from it, away from the checkout."""
    import json
    import os
    import shutil
    import subprocess
    import sys
    import zipfile

    # Built from a copy of what the wheel is made of: setuptools writes build/ and *.egg-info into the
    # source tree, and .ci/run runs this test in two venvs at once (the floors job beside the main one).
    source = tmp_path / "source"
    shutil.copytree(ROOT / "kvplan", source / "kvplan", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "profiles", source / "profiles")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(wheels), str(source)], check=True, capture_output=True, timeout=300)
    (wheel,) = wheels.glob("kvplan-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "kvplan/profiles/gpus.json" in names and "kvplan/profiles/models/meta-llama--Llama-3.1-8B.json" in names
    assert not any(n.startswith(("tests/", "profiles/")) for n in names)
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target",
                    str(target), str(wheel)], check=True, capture_output=True, timeout=300)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import kvplan; "
            "assert kvplan.__file__.startswith(sys.argv[1]), kvplan.__file__; "
            "sys.argv = ['kvplan', 'size', 'meta-llama/Llama-3.1-8B', '--gpu', '4090', '--ctx', '32k', '--json', "
            "'--vllm-version', '0.33.0']; "  # fits there (0.34's pool sized after warmup does not hold 32k)
            "from kvplan.cli.app import run; run()")
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", code, str(target)], cwd=tmp_path, capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    plan = json.loads(out.stdout)
    # meta-llama/Llama-3.1-8B: 2 x 32 layers x 8 KV heads x 128 x 2 B
    assert plan["kv_bytes_per_token"] == 131_072 and plan["model_source"] == "bundled"


def test_bench_without_its_extra_is_one_line_naming_it(tmp_path):
    """The base install (no aiohttp: the `bench` extra is not installed) answers `kvplan bench` with one line
    naming the extra, exit 2, and leaves no run folder behind."""
    import os
    import subprocess
    import sys

    code = ("import sys; sys.modules['aiohttp'] = None  # as if not installed\n"
            "from kvplan.cli.app import main_exit_code\n"
            "sys.exit(main_exit_code(['bench', 'meta-llama/Llama-3.1-8B', '--out', sys.argv[1]]))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "runs")], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "error: this command needs kvplan's 'bench' extra (aiohttp not installed) (pip install 'kvplan[bench]')"]
    assert list(tmp_path.iterdir()) == []
