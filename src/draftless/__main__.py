from draftless.cli import main

raise SystemExit(main())
