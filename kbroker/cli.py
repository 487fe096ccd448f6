"""The ``kbroker`` command line."""
from __future__ import annotations

import argparse
import sys

from kbroker import __version__


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kbroker", description="Apache Kafka-compatible broker")
    p.add_argument("--version", action="version", version=f"kbroker {__version__}")
    sub = p.add_subparsers(dest="command")
    sub.add_parser("kernels", help="show which hot-path kernels are compiled")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "kernels":
        from kbroker import kernels

        for name in ("crc32c", "varint", "murmur2", "records"):
            try:
                kernels.load(name)
            except ImportError as e:
                print(f"{name}: missing ({e})")
                continue
            print(f"{name}: {kernels.SELECTED[name]}")
        return 0
    build_parser().print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
