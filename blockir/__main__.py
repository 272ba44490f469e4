from blockir.cli import main

raise SystemExit(main())
