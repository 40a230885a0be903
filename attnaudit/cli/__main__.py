"""``python -m attnaudit.cli``: the ``attnaudit`` command."""

from attnaudit.cli import main

raise SystemExit(main())
