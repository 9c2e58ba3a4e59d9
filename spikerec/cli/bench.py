"""``spikerec bench NAME``: the benchmarks of :mod:`spikerec.bench` (lif, scan, data, lsc, online)."""
from __future__ import annotations

import sys

from .. import bench

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    return int(bench.main(list(sys.argv[1:] if argv is None else argv)) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
