"""Entry point: `python -m dualpath`."""
from dualpath.cli import main

raise SystemExit(main())
