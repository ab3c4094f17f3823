"""`python -m bots ...`: the same as the `durable-bots` console script."""

import sys

from bots.cli import main

sys.exit(main())
