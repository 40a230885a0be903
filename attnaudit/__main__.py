"""``python -m attnaudit``: the command line."""

from attnaudit.cli import main

raise SystemExit(main())
