"""``python -m laminar_cli``: the ``laminar`` command where no script was installed."""

from laminar_cli.main import run

run()
