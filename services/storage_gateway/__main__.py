"""Entry point: `python -m services.storage_gateway`."""
import sys

from services.storage_gateway.app import main

sys.exit(main())
