"""Where kvplan's data lives: ``profiles/`` beside the package in a source checkout, and
``kvplan/profiles`` in an installed wheel (pyproject maps one onto the other)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable
from pathlib import Path

from kvplan.errors import KvplanError

_PACKAGE = Path(__file__).resolve().parent


CONFIG_DIR_ENV = "KVPLAN_CONFIG_DIR"


def config_dir() -> Path:
    """kvplan's own settings folder: $KVPLAN_CONFIG_DIR, else ~/.config/kvplan."""
    import os

    env = os.environ.get(CONFIG_DIR_ENV, "").strip()
    return Path(env).expanduser() if env else Path.home() / ".config" / "kvplan"


def calibration_file() -> Path:
    """Where `kvplan calibrate` records measured start-ups (kvplan/calibration.py reads it)."""
    return config_dir() / "calibration.json"


def _profiles_dir() -> Path:
    for candidate in (_PACKAGE / "profiles", _PACKAGE.parent / "profiles"):
        if (candidate / "gpus.json").is_file():
            return candidate
    return _PACKAGE.parent / "profiles"


PROFILES_DIR = _profiles_dir()


# --- reading user files safely ------------------------------------------------------------------
# Every file a user (or a log, or a run folder) names goes through these: regular files only (a FIFO,
# /dev/zero or a folder is refused before a byte is read), a size cap, strict UTF-8, and JSON or YAML
# with a nesting cap (no RecursionError) and no NaN/Infinity; YAML also with its aliases and nodes
# counted (no alias bomb). Errors are KvplanError (exit 2) naming the file.

MiB_ = 1024 * 1024
MAX_FILE_BYTES = 64 * MiB_  # configs, specs, summaries, reports, traces
MAX_LOG_BYTES = 256 * MiB_  # start-up logs (streamed by the log reader)
MAX_DEPTH = 64  # JSON / YAML nesting: real configs and specs need under 10
MAX_LINE_CHARS = 64 * 1024  # one log line: longer lines are cut (vLLM's longest are a few KB)


def _err(message: str, hint: str | None = None):
    return KvplanError(message, hint)


