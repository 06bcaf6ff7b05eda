"""``laminar-zone``: the zone router daemon. Not built yet (issue 3); says so plainly."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print(
        "laminar-zone: the zone router is not implemented in this version; "
        "agents run standalone (see README.md)",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
