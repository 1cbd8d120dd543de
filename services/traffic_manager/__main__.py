"""Entry point: `python -m services.traffic_manager`."""
import sys

from services.traffic_manager.app import main

sys.exit(main())
