"""Host memory signal behind a small interface, so tests and the fake backend need no psutil."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

PSI_MEMORY_PATH = Path("/proc/pressure/memory")


@dataclass(frozen=True)
class HostMemory:
    """Host memory sample; ``psi_some_avg10`` is the percent of time some task stalled on
    memory over 10 s, or None where the kernel has no PSI."""

    used_bytes: int
    total_bytes: int
    psi_some_avg10: float | None = None


class HostMemorySource(Protocol):
    def read(self) -> HostMemory: ...


def parse_psi_some_avg10(text: str) -> float | None:
    """Return the ``some avg10`` value of a /proc/pressure/memory text, None if absent."""
    for line in text.splitlines():
        fields = line.split()
        if not fields or fields[0] != "some":
            continue
        for field in fields[1:]:
            name, _, value = field.partition("=")
            if name == "avg10":
                try:
                    return float(value)
                except ValueError:
                    return None
    return None


class PsutilHostMemory:
    """Reads psutil.virtual_memory (used = total - available) and PSI where present."""

    def __init__(self, psi_path: Path = PSI_MEMORY_PATH) -> None:
        self._psi_path = psi_path

    def read(self) -> HostMemory:
        import psutil  # local: keeps the pure policy importable without psutil

        vm = psutil.virtual_memory()
        try:
            psi = parse_psi_some_avg10(self._psi_path.read_text())
        except OSError:
            psi = None
        return HostMemory(
            used_bytes=int(vm.total - vm.available),
            total_bytes=int(vm.total),
            psi_some_avg10=psi,
        )


class StaticHostMemory:
    """In-memory source for tests and the fake GPU backend; ``set`` changes what ``read`` returns."""

    def __init__(self, used_bytes: int, total_bytes: int, psi_some_avg10: float | None = None):
        self._value = HostMemory(used_bytes, total_bytes, psi_some_avg10)

    def set(self, used_bytes: int, total_bytes: int, psi_some_avg10: float | None = None) -> None:
        self._value = HostMemory(used_bytes, total_bytes, psi_some_avg10)

    def read(self) -> HostMemory:
        return self._value
