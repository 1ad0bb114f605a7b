"""User calibration profiles: what a real vLLM start-up measured, for later `kvplan size` runs.

`kvplan calibrate` reads a start-up log and records, for one (GPU, vLLM version, model
family), the weights vLLM loaded and the measured overhead

    overhead = requested - weights - available_kv          (activation + non-torch [+ CUDA graphs])

together with what kvplan's overhead model predicted for that same start-up. `size` then
shifts the fitted model by the difference (``residual``) when the GPU, the release and the
model family (``model_type``) match, so a run with the calibrated settings reproduces the
measured KV memory, and other settings keep the model's dependence on them. The loaded
weights are reused only for the same model at the same tensor-parallel size.

The profile is JSON at ``$KVPLAN_CONFIG_DIR/calibration.json`` (default
``~/.config/kvplan/calibration.json``). Stdlib only: `kvplan size` reads it on every run.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from kvplan.errors import KvplanError
from kvplan.paths import CONFIG_DIR_ENV, calibration_file, load_user_json, write_file_safely

SCHEMA = 1


@dataclass(frozen=True)
class Calibration:
    """One measured start-up. GiB figures are per device, as vLLM printed them."""

    gpu: str  # catalog name, e.g. "H100 SXM"
    vllm_version: str  # release, "0.11.0"
    model_family: str  # config.json model_type, e.g. "llama"
    model: str
    tensor_parallel_size: int
    requested_gib: float  # CUDA total x gpu_memory_utilization
    weights_gib: float
    available_kv_gib: float
    overhead_gib: float  # requested - weights - available KV
    predicted_overhead_gib: float  # kvplan's model for the same start-up
    max_num_seqs: int
    max_num_batched_tokens: int
    source: str  # the log it came from
    recorded_at: str  # ISO time

    def check(self) -> None:
        """TypeError/ValueError naming the first field of the wrong type (a hand-edited profile)."""
        import math

        for f in fields(self):
            value = getattr(self, f.name)
            kind = {"str": str, "int": int, "float": (int, float)}[str(f.type)]
            if isinstance(value, bool) or not isinstance(value, kind):
                raise TypeError(f"{f.name}: expected {f.type}, got {value!r:.60}")
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{f.name}: {value} is not a finite number")

    @property
    def residual_gib(self) -> float:
        return self.overhead_gib - self.predicted_overhead_gib

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.gpu.lower(), self.vllm_version, self.model_family.lower())

    def label(self) -> str:
        return (f"{self.gpu}, vLLM {self.vllm_version}, {self.model_family} "
                f"(from {self.model}, {Path(self.source).name}, {self.recorded_at[:10]})")


def load_calibrations(path: Path | None = None) -> list[Calibration]:
    """Every recorded calibration; none when the file does not exist."""
    file = path or calibration_file()
    if not file.exists():
        return []
    try:
        data = load_user_json(file, "calibration profile")
        names = {f.name for f in fields(Calibration)}
        rows = data["calibrations"]
        if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
            raise TypeError("calibrations: expected a list of objects")
        out = [Calibration(**{k: v for k, v in row.items() if k in names}) for row in rows]
        for entry in out:
            entry.check()
        return out
    except KvplanError as exc:
        raise KvplanError(f"cannot read the calibration profile {file}: {exc.message}",
                          f"fix or delete it (set {CONFIG_DIR_ENV} to use another folder)") from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise KvplanError(f"cannot read the calibration profile {file}: {exc}",
                          f"fix or delete it (set {CONFIG_DIR_ENV} to use another folder)") from None


def save_calibrations(entries: list[Calibration], path: Path | None = None) -> Path:
    file = path or calibration_file()

    rows = [asdict(e) | {"residual_gib": round(e.residual_gib, 4)} for e in entries]
    text = json.dumps({"schema": SCHEMA, "calibrations": rows}, indent=2) + "\n"
    return write_file_safely(file, text, "the calibration profile", make_parent=True)


def record_calibration(entry: Calibration, path: Path | None = None) -> Path:
    """Add ``entry``, replacing an earlier one for the same (GPU, version, family)."""
    kept = [e for e in load_calibrations(path) if e.key != entry.key]
    return save_calibrations(kept + [entry], path)


def find_calibration(gpu: str, vllm_version: str, model_family: str, path: Path | None = None) -> Calibration | None:
    key = (gpu.lower(), vllm_version, model_family.lower())
    return next((e for e in reversed(load_calibrations(path)) if e.key == key), None)
