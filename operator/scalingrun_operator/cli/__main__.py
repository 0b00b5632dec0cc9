"""`python -m scalingrun_operator.cli`: the same as the `scalingrun` command."""

import sys

from . import main

if __name__ == "__main__":  # imported by a package walk, it runs nothing
    sys.exit(main())
