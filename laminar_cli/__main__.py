"""``python -m laminar_cli``: the ``laminar`` command where no script was installed."""

import sys

from laminar_cli.main import main

sys.exit(main())
