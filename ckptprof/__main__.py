from ckptprof.cli import main

raise SystemExit(main())
