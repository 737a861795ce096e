"""``python -m commitenv``: the ``commitenv`` command line."""

import sys

from commitenv.cli import main

sys.exit(main())
