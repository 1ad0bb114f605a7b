"""Find a model's config.json: a local path, the Hugging Face Hub, or a bundled profile.

Order: a local folder or file; the Hub through ``huggingface_hub`` (config.json only;
honours ``HF_TOKEN``, ``HF_HUB_OFFLINE`` and the hub cache, with a 10 s network timeout);
a snapshot bundled in ``profiles/models/``. A gated, missing or unreachable repo falls back
to the bundled profile with a note. The file is parsed as JSON data: no remote code runs.
``huggingface_hub`` is imported only when the Hub is actually consulted.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from kvplan.errors import KvplanError
from kvplan.paths import PROFILES_DIR, load_user_json

MODELS_DIR = PROFILES_DIR / "models"
HUB_TIMEOUT_S = 10
_REPO_ID_RE = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


@dataclass(frozen=True)
class ModelConfig:
    """A raw config and where it came from."""

    name: str
    config: dict[str, Any]
    source: str  # local | hub | hub-cache | bundled
    detail: str  # path, revision or profile source
    notes: tuple[str, ...] = ()


def read_config_file(path: Path) -> dict[str, Any]:
    """Parse a config.json as data, with errors that say where it is broken (regular files only,
    16 MiB at most, UTF-8, nesting capped). NaN and Infinity are kept: published configs carry them in
    fields no KV figure reads (Granite-4.0-H / Nemotron-H ``"time_step_limit": [0.0, Infinity]``); the
    architecture reader refuses a non-finite value in a field it does read (``arch._Fields.get``)."""

    data = load_user_json(path, "", limit=16 * 1024 * 1024, allow_nonfinite=True)
    if not isinstance(data, dict):
        raise KvplanError(f"{path} does not hold a JSON object")
    return data


def read_profile(file: Path) -> dict[str, Any]:
    """Read one bundled profile, or fail loudly with the file's name: a broken profile is a
    packaging bug, never something to skip silently."""

    def broken(what: str) -> KvplanError:
        return KvplanError(f"bundled model profile {file} is broken: {what}",
                           "each file in profiles/models/ is a JSON object with a string 'id', a list of "
                           "string 'aliases', a 'source' and a 'config' object; fix or remove the file")

    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise broken(f"not valid JSON ({exc})") from None
    except OSError as exc:
        raise broken(f"cannot be read ({exc.strerror or exc})") from None
    if not isinstance(data, dict):
        raise broken(f"holds a JSON {type(data).__name__}, not an object")
    if not isinstance(data.get("id"), str) or not data["id"].strip():
        raise broken("no 'id' string")
    aliases = data.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise broken("'aliases' is not a list of strings")
    if not isinstance(data.get("source"), str) or not data["source"].strip():
        raise broken("no 'source' string")
    if "config" not in data:
        raise broken("no 'config'")
    if not isinstance(data["config"], dict):
        raise broken(f"'config' is a JSON {type(data['config']).__name__}, not an object")
    return data


@lru_cache(maxsize=1)
def bundled_index() -> dict[str, Path]:
    """Lower-cased model id or alias -> bundled profile file (a broken profile raises KvplanError)."""
    index: dict[str, Path] = {}
    for file in sorted(MODELS_DIR.glob("*.json")):
        data = read_profile(file)
        for name in [data["id"], *data.get("aliases", [])]:
            if name:
                index.setdefault(name.lower(), file)
    return index


def load_bundled(name: str) -> ModelConfig | None:
    file = bundled_index().get(name.lower())
    if file is None:
        return None
    data = read_profile(file)
    detail = f"profiles/models/{file.name} (from {data['source']})"
    return ModelConfig(data["id"], data["config"], "bundled", detail)


def bundled_names() -> list[str]:
    return sorted({read_profile(f)["id"] for f in set(bundled_index().values())})


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _hub_cache_dir() -> Path:
    """huggingface_hub's cache folder (`constants.HF_HUB_CACHE`), without importing it."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """A TCP connect to the Hub endpoint: huggingface_hub itself retries for ~30 s when offline."""
    import socket
    from urllib.parse import urlparse

    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        with socket.create_connection((url.hostname or "huggingface.co", url.port or 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def call_with_deadline(fn, seconds: float):
    """Run ``fn`` in a daemon thread; TimeoutError if it is not done in ``seconds``.

    huggingface_hub retries transient errors with back-off; a planner must answer within ~10 s
    whatever the network does. An abandoned call dies with the process."""
    import threading

    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller below
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError(f"no answer in {seconds:.0f} s")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]


def quiet_hub_logs() -> None:
    """huggingface_hub logs retries as warnings on stderr; kvplan reports the outcome itself."""
    import logging

    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)


