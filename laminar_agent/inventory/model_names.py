"""Canonical GPU model names: what NVML reports, turned into what operators and shapes say.

NVML names a GPU for marketing ("NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-16GB"); the
fake backend, job shapes, ``--gpu-model`` flags and usage rows say ``H100-80GB``. One pure
function maps the first to the second so both backends publish the same names.
"""

from __future__ import annotations

import re

GIB = 1 << 30
#: A GPU family token opening the name: H100, A100, V100, L40S, L4, T4, A10G, GH200...
_FAMILY = re.compile(r"^([A-Z]{1,2}\d{1,3}[A-Z]?)\b")
_GB = re.compile(r"(\d+)\s*GB\b", re.IGNORECASE)
#: Nominal memory of models whose NVML name omits it (decimal "GB", as NVIDIA sells them).
_NOMINAL_GB: dict[str, int] = {
    "H100": 80,
    "H200": 141,
    "L4": 24,
    "L40": 48,
    "L40S": 48,
    "T4": 16,
    "A10": 24,
    "A10G": 24,
    "A30": 24,
}
#: Variants whose name omits a memory size that differs from the family's usual one.
_VARIANT_GB: dict[tuple[str, str], int] = {("H100", "NVL"): 94}


def canonical_model(nvml_name: str, memory_total_bytes: int = 0) -> str:
    """``FAMILY-<N>GB`` for a known family; an upper-case, dash-joined form of the name otherwise.

    The memory size comes from the name, then from the table of models whose name omits
    it, then from ``memory_total_bytes`` rounded to GiB; a family with none of these is
    returned bare. Deterministic and total: any string maps to a non-empty name.
    """
    text = re.sub(r"^(NVIDIA|Tesla|Quadro)\s+", "", nvml_name.strip(), flags=re.IGNORECASE)
    family_match = _FAMILY.match(text.upper())
    if family_match is None:
        cleaned = re.sub(r"[^A-Z0-9.]+", "-", text.upper()).strip("-")
        return cleaned or "UNKNOWN"
    family = family_match.group(1)
    gb_match = _GB.search(text)
    words = set(re.split(r"[\s-]+", text.upper()))
    variant = next(
        (gb for (fam, word), gb in _VARIANT_GB.items() if fam == family and word in words), None
    )
    if gb_match is not None:
        gb = int(gb_match.group(1))
    elif variant is not None:
        gb = variant
    elif family in _NOMINAL_GB:
        gb = _NOMINAL_GB[family]
    elif memory_total_bytes > 0:
        gb = round(memory_total_bytes / GIB)
    else:
        return family
    return f"{family}-{gb}GB"
