"""Entry point: `python -m services.decode_engine`."""
import sys

from services.decode_engine.app import main

sys.exit(main())
