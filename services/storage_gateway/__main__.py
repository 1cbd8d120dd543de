import sys

from services.storage_gateway.app import main

sys.exit(main())
