"""What the bench scripts share: printing one result as JSON (``-o json``) or as lines."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def emit(result: Mapping[str, Any], output: str) -> None:
    """Print ``result`` as one JSON line (``output == "json"``) or one ``key: value`` a line."""
    if output == "json":
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")
