"""Rebuild the derived tables under data/derived/ (``./book derive [NAME ...]``): every table, or those named."""

from __future__ import annotations

import sys
import time

from lib.registry import derived


def main(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(f"usage: ./book derive [NAME ...]\ntables: {', '.join(sorted(derived.TABLES))}")
        return 0
    try:
        names = [derived.table(n).name for n in argv] or sorted(derived.TABLES)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    for name in names:
        t = time.perf_counter()
        path = derived.rebuild(name)
        n = len(derived.keys(name))
        print(f"{name}: {n} entries, {path.stat().st_size:,} bytes -> {path.relative_to(derived.DATA_DIR.parent)} "
              f"({time.perf_counter() - t:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
