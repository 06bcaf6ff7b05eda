"""``python -m laminar_bench placement ...``: the ``laminar bench`` commands without the CLI.

Same parser and handlers as ``laminar bench``; bad input is one line and exit 2.
"""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

from laminar_base.errors import LaminarError
from laminar_bench.cli import register


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m laminar_bench")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    try:
        code: int = args.func(args, Console())
    except LaminarError as exc:
        print(f"laminar bench: {exc.message}", file=sys.stderr)
        return 2 if exc.code_name == "INVALID_ARGUMENT" else 1
    except KeyboardInterrupt:
        print("laminar bench: interrupted; every daemon was stopped", file=sys.stderr)
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
