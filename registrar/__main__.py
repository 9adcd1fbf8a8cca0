"""`python -m registrar`: the same as the `registrar` command."""

from .surfaces.cli import main

raise SystemExit(main())
