"""`python -m registrar`: the same as the `registrar` command."""

from __future__ import annotations

import sys

from .surfaces.cli import main

sys.exit(main())
