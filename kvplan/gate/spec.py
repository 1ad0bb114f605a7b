"""The deployment spec (``kvplan.yaml``): read, validate, point at the line of every mistake.

Layout::

    defaults:              # optional: keys every deployment inherits
      vllm_version: "0.11.0"
    deployments:           # required: a list (a bare top-level list works too)
      - name: chat
        model: meta-llama/Llama-3.1-8B-Instruct
        gpu: 2xH100        # or gpu: H100 with gpus: 2
        tp: 2
        context: 32k       # max_model_len
        concurrency: 16    # required concurrent requests
        prompt: 2k
        output: 512
        headroom: 0.1      # keep 10% of the KV pool free
        rate: 40/s         # optional: requests/s over its replicas; with slo: the predicted fleet is gated
        slo: {ttft_p99: 1s, tpot_p99: 50ms}

Each deployment maps onto ``kvplan.plan.schema.Settings`` (the meaning of each field is
documented there); sizes and token counts are parsed by ``kvplan.units`` only. Every error is a
``SpecIssue`` with the file, the 1-based line and the field, e.g.
``kvplan.yaml:12: deployments[1].context: invalid context length: '32q' ...``.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kvplan.bench.slo import parse_slo, slo_from_mapping
from kvplan.errors import KvplanError
from kvplan.model.dtypes import kv_dtype
from kvplan.paths import read_user_text, yaml_loader
from kvplan.plan.schema import Settings
from kvplan.plan.speculative import parse_speculative_config
from kvplan.units import parse_bytes, parse_fraction, parse_rate, parse_tokens
from kvplan.vllm.rules import parse_version

# Canonical key -> other spellings accepted (vLLM's flag names and kvplan size's).
ALIASES: dict[str, tuple[str, ...]] = {
    "gpus": ("gpu_count",),
    "gpu_mem": ("gpu_memory",),
    "tp": ("tensor_parallel_size",),
    "pp": ("pipeline_parallel_size",),
    "context": ("max_model_len", "ctx"),
    "concurrency": ("required_concurrency",),
    "prompt": ("prompt_tokens",),
    "output": ("output_tokens",),
    "shared_prefix": ("shared_prefix_tokens",),
    "kv_cache_dtype": ("kv_dtype",),
    "gpu_memory_utilization": ("util",),
    "kv_cache_memory": ("kv_cache_memory_bytes", "kv_memory"),
    "usage": ("usage_context",),
}
_CANONICAL = {alias: key for key, aliases in ALIASES.items() for alias in aliases}
TOP_LEVEL_KEYS = ("defaults", "deployments", "version")


class SpecIssue(KvplanError):
    """One mistake in a spec file, at a line and field."""

    def __init__(self, file: str, line: int | None, field: str | None, message: str, hint: str | None = None):
        self.file, self.line, self.field = file, line, field
        where = f"{file}:{line}" if line else file
        super().__init__(f"{where}: {field}: {message}" if field else f"{where}: {message}", hint)


class SpecErrors(KvplanError):
    """Every mistake found in a spec file (exit code 2)."""

    def __init__(self, issues: list[SpecIssue]):
        self.issues = issues
        super().__init__("\n".join(str(i) for i in issues))


class Deployment(BaseModel):
    """One deployment to check. Token counts take ``32k``; sizes ``24GiB``; fractions ``0.9`` or ``90%``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    model: str = Field(min_length=1, description="Hub id, local path, or bundled profile")
    gpu: str | None = Field(None, description="H100, 4xH100 (NxNAME); or give gpu_mem")
    gpus: int | None = Field(None, ge=1, le=65536, description="GPU count, if gpu has no Nx prefix")
    gpu_mem: int | None = Field(None, description="memory of a GPU not in the catalog: 24GiB")
    tp: int | None = Field(None, ge=1, le=65536, description="tensor parallel size (default: all GPUs / pp)")
    pp: int = Field(1, ge=1, le=4096)
    context: int | None = Field(None, description="max_model_len (default: the model's)")
    concurrency: int = Field(1, ge=1, le=10_000_000, description="concurrent requests that must fit")
    prompt: int | None = None
    output: int | None = Field(None, ge=0)
    shared_prefix: int = Field(0, ge=0)
    kv_cache_dtype: str = "auto"
    gpu_memory_utilization: float | None = None
    kv_cache_memory: int | None = None
    block_size: int | None = Field(None, ge=1, le=1 << 20)
    max_num_seqs: int | None = Field(None, ge=1, le=10_000_000)
    max_num_batched_tokens: int | None = None
    enforce_eager: bool = False
    speculative_config: Any = Field(None, description="vLLM's --speculative-config, as a mapping or its JSON text: "
                                    "{method: mtp, num_speculative_tokens: 3}")
    kv_offloading_size: float | None = Field(None, gt=0, le=1 << 20, allow_inf_nan=False,
                                             description="vLLM's --kv-offloading-size: the CPU tier, GiB over the ranks")
    kv_offloading_backend: str | None = Field(None, pattern="^(native|lmcache)$")
    usage: str = Field("serve", pattern="^(serve|llm)$")
    vllm_version: str | None = None
    headroom: float = Field(0.0, description="fraction of the KV pool that must stay free at the asked load")
    workload: str | None = Field(None, description="traffic with reuse (a file kvplan bench --traffic reads; relative "
                                 "to the spec's folder): its prefix-cache working set on the deployment's pool")
    workload_options: dict[str, float] = Field(default_factory=dict, description="the loader's options: "
                                               "{hash_block_tokens: 512, chars_per_token: 4}")
    min_hit_share: float | None = Field(None, gt=0, le=1, description="with workload: the pool must keep at least this "
                                        "share of the hits any pool could keep (0.9)")
    sessions: int | None = Field(None, ge=1, le=10_000_000, description="with workload: this many sessions' largest "
                                 "turns must fit the pool at once")
    slo: dict[str, float] = Field(default_factory=dict, description="latency targets checked against --bench runs "
                                  "at the asked concurrency: {ttft_p99: 500ms, itl_p99: 50ms, e2e_p99: 10s} (seconds); "
                                  "with rate:, against the predicted fleet too")
    rate: float | None = Field(None, description="requests per second over the deployment's replicas (gpus / (tp x pp) "
                               "engines behind a router; 200 or 200/s): with slo:, prompt: and output:, the simulated "
                               "replica at its share must meet the SLOs (as kvplan fit --rate sizes a fleet)")

    @field_validator("slo", mode="before")
    @classmethod
    def _slo(cls, value: Any) -> Any:
        if value is None:
            return {}
        try:
            if isinstance(value, str):
                return parse_slo(value)
            if not isinstance(value, dict):
                raise ValueError("slo must be a mapping such as {ttft_p99: 500ms, e2e_p99: 10s}")
            return slo_from_mapping(value)
        except KvplanError as exc:
            raise ValueError(str(exc).splitlines()[0]) from None

    @field_validator("rate", mode="before")
    @classmethod
    def _rate(cls, value: Any) -> Any:
        return None if value is None else _unit(parse_rate, value, "rate")

    @model_validator(mode="after")
    def _workload_gates(self):
        for name in ("min_hit_share", "sessions", "workload_options"):
            if getattr(self, name) and not self.workload:
                raise ValueError(f"{name} needs workload: (the traffic file it is about)")
        if self.rate is not None:  # what serving the rate means, and the requests that make it
            missing = [key for key in ("slo", "prompt", "output") if not getattr(self, key) and getattr(self, key) != 0]
            if missing:
                raise ValueError(f"rate needs {', '.join(k + ':' for k in missing)} (what the fleet serves, and at "
                                 "what latency)")
        return self

    @field_validator("gpu", mode="before")
    @classmethod
    def _gpu_name(cls, v: Any) -> Any:
        """``gpu: 4090`` is a GPU name YAML reads as a number."""
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else v

    @field_validator("context", "prompt", "max_num_batched_tokens", mode="before")
    @classmethod
    def _tokens(cls, value: Any, info) -> Any:
        return None if value is None else _unit(parse_tokens, value, f"{info.field_name} length")

    @field_validator("output", "shared_prefix", mode="before")
    @classmethod
    def _tokens_or_zero(cls, value: Any, info) -> Any:
        if value in (0, "0") or value is None:
            return value
        return _unit(parse_tokens, value, f"{info.field_name} length")

    @field_validator("gpu_mem", "kv_cache_memory", mode="before")
    @classmethod
    def _bytes(cls, value: Any, info) -> Any:
        return None if value is None else _unit(parse_bytes, value, info.field_name.replace("_", " "))

    @field_validator("gpu_memory_utilization", mode="before")
    @classmethod
    def _fraction(cls, value: Any) -> Any:
        return None if value is None else _unit(parse_fraction, _number_or_text(value), "gpu_memory_utilization")

    @field_validator("headroom", mode="before")
    @classmethod
    def _headroom(cls, value: Any) -> Any:
        value = _number_or_text(value)
        if value in (0, "0", "0%"):
            return 0.0
        fraction = _unit(parse_fraction, value, "headroom")
        if fraction >= 1:
            raise ValueError(f"headroom {value!r} leaves no pool to use (use a fraction below 1, e.g. 0.1)")
        return fraction

    @field_validator("vllm_version", mode="before")
    @classmethod
    def _version(cls, value: Any) -> Any:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            raise ValueError(f"quote the version: YAML read it as the number {value} (write e.g. vllm_version: \"0.11.0\")")
        if isinstance(value, str):
            _check(parse_version, value)
        return value

    @field_validator("speculative_config", mode="before")
    @classmethod
    def _speculative(cls, value: Any) -> Any:
        if value is None:
            return None

        try:
            return parse_speculative_config(value)
        except KvplanError as exc:
            raise ValueError(str(exc).splitlines()[0].removeprefix("--speculative-config: ")) from None

    @field_validator("kv_cache_dtype")
    @classmethod
    def _kv_dtype(cls, value: str) -> str:
        if value != "auto":
            _check(kv_dtype, value)
        return value

    def settings(self, gpu_count: int):
        """The deployment as the planner's ``Settings`` (the one settings type; ``gpu_count``: the GPUs
        its ``gpu``/``gpus`` name, which set the tensor parallel size when ``tp`` is not given)."""

        return Settings(
            tensor_parallel_size=self.tp or max(1, gpu_count // self.pp),
            pipeline_parallel_size=self.pp,
            kv_cache_dtype=self.kv_cache_dtype,
            block_size=self.block_size,
            max_model_len=self.context,
            gpu_memory_utilization=self.gpu_memory_utilization,
            kv_cache_memory_bytes=self.kv_cache_memory,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            enforce_eager=self.enforce_eager,
            speculative=self.speculative_config,
            usage_context=self.usage,
            concurrency=self.concurrency,
            prompt_tokens=self.prompt,
            output_tokens=self.output,
            shared_prefix_tokens=self.shared_prefix,
            kv_offloading_size=self.kv_offloading_size,
            kv_offloading_backend=self.kv_offloading_backend,
        )


def _number_or_text(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"expected a number, got {type(value).__name__}")
    return value


def _unit(parse, value: Any, what: str) -> Any:
    """``parse(value, what)`` (a kvplan.units parser); its KvplanError becomes pydantic's ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"expected a number or a string, got {type(value).__name__}")
    if isinstance(value, float) and value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{value} is not a finite number")
    if isinstance(value, float) and parse is parse_tokens and value == int(value):
        value = int(value)  # YAML's 32768.0
    try:
        return parse(value, what)
    except KvplanError as exc:
        raise ValueError(str(exc)) from None


def _check(validate, value: str) -> None:
    """A one-argument validator (vLLM version, KV dtype name) whose KvplanError becomes a ValueError."""
    try:
        validate(value)
    except KvplanError as exc:
        raise ValueError(str(exc)) from None


@dataclass(frozen=True)
class SpecEntry:
    """A validated deployment and where it is written."""

    deployment: Deployment
    index: int
    line: int
    key_lines: dict[str, int]  # canonical field -> line of its key (including inherited defaults)
    keys_written: dict[str, str]  # canonical field -> the spelling used in the file

    def line_of(self, field: str | None) -> int:
        return self.key_lines.get(field or "", self.line)

    def label(self, field: str | None = None) -> str:
        key = self.keys_written.get(field or "", field)
        return f"deployments[{self.index}]" + (f".{key}" if key else "")


@dataclass(frozen=True)
class Spec:
    file: str
    entries: list[SpecEntry]


# --- YAML with line numbers -------------------------------------------------------------------


MAX_SPEC_BYTES = 1024 * 1024


def _compose(text: str, file: str):
    """YAML text -> (node tree, data); syntax errors name their line. kvplan.paths' bounded SafeLoader
    refuses alias bombs, cycles and deep nesting at their line; .inf and .nan are read as numbers for
    the field checks to name."""
    import yaml

    loader_cls = yaml_loader()
    try:
        node = yaml.compose(text, Loader=loader_cls)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise SpecErrors([SpecIssue(file, mark.line + 1 if mark else None, None,
                                    f"not valid YAML: {exc.problem or exc.context}")]) from None
    except yaml.YAMLError as exc:
        raise SpecErrors([SpecIssue(file, None, None, f"not valid YAML: {exc}")]) from None
    if node is None:
        return None, None
    loader = loader_cls("")
    try:
        data = loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise SpecErrors([SpecIssue(file, mark.line + 1 if mark else None, None, f"not valid YAML: {exc.problem}")]) from None
    finally:
        loader.dispose()
    return node, data


def _lines(node, file: str, issues: list[SpecIssue]) -> dict[tuple, int]:
    """Path (keys and list indexes) -> 1-based line; duplicate keys are reported."""
    import yaml

    lines: dict[tuple, int] = {}

    def walk(n, path: tuple) -> None:
        lines.setdefault(path, n.start_mark.line + 1)
        if isinstance(n, yaml.MappingNode):
            seen: set[str] = set()
            for key_node, value_node in n.value:
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
                line = key_node.start_mark.line + 1
                if key in seen:
                    issues.append(SpecIssue(file, line, _dotted(path + (key,)), "duplicate key"))
                    continue
                seen.add(key)
                lines[path + (key,)] = line
                walk(value_node, path + (key,))
        elif isinstance(n, yaml.SequenceNode):
            for i, item in enumerate(n.value):
                walk(item, path + (i,))

    walk(node, ())
    return lines


def _dotted(path: tuple) -> str:
    """("deployments", 2, "context") -> deployments[2].context (a bare list reads the same)."""
    out = "deployments" if path and isinstance(path[0], int) else ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


# --- validation ------------------------------------------------------------------------------


def _canonical_keys(raw: dict, base: tuple, file: str, lines: dict[tuple, int],
                    issues: list[SpecIssue]) -> tuple[dict[str, Any], dict[str, str], dict[str, int]]:
    """Rename aliases to canonical keys; unknown and doubled keys become issues."""
    known = list(Deployment.model_fields) + list(_CANONICAL)
    values: dict[str, Any] = {}
    written: dict[str, str] = {}
    key_lines: dict[str, int] = {}
    for key, value in raw.items():
        line = lines.get(base + (key,))
        if not isinstance(key, str):
            issues.append(SpecIssue(file, line, _dotted(base), f"key {key!r} is not a name"))
            continue
        canonical = _CANONICAL.get(key, key)
        if canonical not in Deployment.model_fields:
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}?" if close else "see docs/ci-gating.md for the keys"
            issues.append(SpecIssue(file, line, _dotted(base + (key,)), "unknown key", hint))
            continue
        if canonical in values and written[canonical] != key:
            issues.append(SpecIssue(file, line, _dotted(base + (key,)),
                                    f"{key!r} and {written[canonical]!r} are the same setting; give one"))
            continue
        values[canonical], written[canonical] = value, key
        if line:
            key_lines[canonical] = line
    return values, written, key_lines


def _pydantic_errors(exc: ValidationError) -> list[tuple[str | None, str]]:
    """(canonical field, message) for each pydantic error, in words a spec author reads."""
    out = []
    for err in exc.errors(include_url=False):
        field = str(err["loc"][0]) if err["loc"] else None
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "missing":
            msg = "required key is missing"
        elif err["type"] in ("string_type", "int_type", "int_parsing", "float_type", "float_parsing",
                             "bool_type", "bool_parsing", "int_from_float"):
            msg = f"{msg} (got {err.get('input')!r})"
        out.append((field, msg))
    return out


def parse_spec_text(text: str, file: str = "kvplan.yaml") -> Spec:
    """Validate a spec's text; raise SpecErrors listing every mistake with its line."""
    node, data = _compose(text, file)
    issues: list[SpecIssue] = []
    if data is None:
        raise SpecErrors([SpecIssue(file, None, None, "the file is empty", "list deployments under 'deployments:'")])
    lines = _lines(node, file, issues)
    defaults: dict[str, Any] = {}
    default_written: dict[str, str] = {}
    default_lines: dict[str, int] = {}
    if isinstance(data, list):
        items, items_path = data, ()
    elif isinstance(data, dict):
        for key in data:
            if key not in TOP_LEVEL_KEYS:
                close = difflib.get_close_matches(str(key), TOP_LEVEL_KEYS, n=1)
                hint = f"did you mean {close[0]!r}?" if close else "top-level keys: defaults, deployments"
                issues.append(SpecIssue(file, lines.get((key,)), str(key), "unknown key", hint))
        raw_defaults = data.get("defaults") or {}
        if not isinstance(raw_defaults, dict):
            issues.append(SpecIssue(file, lines.get(("defaults",)), "defaults", "must be a mapping of keys"))
        else:
            defaults, default_written, default_lines = _canonical_keys(raw_defaults, ("defaults",), file, lines, issues)
            for bad in ("name",):
                if bad in defaults:
                    issues.append(SpecIssue(file, default_lines.get(bad), f"defaults.{bad}", "must be set per deployment"))
        if "deployments" not in data:
            issues.append(SpecIssue(file, 1, "deployments", "required key is missing", "list the deployments to check"))
            raise SpecErrors(issues)
        items, items_path = data["deployments"], ("deployments",)
    else:
        raise SpecErrors([SpecIssue(file, 1, None, "expected a mapping with 'deployments:' or a list of deployments")])
    if not isinstance(items, list):
        raise SpecErrors(issues + [SpecIssue(file, lines.get(items_path), "deployments", "must be a list")])
    if not items:
        raise SpecErrors(issues + [SpecIssue(file, lines.get(items_path), "deployments", "the list is empty")])

    entries: list[SpecEntry] = []
    names: dict[str, int] = {}
    for i, raw in enumerate(items):
        base = items_path + (i,)
        entry_line = lines.get(base, 1)
        if not isinstance(raw, dict):
            issues.append(SpecIssue(file, entry_line, _dotted(base), "must be a mapping (name: ..., model: ...)"))
            continue
        before = len(issues)
        values, written, key_lines = _canonical_keys(raw, base, file, lines, issues)
        merged = {**defaults, **values}
        merged_lines = {**default_lines, **key_lines}
        merged_written = {**default_written, **written}
        if len(issues) > before:
            continue
        try:
            deployment = Deployment(**merged)
        except ValidationError as exc:
            for field, msg in _pydantic_errors(exc):
                if field in default_written and field not in written:
                    # A bad inherited default is reported once, at the defaults.
                    issue = SpecIssue(file, default_lines.get(field), f"defaults.{default_written[field]}", msg)
                    if any(str(j) == str(issue) for j in issues):
                        continue
                else:
                    key = merged_written.get(field or "", field)
                    issue = SpecIssue(file, merged_lines.get(field or "", entry_line),
                                      _dotted(base + ((key,) if key else ())), msg)
                issues.append(issue)
            continue
        if deployment.gpu is None and deployment.gpu_mem is None:
            issues.append(SpecIssue(file, entry_line, _dotted(base + ("gpu",)), "required key is missing",
                                    "give gpu: H100 (or 4xH100), or gpu_mem: 24GiB"))
            continue
        if deployment.name in names:
            issues.append(SpecIssue(file, merged_lines.get("name", entry_line), _dotted(base + ("name",)),
                                    f"name {deployment.name!r} is already used by deployments[{names[deployment.name]}]"))
            continue
        names[deployment.name] = i
        entries.append(SpecEntry(deployment, i, entry_line, merged_lines, merged_written))
    if issues:
        raise SpecErrors(issues)
    return Spec(file, entries)


def load_spec(path: str | Path) -> Spec:
    """Read and validate a spec file (SpecErrors on any mistake, with file:line: field)."""
    file = str(path)

    if not Path(path).exists():
        raise SpecErrors([SpecIssue(file, None, None, "no such file", "pass the path of your kvplan.yaml")])
    try:
        text = read_user_text(path, "", MAX_SPEC_BYTES)
    except KvplanError as exc:
        raise SpecErrors([SpecIssue(file, None, None, exc.message.removeprefix(f"cannot read {file}: "), exc.hint)]) from None
    return parse_spec_text(text, file)
