"""The local host's memory, for ``--gpu auto`` plans: the CPU offload tier must fit in it."""

from __future__ import annotations

from pathlib import Path

MEMINFO = Path("/proc/meminfo")


def local_host_memory_bytes(meminfo: Path = MEMINFO) -> int | None:
    """``MemTotal`` of /proc/meminfo in bytes, or None where there is no such file or line (not Linux)."""
    try:
        with meminfo.open("rb") as f:
            head = f.read(4096).decode("ascii", "replace")  # MemTotal is the first line
    except OSError:
        return None
    for line in head.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if name == "MemTotal" and len(parts) == 2 and parts[0].isdigit() and parts[1] == "kB":
            return int(parts[0]) * 1024 or None
    return None
