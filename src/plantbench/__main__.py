"""``python -m plantbench <step>``: the CLI through the interpreter itself (the rules call this)."""

import sys

from plantbench.cli import main

sys.exit(main())
