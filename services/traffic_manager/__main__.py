import sys

from services.traffic_manager.app import main

sys.exit(main())
