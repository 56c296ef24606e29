"""`python -m flow`: the Vagrant flow (see flow/__init__.py)."""

import sys

from flow.main import main

sys.exit(main())
