"""Ask the installed vLLM for its own KV-cache accounting of tiny-twin model folders.

Run as a subprocess (vLLM and torch are imported only here, inside ``main``)::

    python -m kvplan.vllm.probe REQUEST.json [-o OUT.json]

REQUEST.json::

    {"output": "optional/path.json",          # else the JSON goes to stdout
     "cases": [{"name": "qwen3-0.6b/default",  # free text, echoed back
                "twin": "/tmp/twins/qwen3",    # folder with config.json (see twin.write_twin)
                "settings": {"max_model_len": 4096, "kv_cache_memory_bytes": 268435456,
                             "block_size": null, "enable_prefix_caching": null,
                             "kv_cache_dtype": "auto", "max_num_batched_tokens": 2048,
                             "max_num_seqs": 256, "async_scheduling": null,
                             "skip_forward": true, "extra_engine_args": {}}}]}

Each case is answered by one entry of ``{"vllm_version", "cases": [...]}`` holding ``ok``,
``seconds``, ``layer_specs`` (per layer: spec class, every dataclass field, page sizes,
max_memory_usage_bytes), ``kv_cache_config`` (the scheduler's: num_blocks, groups with layer
names and spec, per-group blocks a max-length request pins), ``worker_kv_cache_config``
(num_blocks and kv_cache_tensors sizes as the worker allocates them), ``available_memory``,
``cache_config`` / ``scheduler_config`` / ``model_config`` excerpts (final block_size,
mamba_cache_mode, mamba_block_size, mamba_page_size_padded, cache_dtype,
mamba_ssm_cache_dtype, max_num_batched_tokens, async_scheduling, ...), ``capacity``
(``kv_cache_size_tokens`` and ``max_concurrency`` exactly as vLLM logged them - from
``vllm.v1.core.kv_cache_utils.get_kv_cache_capacity`` called by ``update_kv_cache_capacity``
in ``EngineCore._initialize_kv_caches``) and ``capacity_async`` (the same accounting redone
through vLLM's own ``get_kv_cache_configs`` + ``get_kv_cache_capacity`` with
``scheduler_config.async_scheduling = True``, i.e. what a GPU engine with its default async
scheduling computes).  A case that fails carries ``error`` = {type, message, traceback (last
lines)} and ``log_tail``; it is never skipped.

Path used
---------
The real engine: ``vllm.LLM(model=twin, load_format="dummy", skip_tokenizer_init=True,
enforce_eager=True, kv_cache_memory_bytes=N, tensor_parallel_size=1, ...)`` in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), then ``core = llm.llm_engine.engine_core.engine_core``.
All cases run in one process (vLLM is imported once); between cases the LLM is deleted and
``vllm.distributed.parallel_state.cleanup_dist_env_and_memory`` + ``gc`` run.

Workarounds (all in-process monkeypatches of the probe's own interpreter, listed per case
under ``patched``):

* forward passes - the KV accounting never needs one, and the CPU build lacks kernels for
  several layer kinds (Triton has no CPU backend here, so Mamba / GDN / sparse-MLA ops are
  unavailable).  vLLM 0.32's ``CPUWorker._should_warm_up_model`` already skips the warm-up
  when ``enforce_eager`` and ``kv_cache_memory_bytes`` are both set, and ``kv_cache_memory_bytes``
  bypasses memory profiling; ``settings.skip_forward`` (default True) makes that unconditional
  (``_should_warm_up_model -> False``, ``CPUModelRunner.warming_up_model`` no-op).  So the engine
  builds the model (dummy weights), collects ``get_kv_cache_spec`` from every attention / Mamba
  layer, runs ``get_kv_cache_configs``, allocates the pool and builds the scheduler exactly as
  usual, but never executes the model.
* values nobody reads - without a forward pass neither the dummy weights' random values nor the
  KV pool's zeros are ever read: the probe leaves both unwritten (``_install_no_value_init``; same
  shapes and sizes; ~40% of a twin's time. On 10 twins the probe's peak RSS fell from 4.9 to 2.8 GB;
  over all twins it stays ~15 GB, so that peak has another cause).
* model-class inspection - vLLM's registry inspects each architecture in a fresh interpreter (to keep
  CUDA uninitialized); the CPU build has no CUDA, so the probe runs it in-process
  (``_install_in_process_inspection``): the same answer without re-importing vLLM per architecture.
* llvmlite's lazy library (``llvmlite.binding.ffi.lib``, imported with numba by e.g. the Kimi-K2.5
  processor): vLLM's kernel-override scan reads ``vars()`` of every module attribute that has a
  ``__dict__`` (``_rebind_kernels`` in vllm/triton_utils/dispatcher.py@0.32.0), and llvmlite 0.47's
  ``_lib_wrapper.__getattr__`` answers ``__dict__`` with a function wrapper, so every later engine in
  the process failed at ``init_worker`` ("'_lib_fn_wrapper' object has no attribute 'get'"). The
  probe makes it answer dunder names the way ``ctypes.CDLL`` does: AttributeError
  (``_install_llvmlite_dunder_guard``).
* non-gated MoE (Nemotron-H ``relu2`` experts): ``FusedMoEConfig.__post_init__`` refuses
  ``is_act_and_mul=False`` off CUDA/XPU/ROCm as its last statement; that one error is swallowed.
* torchvision missing: model files such as ``qwen3_5.py`` import Qwen-VL image processors at
  module import (also in vLLM's model-inspection subprocess).  When torchvision is absent the
  probe writes a dummy ``torchvision`` package to a temp dir and prepends it to ``sys.path``
  and ``PYTHONPATH`` (removed at exit; ``"no_torchvision_stub": true`` in the request disables
  it).  Twins use text-only architectures (see ``twin.TEXT_ONLY_ARCH``), so nothing of it runs.

``get_kv_cache_configs`` in ``vllm.v1.engine.core`` is wrapped (not altered) to record its
inputs (specs, available memory) and outputs.  If the engine fails after that point (e.g. the
"KV cache is needed ... larger than the available" check) the case still carries
``layer_specs``.

CPU-platform caveats (``vllm/platforms/cpu.py: CpuPlatform.check_and_update_config``): the CPU
build forces ``async_scheduling=False``; defaults ``block_size`` to 128 (GPU: backend
default, usually 16) unless given; forces ``block_size=16`` for MLA models and disables prefix
caching and chunked prefill for MLA (``max_num_batched_tokens = max(max_model_len, 2048)``);
hybrid attention/Mamba block alignment (``Platform._align_hybrid_block_size``) uses the CPU
attention backend's kernel block sizes.  These are recorded, not hidden: compare
``cache_config.block_size`` etc. before trusting a number for a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import enum
import gc
import json
import logging
import os
import sys
import time
import traceback
from collections import deque
from typing import Any

DEFAULT_SETTINGS = {
    "max_model_len": 4096,
    "kv_cache_memory_bytes": 256 * 1024 * 1024,
    "block_size": None,
    "enable_prefix_caching": None,
    "kv_cache_dtype": "auto",
    "max_num_batched_tokens": None,
    "max_num_seqs": None,
    "async_scheduling": None,
    "skip_forward": True,
    "extra_engine_args": {},
    "kv_offloading_size": None,  # GiB: also size the native CPU tier vLLM would give (``offload``)
}


# --------------------------------------------------------------------------- serialisation
def to_jsonable(obj: Any, depth: int = 0) -> Any:
    if depth > 8:
        return repr(obj)
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, enum.Enum):
        return obj.name if not isinstance(obj.value, (str, int)) else obj.value
    mod = type(obj).__module__
    if mod.startswith("torch") and "dtype" in type(obj).__name__:
        return str(obj).replace("torch.", "")
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [to_jsonable(v, depth + 1) for v in obj]
    if hasattr(obj, "numerator") and hasattr(obj, "denominator"):  # Fraction
        return float(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name, None), depth + 1)
                for f in dataclasses.fields(obj)}
    return repr(obj)


def spec_to_dict(spec: Any, vllm_config: Any = None) -> dict:
    """Spec class name, every dataclass field, and its derived byte sizes."""
    out: dict[str, Any] = {"class": type(spec).__name__}
    for f in dataclasses.fields(spec):
        if f.name == "kv_cache_specs":  # UniformTypeKVCacheSpecs: summarise per layer
            out["kv_cache_specs"] = {k: spec_to_dict(v) for k, v in getattr(spec, f.name).items()}
            continue
        out[f.name] = to_jsonable(getattr(spec, f.name, None))
    for prop in ("page_size_bytes", "real_page_size_bytes", "unpadded_page_size_bytes"):
        with contextlib.suppress(Exception):  # not every spec has every property
            out[prop] = int(getattr(spec, prop))
    if vllm_config is not None:
        try:
            out["max_memory_usage_bytes"] = int(spec.max_memory_usage_bytes(vllm_config))
        except Exception as e:  # noqa: BLE001
            out["max_memory_usage_bytes_error"] = f"{type(e).__name__}: {e}"
    return out


def kv_cache_config_to_dict(cfg: Any, vllm_config: Any) -> dict:
    from vllm.utils.math_utils import cdiv

    groups = []
    for g in cfg.kv_cache_groups:
        d: dict[str, Any] = {
            "layer_names": list(g.layer_names),
            "spec": spec_to_dict(g.kv_cache_spec, vllm_config),
        }
        for extra in ("is_eagle_group", "host_resident", "role"):
            if hasattr(g, extra):
                d[extra] = to_jsonable(getattr(g, extra))
        with contextlib.suppress(Exception):
            d["blocks_per_max_len_request"] = cdiv(
                g.kv_cache_spec.max_memory_usage_bytes(vllm_config),
                g.kv_cache_spec.page_size_bytes,
            )
        groups.append(d)
    out = {
        "num_blocks": cfg.num_blocks,
        "kv_cache_groups": groups,
        "kv_cache_tensors": [
            {k: to_jsonable(getattr(t, k, None))
             for k in ("size", "layers", "shared_by", "layer_stride", "block_stride", "offset")
             if hasattr(t, k)}
            for t in cfg.kv_cache_tensors
        ],
    }
    for extra in ("hash_block_size", "cache_hit_alignment_tokens", "kv_cache_layout",
                  "prefix_cache_retention_interval", "kv_tp_replicas"):
        if hasattr(cfg, extra):
            out[extra] = to_jsonable(getattr(cfg, extra))
    return out


def pick(obj: Any, names: tuple[str, ...]) -> dict:
    return {n: to_jsonable(getattr(obj, n)) for n in names if hasattr(obj, n)}


CACHE_FIELDS = (
    "block_size", "user_specified_block_size", "cache_dtype", "enable_prefix_caching",
    "mamba_cache_mode", "mamba_block_size", "mamba_page_size_padded", "mamba_cache_dtype",
    "mamba_ssm_cache_dtype", "kv_cache_memory_bytes", "num_gpu_blocks",
    "kv_cache_size_tokens", "kv_cache_max_concurrency", "sliding_window",
    "kv_sharing_fast_prefill", "prefix_caching_hash_algo", "calculate_kv_scales",
)
SCHED_FIELDS = (
    "max_num_batched_tokens", "max_num_seqs", "max_model_len", "async_scheduling",
    "enable_chunked_prefill", "long_prefill_token_threshold", "scheduler_cls",
)
MODEL_FIELDS = (
    "architecture", "max_model_len", "original_max_model_len", "dtype", "use_mla",
    "is_hybrid", "has_inner_state", "is_attention_free", "hf_text_config_model_type",
)


# --------------------------------------------------------------------------- log capture
class _Tail(logging.Handler):
    def __init__(self, n: int = 60):
        super().__init__(level=logging.DEBUG)
        self.lines: deque[str] = deque(maxlen=n)
        self.capacity_lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "_kvplan_seen", False):  # attached at several logger levels
            return
        record._kvplan_seen = True
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001
            msg = str(record.msg)
        line = f"{record.levelname} {record.name}: {msg}"
        self.lines.append(line[:2000])
        if ("KV cache size" in msg or "Maximum concurrency" in msg) and (
            msg not in self.capacity_lines
        ):
            self.capacity_lines.append(msg)

    def reset(self) -> None:
        self.lines.clear()
        self.capacity_lines = []


# --------------------------------------------------------------------------- the probe
class _Recorder:
    """Wraps ``get_kv_cache_configs`` as imported by ``vllm.v1.engine.core``."""

    def __init__(self):
        self.calls: list[dict] = []

    def install(self):
        import copy

        import vllm.v1.engine.core as core_mod

        orig = core_mod.get_kv_cache_configs
        if getattr(orig, "_kvplan_wrapped", False):
            orig = orig._kvplan_orig
        rec = self

        def wrapped(vllm_config, kv_cache_specs, available_memory):
            entry = {
                "specs": [copy.deepcopy(s) for s in kv_cache_specs],
                "available_memory": list(available_memory),
            }
            rec.calls.append(entry)
            result = orig(vllm_config, kv_cache_specs, available_memory)
            entry["result"] = result
            return result

        wrapped._kvplan_wrapped = True
        wrapped._kvplan_orig = orig
        core_mod.get_kv_cache_configs = wrapped


_SKIP_PATCHED = False


def _install_in_process_inspection() -> list[str]:
    """Inspect model classes in this process instead of a fresh interpreter per architecture.

    vLLM's registry imports the model class in a subprocess "to avoid initializing CUDA"
    (``_run_in_subprocess`` in vllm/model_executor/models/registry.py@0.32.0), which re-imports vLLM:
    ~15 s per distinct architecture on a CI core, against well under 1 s in-process. The CPU build has no
    CUDA to initialize, and this process imports the same model module a moment later to build the twin,
    so the answer (``_ModelInfo.from_model_cls``) is the same one."""
    try:
        from vllm.model_executor.models import registry
    except Exception as e:  # noqa: BLE001 - recorded per case, the engine still runs as shipped
        return [f"in-process inspection patch failed: {type(e).__name__}: {e}"]
    if getattr(registry._run_in_subprocess, "_kvplan_in_process", False):
        return ["registry._run_in_subprocess -> in process (already installed)"]

    def _in_process(fn):
        return fn()

    _in_process._kvplan_in_process = True
    registry._run_in_subprocess = _in_process
    return ["registry._run_in_subprocess -> in process"]


def _install_llvmlite_dunder_guard() -> list[str]:
    """Let llvmlite's lazy library refuse dunder names, as the ``ctypes.CDLL`` it wraps does (see the
    module docstring): one twin importing numba must not break every later twin's engine."""
    try:
        from llvmlite.binding import ffi
    except Exception:  # noqa: BLE001 - no llvmlite, nothing to guard
        return []
    wrapper_cls = getattr(ffi, "_lib_wrapper", None)
    if wrapper_cls is None or getattr(wrapper_cls.__getattr__, "_kvplan_guard", False):
        return []
    lazy_getattr = wrapper_cls.__getattr__

    def _getattr(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return lazy_getattr(self, name)

    _getattr._kvplan_guard = True
    wrapper_cls.__getattr__ = _getattr
    return ["llvmlite.binding.ffi._lib_wrapper: dunder names raise AttributeError"]


def _install_skip_forward() -> list[str]:
    """No-op the CPU worker's warm-up forward passes (see module docstring)."""
    global _SKIP_PATCHED
    done = []
    if _SKIP_PATCHED:
        return ["(already installed)"]
    try:
        from vllm.v1.worker import cpu_worker

        cpu_worker.CPUWorker._should_warm_up_model = lambda self, *a, **k: False
        done.append("CPUWorker._should_warm_up_model -> False")
    except Exception as e:  # noqa: BLE001
        done.append(f"cpu_worker patch failed: {type(e).__name__}: {e}")
    try:
        from vllm.v1.worker import cpu_model_runner

        if hasattr(cpu_model_runner.CPUModelRunner, "warming_up_model"):
            cpu_model_runner.CPUModelRunner.warming_up_model = lambda self, *a, **k: None
            done.append("CPUModelRunner.warming_up_model")
    except Exception as e:  # noqa: BLE001
        done.append(f"cpu_model_runner patch failed: {type(e).__name__}: {e}")
    try:
        from vllm.model_executor.layers.fused_moe import config as moe_cfg

        orig_post = moe_cfg.FusedMoEConfig.__post_init__

        def _post_init(self, *a, **k):
            # Non-gated MoE (e.g. Nemotron-H relu2 experts) is refused on CPU by a platform
            # check that is the *last* statement of __post_init__; the layer can still be
            # built with dummy weights, and the KV cache never depends on the experts.
            try:
                return orig_post(self, *a, **k)
            except NotImplementedError as e:
                if "is_act_and_mul=False" not in str(e):
                    raise
                return None

        moe_cfg.FusedMoEConfig.__post_init__ = _post_init
        done.append("FusedMoEConfig.__post_init__: tolerate non-gated MoE on CPU")
    except Exception as e:  # noqa: BLE001
        done.append(f"fused_moe patch failed: {type(e).__name__}: {e}")
    try:
        from vllm.platforms import cpu as cpu_platform

        orig_sel = cpu_platform.CpuPlatform.get_attn_backend_cls.__func__

        def _sel(cls, selected_backend, attn_selector_config, *a, **k):
            # The CPU platform refuses sparse MLA (DeepSeek-V3.2 / GLM-5 DSA) outright.  The
            # GPU default on Hopper, FlashMLA-sparse, imports fine on CPU and is only asked
            # for its KV spec / block sizes here (no kernel runs); see module docstring.
            if getattr(attn_selector_config, "use_sparse", False):
                return os.environ.get(
                    "KVPLAN_SPARSE_MLA_BACKEND",
                    "vllm.v1.attention.backends.mla.flashmla_sparse.FlashMLASparseBackend",
                )
            return orig_sel(cls, selected_backend, attn_selector_config, *a, **k)

        cpu_platform.CpuPlatform.get_attn_backend_cls = classmethod(_sel)

        orig_cuc = cpu_platform.CpuPlatform.check_and_update_config.__func__

        def _cuc(cls, vllm_config):
            # CpuPlatform forces block_size=16 for every MLA model (its reference MLA kernel);
            # the sparse-MLA backends above only take multiples of 64 (GPU default 64).
            orig_cuc(cls, vllm_config)
            mc = vllm_config.model_config
            hf = getattr(mc, "hf_text_config", None) if mc is not None else None
            if hf is not None and getattr(hf, "index_topk", None) and mc.use_mla:
                cc = vllm_config.cache_config
                if cc.block_size % 64:
                    cc.block_size = 64

        cpu_platform.CpuPlatform.check_and_update_config = classmethod(_cuc)
        done.append("CpuPlatform.get_attn_backend_cls: sparse MLA -> FlashMLASparseBackend; "
                    "sparse-MLA block_size 16 -> 64")
    except Exception as e:  # noqa: BLE001
        done.append(f"sparse backend patch failed: {type(e).__name__}: {e}")
    try:
        from vllm.v1.worker import cpu_worker as _cw
        from vllm.v1.worker import workspace as _ws

        orig_init_device = _cw.CPUWorker.init_device

        def _init_device(self, *a, **k):
            # Sparse-MLA indexers reserve workspace while being constructed; the GPU worker
            # creates the manager in init_device, the CPU worker never does.
            r = orig_init_device(self, *a, **k)
            if getattr(_ws, "_manager", None) is None:
                import torch

                _ws.init_workspace_manager(torch.device("cpu"))
            return r

        _cw.CPUWorker.init_device = _init_device
        done.append("CPUWorker.init_device: also init_workspace_manager(cpu)")
    except Exception as e:  # noqa: BLE001
        done.append(f"workspace patch failed: {type(e).__name__}: {e}")
    _SKIP_PATCHED = True
    return done


def _async_capacity(vllm_config, rec_call: dict) -> dict:
    """Redo vLLM's accounting with async scheduling on (GPU default)."""
    import copy

    from vllm.v1.core import kv_cache_utils as kcu

    sched = vllm_config.scheduler_config
    old_async = sched.async_scheduling
    old_len = vllm_config.model_config.max_model_len
    out: dict[str, Any] = {}
    try:
        sched.async_scheduling = True
        out["max_concurrent_batches"] = vllm_config.max_concurrent_batches
        out["max_in_flight_tokens"] = vllm_config.max_in_flight_tokens
        cfgs = kcu.get_kv_cache_configs(
            vllm_config, [copy.deepcopy(s) for s in rec_call["specs"]],
            list(rec_call["available_memory"]),
        )
        sched_cfg = kcu.generate_scheduler_kv_cache_config(cfgs)
        tokens, conc = kcu.get_kv_cache_capacity(vllm_config, sched_cfg)
        out.update(
            num_blocks=sched_cfg.num_blocks,
            kv_cache_size_tokens=tokens,
            max_concurrency=conc,
            blocks_per_max_len_request=[
                kcu.cdiv(g.kv_cache_spec.max_memory_usage_bytes(vllm_config),
                         g.kv_cache_spec.page_size_bytes)
                for g in sched_cfg.kv_cache_groups
            ],
        )
    except Exception as e:  # noqa: BLE001
        out["error"] = {"type": type(e).__name__, "message": str(e)[-2000:]}
    finally:
        sched.async_scheduling = old_async
        vllm_config.model_config.max_model_len = old_len
    return out


def _offload_tier(vllm_config, kv_cache_config, size_gib: float) -> dict:
    """The native CPU tier vLLM would give ``--kv-offloading-size size_gib`` on this engine: its own
    ``build_offloading_config`` and ``CPUOffloadingSpec`` (scheduler side; the worker's copy path asserts a
    CUDA or XPU tensor, so the CPU build never builds it), with the KV-transfer config
    ``VllmConfig._post_init_kv_transfer_config`` writes for the native backend."""
    out: dict[str, Any] = {}
    old = vllm_config.kv_transfer_config
    try:
        from vllm.config import KVTransferConfig
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import build_offloading_config
        from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

        vllm_config.kv_transfer_config = KVTransferConfig(
            kv_connector="OffloadingConnector", kv_role="kv_both", engine_id="kvplan-probe",
            kv_connector_extra_config={"cpu_bytes_to_use": size_gib * (1 << 30)})
        config = build_offloading_config(vllm_config, kv_cache_config)
        spec = CPUOffloadingSpec(config)
        out.update(num_chunks=spec.num_chunks, kv_bytes_per_chunk=spec.kv_bytes_per_chunk,
                   blocks_per_chunk=spec.blocks_per_chunk, replicated_layout=spec.replicated_layout,
                   worker_kv_bytes_per_block=config.worker_kv_bytes_per_block,
                   tokens_per_block=[g.tokens_per_block for g in config.groups],
                   group_ids=[g.group_id for g in config.groups])
    except Exception as e:  # noqa: BLE001
        out["error"] = {"type": type(e).__name__, "message": str(e)[-2000:]}
    finally:
        vllm_config.kv_transfer_config = old
    return out


def run_case(case: dict, tail: _Tail, rec: _Recorder) -> dict:
    from vllm import LLM

    settings = dict(DEFAULT_SETTINGS)
    settings.update(case.get("settings") or {})
    result: dict[str, Any] = {
        "name": case.get("name"), "twin": case.get("twin"), "settings": settings, "ok": False,
    }
    tail.reset()
    rec.calls.clear()
    # vLLM (re)configures its "vllm" logger lazily; attach our tail every case.
    for name in ("vllm", "vllm.v1.core.kv_cache_utils", "vllm.v1.engine.core"):
        lg = logging.getLogger(name)
        if tail not in lg.handlers:
            lg.addHandler(tail)
        if name != "vllm":
            lg.setLevel(logging.INFO)
    t0 = time.perf_counter()
    llm = None
    try:
        if settings.get("skip_forward", True):
            result["patched"] = _install_skip_forward()
        result.setdefault("patched", []).extend(_install_in_process_inspection())
        result["patched"].extend(_install_llvmlite_dunder_guard())
        result["patched"].extend(_install_no_heap_freeze())
        if settings.get("skip_forward", True):
            result["patched"].extend(_install_no_value_init())
        kwargs: dict[str, Any] = dict(
            model=case["twin"],
            load_format="dummy",
            skip_tokenizer_init=True,
            enforce_eager=True,
            tensor_parallel_size=1,
            kv_cache_memory_bytes=int(settings["kv_cache_memory_bytes"]),
            max_model_len=settings["max_model_len"],
            kv_cache_dtype=settings.get("kv_cache_dtype") or "auto",
            trust_remote_code=False,
            seed=0,
        )
        for k in ("block_size", "enable_prefix_caching", "max_num_batched_tokens",
                  "max_num_seqs", "async_scheduling"):
            if settings.get(k) is not None:
                kwargs[k] = settings[k]
        kwargs.update(settings.get("extra_engine_args") or {})
        llm = LLM(**kwargs)
        t_built = time.perf_counter()
        core = llm.llm_engine.engine_core.engine_core
        vc = core.vllm_config
        specs = core.model_executor.get_kv_cache_specs()
        result["layer_specs"] = {name: spec_to_dict(s, vc) for name, s in specs[0].items()}
        result["num_layers_with_kv"] = len(specs[0])
        result["kv_cache_config"] = kv_cache_config_to_dict(core.scheduler.kv_cache_config, vc)
        if rec.calls:
            call = rec.calls[-1]
            result["available_memory"] = call["available_memory"]
            if "result" in call:
                w = call["result"][0]
                result["worker_kv_cache_config"] = {
                    "num_blocks": w.num_blocks,
                    "kv_cache_tensors": [
                        {k: to_jsonable(getattr(t, k, None))
                         for k in ("size", "layers", "layer_stride", "block_stride", "offset")
                         if hasattr(t, k)}
                        for t in w.kv_cache_tensors
                    ],
                    "groups": [spec_to_dict(g.kv_cache_spec, vc) for g in w.kv_cache_groups],
                }
        result["cache_config"] = pick(vc.cache_config, CACHE_FIELDS)
        result["scheduler_config"] = pick(vc.scheduler_config, SCHED_FIELDS)
        mc = pick(vc.model_config, MODEL_FIELDS)
        try:
            mc["hf_text_config_model_type"] = vc.model_config.hf_text_config.model_type
            mc["architectures"] = list(vc.model_config.hf_config.architectures or [])
        except Exception:  # noqa: BLE001
            pass
        result["model_config"] = mc
        result["max_in_flight_tokens"] = vc.max_in_flight_tokens
        result["capacity"] = {
            "kv_cache_size_tokens": getattr(vc.cache_config, "kv_cache_size_tokens", None),
            "max_concurrency": getattr(vc.cache_config, "kv_cache_max_concurrency", None),
            "num_blocks": core.scheduler.kv_cache_config.num_blocks,
            "log": list(tail.capacity_lines),
        }
        if rec.calls:
            result["capacity_async"] = _async_capacity(vc, rec.calls[-1])
        if settings.get("kv_offloading_size"):
            result["offload"] = _offload_tier(vc, core.scheduler.kv_cache_config, settings["kv_offloading_size"])
        result["ok"] = True
        result["seconds_build"] = round(t_built - t0, 2)
    except BaseException as e:  # noqa: BLE001 - report everything, never skip
        if isinstance(e, KeyboardInterrupt):
            raise
        tb = traceback.format_exc().splitlines()
        result["error"] = {
            "type": type(e).__name__,
            "message": str(e)[-4000:],
            "traceback": tb[-25:],
        }
        result["log_tail"] = list(tail.lines)[-30:]
        if rec.calls:  # the engine got as far as the accounting: keep what it saw
            call = rec.calls[-1]
            result["available_memory"] = call["available_memory"]
            with contextlib.suppress(Exception):
                result["layer_specs"] = {n: spec_to_dict(s) for n, s in call["specs"][0].items()}
    finally:
        result["seconds"] = round(time.perf_counter() - t0, 2)
        with _heap_stays_frozen():  # vLLM's shutdown unfreezes and walks the whole heap, five times a case
            if llm is not None:
                with contextlib.suppress(Exception):
                    llm.llm_engine.engine_core.shutdown()
            del llm
            _cleanup()
        gc.collect()  # once: the case's own objects (the heap before it is frozen, see main)
    return result


@contextlib.contextmanager
def _heap_stays_frozen():
    """Within: ``gc.unfreeze`` and ``gc.collect`` do nothing.

    An engine's shutdown unfreezes the heap and collects it in full (``EngineCore.shutdown``,
    ``Worker.shutdown``, ``cleanup_dist_env_and_memory`` in vllm/v1/engine/core.py,
    vllm/v1/worker/gpu_worker.py, vllm/distributed/parallel_state.py@0.32.0): ~0.4 s per walk over
    everything torch and vLLM imported, five walks, two thirds of a twin's time. The probe keeps what
    was alive before the case frozen and collects the case's own objects once, after."""
    unfreeze, collect = gc.unfreeze, gc.collect
    gc.unfreeze, gc.collect = (lambda: None), (lambda generation=2: 0)
    try:
        yield
    finally:
        gc.unfreeze, gc.collect = unfreeze, collect


class _ZerosAreEmpty:
    """``torch`` as one call of vLLM sees it, but ``zeros`` allocates without writing (``empty``)."""

    def __init__(self, torch_module):
        self._torch = torch_module
        self.zeros = torch_module.empty

    def __getattr__(self, name):
        return getattr(self._torch, name)


def _install_no_value_init() -> list[str]:
    """Allocate what no forward pass will read without writing it: the dummy loader's random weights
    (``initialize_single_dummy_weight``: two fifths of a twin's time, on every parameter) and the zeroed
    KV pool (``torch.zeros`` in ``allocate_kv_cache``, vllm/v1/worker/utils.py@0.32.0: up to 4 GiB a
    case). Shapes, sizes, the accounting and the views are vLLM's own."""
    done = []
    try:
        from vllm.model_executor.model_loader import dummy_loader

        if not getattr(dummy_loader.initialize_single_dummy_weight, "_kvplan_noop", False):
            def _no_dummy_values(*a, **k) -> None:
                return None

            _no_dummy_values._kvplan_noop = True
            dummy_loader.initialize_single_dummy_weight = _no_dummy_values
        done.append("DummyModelLoader: weights left uninitialised (never read: no forward pass)")
    except Exception as e:  # noqa: BLE001
        done.append(f"dummy-weight patch failed: {type(e).__name__}: {e}")
    try:
        from vllm.v1.worker import gpu_model_runner
        from vllm.v1.worker import utils as worker_utils

        allocate = gpu_model_runner.allocate_kv_cache
        if not getattr(allocate, "_kvplan_empty", False):
            def _allocate_empty(*a, **k):
                real_torch = worker_utils.torch
                worker_utils.torch = _ZerosAreEmpty(real_torch)
                try:
                    return allocate(*a, **k)
                finally:
                    worker_utils.torch = real_torch

            _allocate_empty._kvplan_empty = True
            gpu_model_runner.allocate_kv_cache = _allocate_empty
        done.append("allocate_kv_cache: the pool allocated with torch.empty (never read: no forward pass)")
    except Exception as e:  # noqa: BLE001
        done.append(f"kv-pool patch failed: {type(e).__name__}: {e}")
    try:
        done.append(_install_shaped_rope_cache())
    except Exception as e:  # noqa: BLE001
        done.append(f"rope-cache patch failed: {type(e).__name__}: {e}")
    return done


def _install_shaped_rope_cache() -> str:
    """A rotary embedding's cos/sin cache allocated in its shape and dtype, not computed: vLLM computes it for
    every position the config allows (``RotaryEmbeddingBase.__init__``, model_executor/layers/rotary_embedding/
    base.py@0.32.0), 10,485,760 for Llama-4-Scout, whose twin took 27.3 s and 15.5 GB with it, 2.2 s without. Each class's own
    ``_compute_cos_sin_cache`` runs on the meta device for the shape (any class whose computation cannot, runs it
    for real)."""
    import torch
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbeddingBase

    init = RotaryEmbeddingBase.__init__
    if getattr(init, "_kvplan_shaped", False):
        return "rotary embeddings: the cos/sin cache allocated, not computed (already installed)"

    def _init(self, *args, **kwargs) -> None:
        compute = type(self)._compute_cos_sin_cache

        def shaped() -> torch.Tensor:
            try:
                with torch.device("meta"):
                    meta = compute(self)
            except Exception:  # noqa: BLE001 - a computation the meta device cannot run: the real one
                return compute(self)
            # In the dtype the module keeps (base.py converts to it: a full pass over the cache otherwise).
            return torch.empty(meta.shape, dtype=getattr(self, "dtype", None) or meta.dtype)

        object.__setattr__(self, "_compute_cos_sin_cache", shaped)  # for this construction only
        try:
            init(self, *args, **kwargs)
        finally:
            self.__dict__.pop("_compute_cos_sin_cache", None)

    _init._kvplan_shaped = True
    RotaryEmbeddingBase.__init__ = _init
    return "rotary embeddings: the cos/sin cache allocated, not computed (never read: no forward pass)"


def _install_no_heap_freeze() -> list[str]:
    """Keep an engine's objects collectable: ``EngineCore.__init__`` freezes the whole heap once
    built (``freeze_gc_heap``, vllm/v1/engine/core.py@0.32.0), which would keep the case's engine
    past the probe's one collection (``_heap_stays_frozen``) for good."""
    try:
        from vllm.v1.engine import core
    except Exception as e:  # noqa: BLE001
        return [f"no-heap-freeze patch failed: {type(e).__name__}: {e}"]
    if getattr(core.freeze_gc_heap, "_kvplan_noop", False):
        return []

    def _no_freeze() -> None:
        return None

    _no_freeze._kvplan_noop = True
    core.freeze_gc_heap = _no_freeze
    return ["EngineCore: freeze_gc_heap -> no-op (the probe collects each case once)"]


def _cleanup() -> None:
    try:
        from vllm.v1.worker.workspace import reset_workspace_manager

        reset_workspace_manager()
    except Exception:  # noqa: BLE001
        pass
    try:
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
    except Exception:  # noqa: BLE001
        pass


_TV_STUB = r"""
# kvplan probe stub: lets vLLM import multimodal model files on a CPU build without
# torchvision.  Every torchvision.* module and attribute is a dummy; nothing here runs in a
# text-only twin's forward path, and transformers still reports torchvision as unavailable.
import importlib.abc, importlib.machinery, sys, types

__version__ = "0.0.0+kvplan.stub"


class _Meta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _make(name)

    def __call__(cls, *a, **k):
        return super().__call__()

    def __iter__(cls):
        return iter(())


def _make(name):
    return _Meta(str(name), (), {"__init__": lambda self, *a, **k: None,
                                 "__call__": lambda self, *a, **k: self})


def _getattr(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _make(name)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        m = types.ModuleType(spec.name)
        m.__path__ = []
        m.__getattr__ = _getattr
        return m

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())
__path__ = __path__  # noqa: F821 - keep package semantics
__getattr__ = _getattr
"""


def _install_torchvision_stub() -> str | None:
    """If torchvision is missing, put a dummy package first on sys.path and PYTHONPATH
    (vLLM inspects model classes in a subprocess, which inherits PYTHONPATH)."""
    import importlib.util
    import tempfile

    if importlib.util.find_spec("torchvision") is not None:
        return None
    root = tempfile.mkdtemp(prefix="kvplan_tvstub_")
    os.makedirs(os.path.join(root, "torchvision"))
    with open(os.path.join(root, "torchvision", "__init__.py"), "w") as fh:
        fh.write(_TV_STUB)
    sys.path.insert(0, root)
    os.environ["PYTHONPATH"] = root + (os.pathsep + os.environ["PYTHONPATH"]
                                       if os.environ.get("PYTHONPATH") else "")
    return root


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvplan.vllm.probe")
    ap.add_argument("request")
    ap.add_argument("-o", "--output")
    args = ap.parse_args(argv)
    with open(args.request) as fh:
        request = json.load(fh)
    out_path = args.output or request.get("output")

    # Keep stdout clean for the JSON: vLLM logs (and C-level prints) go to stderr.
    real_stdout = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    stub_root = None if request.get("no_torchvision_stub") else _install_torchvision_stub()
    t_import = time.perf_counter()
    import vllm  # noqa: F401 - imported here only

    tail = _Tail()
    logging.getLogger("vllm").addHandler(tail)
    rec = _Recorder()
    rec.install()
    doc: dict[str, Any] = {
        "vllm_version": getattr(vllm, "__version__", None),
        "import_seconds": round(time.perf_counter() - t_import, 2),
        "torchvision_stub": stub_root,
        "cases": [],
    }
    # vLLM collects garbage several times while it builds an engine (and the probe between cases): each
    # full collection walked every object torch and vLLM had imported, about 0.35 s, over half of a
    # case's time. What is alive now, and what survives each case's cleanup (imported model modules),
    # lives to the end anyway: freeze it, so a collection walks only the case's own objects.
    gc.collect()
    gc.freeze()
    for case in request.get("cases", []):
        res = run_case(case, tail, rec)
        # run_case ended with a collection of its own objects: what is left lives on (imported model modules, caches).
        # A full walk here (unfreeze, collect) cost ~3 s a case once the heap had grown: freeze instead.
        gc.freeze()
        res["max_rss_mib"] = _max_rss_mib()
        doc["cases"].append(res)
        print(f"[kvplan.probe] {res.get('name')}: ok={res['ok']} {res['seconds']}s",
              file=sys.stderr, flush=True)
        if out_path:  # write progressively so a crash keeps earlier cases
            _dump(doc, out_path)
    if stub_root:
        import shutil

        shutil.rmtree(stub_root, ignore_errors=True)
    if out_path:
        _dump(doc, out_path)
    else:
        json.dump(doc, real_stdout, indent=1)
        real_stdout.write("\n")
    real_stdout.flush()
    return 0


def _max_rss_mib() -> int:
    """The probe's peak resident memory so far (Linux reports KiB), for sizing how many probes fit at once."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def _dump(doc: dict, path: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(doc, fh, indent=1)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
