"""Entry point: `python -m services.scheduler`."""
import sys

from services.scheduler.app import main

sys.exit(main())
