"""Entry point: `python -m services.prefill_engine`."""
import sys

from services.prefill_engine.app import main

sys.exit(main())
