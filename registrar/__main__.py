"""`python -m registrar`: the same as the `registrar` command."""

import sys

from .surfaces.cli import main

sys.exit(main())