def open_user_file(path: str | Path, what: str = "", limit: int | None = MAX_FILE_BYTES):
    """Open ``path`` for binary reading if it is a regular file no larger than ``limit`` bytes.

    Opened non-blocking (a FIFO cannot hang the open), then checked with fstat on the open
    descriptor (no race between the check and the read). Symlinks to regular files are fine."""
    import os
    import stat

    name = f"{what} {path}" if what else str(path)
    try:
        fd = os.open(str(path), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise _err(f"cannot read {name}: no such file") from None
    except IsADirectoryError:
        raise _err(f"cannot read {name}: it is a folder, not a file") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise _err(f"cannot read {name}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise _err(f"cannot read {name}: it is a folder, not a file")
        if not stat.S_ISREG(st.st_mode):
            raise _err(f"cannot read {name}: not a regular file (a device, FIFO or socket is never read)")
        if limit is not None and st.st_size > limit:
            raise _err(f"cannot read {name}: too large ({st.st_size:,} bytes; the limit is {limit:,})")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_user_bytes(path: str | Path, what: str = "", limit: int | None = MAX_FILE_BYTES) -> bytes:
    with open_user_file(path, what, limit) as fh:
        try:
            data = fh.read(limit + 1) if limit is not None else fh.read()
        except OSError as exc:
            raise _err(f"cannot read {path}: {exc.strerror or exc}") from None
    if limit is not None and len(data) > limit:  # grew while we read it
        raise _err(f"{path}: too large (over {limit:,} bytes)")
    return data


def decode_utf8(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise _err(f"{where}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})",
                   "save the file as UTF-8") from None


def read_user_text(path: str | Path, what: str = "", limit: int | None = MAX_FILE_BYTES) -> str:
    """A user's text file: regular, at most ``limit`` bytes, UTF-8 (else one clear error)."""
    return decode_utf8(read_user_bytes(path, what, limit), str(path))


_NEST_RE = None


def json_depth(text: str) -> int:
    """The deepest ``[``/``{`` nesting in JSON text, strings skipped; linear time."""
    import re

    global _NEST_RE
    if _NEST_RE is None:
        _NEST_RE = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]')
    depth = deepest = 0
    for m in _NEST_RE.finditer(text):
        tok = m.group()
        if tok in ("[", "{"):
            depth += 1
            deepest = max(deepest, depth)
        elif tok in ("]", "}"):
            depth -= 1
    return deepest


#: The largest number a file kvplan wrote itself may hold (run.json, summary.json, points.jsonl...): every
#: count, load, time and byte count there is far below it; past it an integer no longer converts to a float
#: exactly, and a float overflows the first sum or scale (a 400-digit load, 2**63 preemptions or a p99 of
#: 1.7e308 s ended in an OverflowError deep inside a report, a chart or a gate).
MAX_RUN_NUMBER = 2**53


def parse_json_text(text: str, where: str, max_depth: int = MAX_DEPTH, allow_nonfinite: bool = False,
                    max_number: float | None = None):
    """JSON text -> data; errors name ``where`` (and the line); no NaN/Infinity; nesting capped;
    with ``max_number``, a number past +-max_number is refused (files kvplan wrote: ``MAX_RUN_NUMBER``)."""
    import json

    # No more brackets than the cap (strings' counted too: a bound, counted at C speed) cannot nest past it; only
    # then is the exact scan needed (a requests.jsonl of 8 MB error texts spent half its report there).
    if text.count("[") + text.count("{") > max_depth and json_depth(text) > max_depth:
        raise _err(f"{where}: JSON nested deeper than {max_depth} levels")

    def bounded(kind: type):
        def parse(digits: str):
            value = kind(digits) if len(digits) <= 40 else None
            if value is None or not abs(value) <= max_number:
                raise _BoundError(f"{where}: the number {digits[:24]}{'...' if len(digits) > 24 else ''} is past "
                                  f"{max_number:,}, more than any figure kvplan writes")
            return value
        return parse

    if max_number is None and not allow_nonfinite and not text.startswith("\ufeff"):
        # The usual reader: one decoder, made once (json.loads(..., parse_constant=) makes one a call, and a trace
        # is a call a line); json.loads is left to say what a byte-order mark is.
        decode = _finite_decoder().decode
    else:
        decode = functools.partial(json.loads, parse_constant=None if allow_nonfinite else _refuse_nonfinite,
                                   parse_int=None if max_number is None else bounded(int),
                                   parse_float=None if max_number is None else bounded(float))
    try:
        return decode(text)
    except _NonFinite as exc:
        raise _err(f"{where}: {exc.args[0]} is not a number kvplan accepts", "use a finite value") from None
    except _BoundError as exc:
        raise _err(str(exc), "pass a file kvplan wrote, unedited") from None
    except json.JSONDecodeError as exc:
        raise _err(f"{where}:{exc.lineno}: not valid JSON: {exc.msg} (column {exc.colno})") from None
    except RecursionError:
        raise _err(f"{where}: JSON nested too deeply") from None
    except ValueError as exc:  # e.g. an integer with more than 4300 digits
        raise _err(f"{where}: not valid JSON: {str(exc).splitlines()[0][:200]}") from None


def load_user_json(path: str | Path, what: str = "", limit: int | None = MAX_FILE_BYTES,
                   max_depth: int = MAX_DEPTH, allow_nonfinite: bool = False, max_number: float | None = None):
    """Read and parse a user's JSON file safely (see ``open_user_file`` and ``parse_json_text``)."""
    return parse_json_text(read_user_text(path, what, limit), str(path), max_depth, allow_nonfinite, max_number)


class _NonFinite(Exception):
    """NaN or Infinity in a JSON text (raised inside the decoder, named by ``parse_json_text``)."""


def _refuse_nonfinite(name: str):
    raise _NonFinite(name)


@functools.cache
def _finite_decoder():
    """`parse_json_text`'s decoder for most reads: NaN and Infinity refused."""
    import json

    return json.JSONDecoder(parse_constant=_refuse_nonfinite)


class _BoundError(Exception):
    """A number past ``parse_json_text``'s ``max_number`` (raised inside json.loads, which would turn a
    ValueError into its own message)."""


# --- YAML ---------------------------------------------------------------------------------------
# A SafeLoader whose composition stays linear whatever the text: aliases are counted and weighed by what
# they expand to (a "billion laughs" bomb is refused before anything is built), an alias may not refer to
# the node that holds it (no cycles), nesting is capped (no RecursionError), and so is the number of nodes
# (memory). Integers past Python's digit limit and, unless allowed, .inf/.nan are errors at their line.

MAX_YAML_NODES = 100_000  # nodes of the document once every alias is expanded (specs: a few hundred)
MAX_YAML_ALIASES = 100


def yaml_loader(max_nodes: int = MAX_YAML_NODES, max_aliases: int = MAX_YAML_ALIASES, max_depth: int = MAX_DEPTH,
                allow_nonfinite: bool = True, python_tags: bool = False, libyaml: bool = False) -> type:
    """The bounded loader class (cached per set of limits); use it with ``yaml.compose``/``yaml.load``.

    ``python_tags``: a ``!!python/...`` tag (what ``yaml.dump`` writes for a tuple, and for objects that
    are not plain data) is read as the plain mapping, list or string it tags: nothing is imported or
    called. ``libyaml``: scan and parse with libyaml's C parser where PyYAML has it (several times
    faster on a large file), composing and bounding in Python as without it."""
    return _yaml_loader(max_nodes, max_aliases, max_depth, allow_nonfinite, python_tags,
                        libyaml and _c_parser() is not None)


def _c_parser():
    try:
        from yaml.cyaml import CParser  # absent where PyYAML was built without libyaml
    except ImportError:
        return None
    return CParser


_YAML_LOADERS: dict[tuple, type] = {}


def _yaml_loader(max_nodes: int, max_aliases: int, max_depth: int, allow_nonfinite: bool, python_tags: bool,
                 libyaml: bool) -> type:
    key = (max_nodes, max_aliases, max_depth, allow_nonfinite, python_tags, libyaml)
    if key in _YAML_LOADERS:
        return _YAML_LOADERS[key]
    import math

    import yaml
    from yaml.composer import Composer, ComposerError
    from yaml.constructor import ConstructorError, SafeConstructor
    from yaml.resolver import Resolver

    if libyaml:
        parser = _c_parser()

        class Base(Composer, SafeConstructor, Resolver, parser):  # type: ignore[valid-type, misc]
            """libyaml's events, PyYAML's composer (so the bounds below apply), the safe constructor."""

            def __init__(self, stream):
                parser.__init__(self, stream)
                Composer.__init__(self)
                SafeConstructor.__init__(self)
                Resolver.__init__(self)
    else:
        Base = yaml.SafeLoader  # type: ignore[misc]  # noqa: N806

    def _refused(problem: str, node) -> ConstructorError:
        """Valid YAML, a value kvplan refuses: said without "not valid YAML"."""
        exc = ConstructorError(None, None, problem, node.start_mark)
        exc.kvplan_refused = True  # type: ignore[attr-defined]
        return exc

    class BoundedLoader(Base):  # type: ignore[valid-type, misc]
        def __init__(self, stream):
            super().__init__(stream)
            self._aliases = 0
            self._nodes = 0
            self._depth = 0
            self._open: set[str] = set()
            self._weight: dict[int, int] = {}  # id(collection node) -> nodes once its aliases are expanded

        def compose_node(self, parent, index):
            event = self.peek_event()
            if isinstance(event, yaml.AliasEvent):
                self._aliases += 1
                if self._aliases > max_aliases:
                    raise ComposerError(None, None, f"more than {max_aliases} aliases (*name)", event.start_mark)
                if event.anchor in self._open:
                    raise ComposerError(None, None, f"alias *{event.anchor} refers to the node that holds it",
                                        event.start_mark)
                return super().compose_node(parent, index)
            self._nodes += 1
            if self._nodes > max_nodes:
                raise ComposerError(None, None, f"more than {max_nodes:,} nodes", event.start_mark)
            anchor = getattr(event, "anchor", None)
            self._depth += 1
            if self._depth > max_depth:
                raise ComposerError(None, None, f"nested deeper than {max_depth} levels", event.start_mark)
            if anchor:
                self._open.add(anchor)
            try:
                node = super().compose_node(parent, index)
            finally:
                self._depth -= 1
                if anchor:
                    self._open.discard(anchor)
            weigh = self._weight.get
            if isinstance(node, yaml.MappingNode):
                weight = 1 + sum(weigh(id(k), 1) + weigh(id(v), 1) for k, v in node.value)
            elif isinstance(node, yaml.SequenceNode):
                weight = 1 + sum(weigh(id(item), 1) for item in node.value)
            else:
                return node  # a scalar weighs 1 (the default above): not stored
            if weight > max_nodes:
                raise ComposerError(None, None, f"expands to more than {max_nodes:,} nodes (aliases repeated "
                                    "inside aliases?)", event.start_mark)
            self._weight[id(node)] = weight
            return node

        def construct_object(self, node, deep=False):
            try:
                return super().construct_object(node, deep=deep)
            except (ValueError, OverflowError) as exc:  # e.g. a timestamp 2025-13-01: month must be in 1..12
                raise ConstructorError(None, None, str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__,
                                       node.start_mark) from None

        def construct_yaml_int(self, node):
            try:
                return super().construct_yaml_int(node)
            except ValueError:  # more digits than Python converts (4300)
                raise _refused(f"the integer {node.value[:20]}... has too many digits", node) from None

        def construct_yaml_float(self, node):
            value = super().construct_yaml_float(node)
            if not allow_nonfinite and not math.isfinite(value):
                raise _refused(f"{node.value[:40]} is not a number kvplan accepts (use a finite value)", node)
            return value

        def construct_plain(self, suffix, node):
            if isinstance(node, yaml.MappingNode):
                return self.construct_mapping(node, deep=True)
            if isinstance(node, yaml.SequenceNode):
                return self.construct_sequence(node, deep=True)
            return self.construct_scalar(node)

    BoundedLoader.add_constructor("tag:yaml.org,2002:int", BoundedLoader.construct_yaml_int)
    BoundedLoader.add_constructor("tag:yaml.org,2002:float", BoundedLoader.construct_yaml_float)
    if python_tags:
        BoundedLoader.add_multi_constructor("tag:yaml.org,2002:python/", BoundedLoader.construct_plain)
    _YAML_LOADERS[key] = BoundedLoader
    return BoundedLoader


def parse_yaml_text(text: str, where: str, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_YAML_NODES,
                    max_aliases: int = MAX_YAML_ALIASES, allow_nonfinite: bool = False, python_tags: bool = False):
    """YAML text (one document) -> plain data; errors name ``where`` and the line; see ``yaml_loader``."""
    import yaml

    loader = None
    try:
        loader = yaml_loader(max_nodes, max_aliases, max_depth, allow_nonfinite, python_tags, libyaml=True)(text)
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = ", ".join(str(part) for part in (exc.context, exc.problem) if part) or "unreadable"
        problem = " ".join(problem.split())[:300]  # one line
        if getattr(exc, "kvplan_refused", False):
            raise _err(f"{where}{line}: {problem}") from None
        raise _err(f"{where}{line}: not valid YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise _err(f"{where}: not valid YAML: {' '.join(str(exc).split())[:300]}") from None
    except RecursionError:
        raise _err(f"{where}: YAML nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()


def load_user_yaml(path: str | Path, what: str = "", limit: int | None = MAX_FILE_BYTES, max_depth: int = MAX_DEPTH,
                   max_nodes: int = MAX_YAML_NODES, max_aliases: int = MAX_YAML_ALIASES,
                   allow_nonfinite: bool = False, python_tags: bool = False):
    """Read and parse a user's YAML file safely (see ``open_user_file`` and ``parse_yaml_text``)."""
    return parse_yaml_text(read_user_text(path, what, limit), str(path), max_depth, max_nodes, max_aliases,
                           allow_nonfinite, python_tags)


def iter_user_lines(path: str | Path, what: str = "log", limit: int | None = MAX_LOG_BYTES,
                    max_line: int = MAX_LINE_CHARS):
    """The lines of a (possibly huge) text file, streamed: each cut to ``max_line`` characters,
    undecodable bytes replaced; memory stays bounded whatever the file holds."""
    fh = open_user_file(path, what, limit)
    with fh:
        yield from _bounded_lines(fh, max_line)


def _bounded_lines(fh, max_line: int):
    """Text lines from a binary stream, each at most ``max_line`` characters (the rest of an
    over-long line is skipped without being held in memory)."""
    chunk = max(max_line, 4096)
    while True:
        raw = fh.readline(chunk + 1)
        if not raw:
            return
        if len(raw) > chunk and not raw.endswith(b"\n"):
            # An over-long line: keep its head, skip to its end in bounded reads.
            while True:
                more = fh.readline(chunk)
                if not more or more.endswith(b"\n"):
                    break
        yield raw.decode("utf-8", errors="replace").rstrip("\r\n")[:max_line]


# --- writing files safely -----------------------------------------------------------------------
# Every file kvplan writes (run folders, reports, the calibration profile, caches, outputs) goes through
# this one writer: the text lands in a fresh temporary file beside the target, created exclusively with a
# random name (a symlink planted at a predictable ``NAME.tmp`` is never followed), then renamed over the
# target (a symlink at the target is replaced, never written through; readers see the old file or the new
# one, never half of it). A target that is a folder, FIFO or device is refused; a full disk or a missing
# permission is one line and exit 2, with the temporary file removed.


def write_file_safely(path: str | Path, text: str | bytes | Iterable[str | bytes], what: str = "",
                      make_parent: bool = False) -> Path:
    """Write ``text`` (UTF-8; bytes as they are; or an iterable of such chunks, written one at a time so a large
    file is never held whole) to ``path`` as described above; returns the path."""
    import os
    import stat
    import tempfile

    target = Path(path)
    shown = f"{what} {target}" if what else str(target)
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise _err(f"cannot write {shown}: {exc.strerror or exc}") from None
    if st is not None and not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        raise _err(f"cannot write {shown}: it is not a regular file", "name a file path")
    tmp = None
    try:
        if make_parent:
            target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name[:80]}.", suffix=".tmp")
        os.fchmod(fd, 0o644)  # as the run folder's other files (mkstemp makes 0600)
        with os.fdopen(fd, "wb") as fh:
            for chunk in (text,) if isinstance(text, (str, bytes)) else text:
                fh.write(chunk.encode("utf-8") if isinstance(chunk, str) else chunk)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
        tmp = None
    except OSError as exc:
        raise _err(f"cannot write {shown}: {exc.strerror or exc}") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return target
