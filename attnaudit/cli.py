"""The ``attnaudit`` command."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import attnaudit

CHECKOUT = Path(__file__).resolve().parents[1]


def _demo(_: argparse.Namespace) -> int:
    if not (CHECKOUT / "examples" / "date" / "date_attention.pt").exists():
        print("attnaudit demo needs the bundled date model, which ships with the source "
              "checkout (examples/date/); install attnaudit from a clone with `pip install -e .`",
              file=sys.stderr)
        return 2
    sys.path.insert(0, str(CHECKOUT))
    from examples.date.demo import main as demo_main

    demo_main()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="attnaudit", description=attnaudit.__doc__)
    parser.add_argument("--version", action="version", version=attnaudit.__version__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="capture the bundled date model's attention")
    demo.set_defaults(run=_demo)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