def _from_hub(repo_id: str, revision: str | None, offline: bool) -> tuple[Path, str]:
    """Download (or find in the hub cache) config.json; raise a _HubMiss with the reason."""
    if offline and not (_hub_cache_dir() / ("models--" + repo_id.replace("/", "--"))).is_dir():
        # Nothing cached: skip importing huggingface_hub (a tenth of a second) altogether.
        raise _HubMiss("not in the hub cache and the Hub is offline")
    if not offline and not hub_reachable():
        try:
            return _from_hub(repo_id, revision, offline=True)  # the cache may still have it
        except _HubMiss:
            raise _HubMiss("the Hub is unreachable and the model is not in the hub cache") from None
    os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", str(HUB_TIMEOUT_S))
    os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", str(HUB_TIMEOUT_S))
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    quiet_hub_logs()
    try:
        path = call_with_deadline(
            lambda: hf_hub_download(repo_id, "config.json", revision=revision, local_files_only=offline,
                                    cache_dir=_hub_cache_dir(), endpoint=os.environ.get("HF_ENDPOINT") or None),
            HUB_TIMEOUT_S,
        )
        return Path(path), "hub-cache" if offline else "hub"
    except TimeoutError:
        raise _HubMiss(f"the Hub did not answer within {HUB_TIMEOUT_S} s") from None
    except LocalEntryNotFoundError:  # a subclass of EntryNotFoundError: catch it first
        raise _HubMiss("not in the hub cache and the Hub is offline" if offline else "the Hub is unreachable") from None
    except GatedRepoError:
        raise _HubMiss("the repo is gated and HF_TOKEN has no access") from None
    except (RepositoryNotFoundError, RevisionNotFoundError):
        raise _HubMiss("no such repo or revision on the Hub (or it is private)") from None
    except EntryNotFoundError:
        raise _HubMiss("the repo has no config.json") from None
    except Exception as exc:  # network errors come in many types (httpx, OSError, timeouts)
        raise _HubMiss(f"the Hub is unreachable ({type(exc).__name__})") from None


class _HubMiss(Exception):
    pass


def resolve_model(
    name: str,
    revision: str | None = None,
    source: str = "auto",
    offline: bool | None = None,
) -> ModelConfig:
    """Find ``name``'s config by ``source`` (auto | local | hub | bundled)."""
    if not name or not name.strip():
        raise KvplanError("no model given", "pass a Hub id, a local path or a bundled profile name")
    name = name.strip()
    if len(name) > 1024 or any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
        raise KvplanError(f"invalid model name {name[:60]!r}{'...' if len(name) > 60 else ''}",
                          "pass a Hub id (org/name), a local folder or a bundled profile name")
    path = Path(name).expanduser()

    def exists(p: Path) -> bool:
        try:
            return p.exists()
        except (OSError, ValueError):  # a component too long, a loop of links
            return False

    if source in ("auto", "local") and (exists(path) or source == "local" or name.startswith((".", "/", "~"))):
        try:
            if path.is_dir():
                path = path / "config.json"
        except OSError:
            pass
        if not exists(path) and not path.is_symlink():
            raise KvplanError(f"no config.json at {path}")
        return ModelConfig(name, read_config_file(path), "local", str(path))

    notes: list[str] = []
    offline = _hub_offline() if offline is None else offline
    if source in ("auto", "hub"):
        if not _REPO_ID_RE.match(name) or len(name) > 200:  # the Hub allows 96 characters a name
            if source == "hub":
                raise KvplanError(f"{name!r} is not a Hub repo id", "use the form org/name")
        else:
            try:
                file, how = _from_hub(name, revision, offline)
                return ModelConfig(name, read_config_file(file), how, f"{name}@{revision or 'main'}")
            except _HubMiss as miss:
                if source == "hub":
                    raise KvplanError(f"cannot get {name} from the Hub: {miss}") from None
                notes.append(f"Hub: {miss}; using the bundled profile")

    bundled = load_bundled(name)
    if bundled is not None:
        return ModelConfig(bundled.name if bundled.name.lower() == name.lower() else name,
                           bundled.config, "bundled", bundled.detail, tuple(notes))
    known = bundled_names()
    import difflib

    close = difflib.get_close_matches(name.lower(), [k.lower() for k in known], n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(k for k in known if k.lower() in close)}?" if close else (
        "see `kvplan models` for the bundled profiles"
    )
    reason = notes[0].split(";")[0] if notes else "not a local path or a bundled profile"
    raise KvplanError(f"cannot find model {name!r} ({reason})", hint)
