"""Public vLLM start-up reports as data: the schema of one report and the loader.

Each line of ``profiles/reports/vllm-startup-reports.jsonl`` is one start-up that someone
published (an issue, a README, a profiling table), with the figures vLLM printed. The fields
outside ``kvplan`` are copied verbatim from the source collection; ``null`` means the source
did not say. The ``kvplan`` object holds curation, each item with the reason written next to
it: which bundled config stands for a model kvplan does not ship (``config_model``), facts the
source states only in prose (``reported_activation_gib``, ``usage_context``), the release
assumed when the report gives none.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvplan.errors import KvplanError
from kvplan.paths import PROFILES_DIR, parse_json_text, read_user_text

RecordT = TypeVar("RecordT", bound=BaseModel)

REPORTS_DIR = PROFILES_DIR / "reports"
DEFAULT_REPORTS = REPORTS_DIR / "vllm-startup-reports.jsonl"


class Curation(BaseModel):
    """What kvplan adds to a report, each with its reason."""

    model_config = ConfigDict(extra="allow", frozen=True)

    config_model: str | None = None  # the bundled config that stands for `model`
    config_note: str | None = None
    config_overrides: dict[str, Any] | None = None  # fields of the real checkpoint's config.json
    assumed_vllm_version: str | None = None
    version_note: str | None = None
    usage_context: str | None = Field(None, pattern="^(serve|llm)$")
    reported_activation_gib: float | None = None  # "torch peak increase" the source printed
    reported_non_torch_gib: float | None = None
    kv_memory_decimals: int = 2  # vLLM prints GiB with 2 decimals
    speculative_decoding: str | None = None
    platform: str | None = None  # "rocm" when the source says so
    # Engine arguments the source quotes that change the accounting (non-default args).
    max_num_seqs: int | None = Field(None, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=1)
    enable_prefix_caching: bool | None = None


class Report(BaseModel):
    """One published vLLM start-up."""

    model_config = ConfigDict(extra="allow", frozen=True)

    case_id: str
    source: str
    quote: str = ""
    vllm_version: str | None = None
    engine: str | None = None
    model: str
    gpu: str | None = None
    gpu_count: int | None = None
    gpu_total_memory_gib_logged: float | None = None
    tensor_parallel_size: int | None = None
    pipeline_parallel_size: int | None = None
    decode_context_parallel_size: int | None = None  # --decode-context-parallel-size, where the source gives it
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    kv_cache_dtype: str | None = None
    block_size: int | None = None
    enforce_eager: bool | None = None
    speculative_config: dict[str, Any] | None = None  # vLLM's --speculative-config, as the source gives it
    reported_kv_tokens: int | None = None
    reported_gpu_blocks: int | None = None
    reported_max_concurrency: float | None = None
    max_concurrency_ctx: int | None = None
    reported_kv_memory_gib: float | None = None
    reported_weights_gib: float | None = None
    notes: str = ""
    kvplan: Curation = Field(default_factory=Curation)

    @property
    def config_model(self) -> str:
        return self.kvplan.config_model or self.model

    @property
    def version_text(self) -> str | None:
        return self.vllm_version or self.kvplan.assumed_vllm_version


def load_reports(path: str | Path | None = None) -> list[Report]:
    """Read a JSON-lines reports file (default: the shipped one)."""
    file = Path(path) if path else DEFAULT_REPORTS

    return read_report_lines(file, Report)


def read_report_lines(file: Path, record: type[RecordT]) -> list[RecordT]:
    """A JSON-lines reports file, one ``record`` a line (blank lines skipped); a line that is not one, or a file
    with none, is one line naming the file, the line and the field."""
    text = read_user_text(file, "reports file")
    out: list[RecordT] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(record.model_validate(parse_json_text(line, f"{file}:{number}")))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise KvplanError(f"{file}:{number}: field {where}: {first['msg']}") from None
    if not out:
        raise KvplanError(f"{file} holds no reports")
    return out
