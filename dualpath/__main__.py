from dualpath.cli import main

raise SystemExit(main())
