from toposlice.cli import main

raise SystemExit(main())
