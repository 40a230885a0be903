"""Exit statuses of the ``attnaudit`` command beside 0 (and ``check``'s 1, a failing gate)."""

USAGE_ERROR = 2  # a user error: bad arguments, a target that does not load, a missing extra
INCOMPLETE = 3  # the report was written, but its intervention suite could not run
INTERNAL_ERROR = 4  # an unexpected exception: a bug in attnaudit (--debug: its traceback)
INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a Ctrl-C
