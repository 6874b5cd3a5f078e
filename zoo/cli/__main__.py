"""`python -m zoo.cli …`, as `zoo …`."""

import sys

from zoo.cli import main

sys.exit(main())
