"""``spikerec bench NAME``: each benchmark is a module ``spikerec.bench.NAME`` with ``main(argv)``."""
from __future__ import annotations

import importlib
import sys

BENCHES = {
    "lif": "Linear + LIF forward/backward vs snnTorch, Norse, SpikingJelly (T=500, B=16, N=512; about 5 minutes on 2 "
           "CPU cores; --device cuda: the published 16,384-neuron setup and the SHD ALIF network on a GPU)",
    "scan": "sequential loop vs parallel scan (vs Triton on CUDA)",
    "data": "SHD-sized binning cold and from cache",
    "lsc": "one LSC step and a full pre-training of a 2x256 ALIF stack",
    "online": "online eligibility-trace learning vs BPTT: memory and time",
}

# what a run with the default options takes, said before it starts
EXPECTED = {"lif": "about 5 minutes on 2 CPU cores with the default sizes (--T 50 --reps 1: under a minute); "
                   "each part is announced as it starts"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: spikerec bench NAME [options]\n\nbenchmarks:")
        for k, v in BENCHES.items():
            print(f"  {k:<8} {v}")
        return 0
    name = argv.pop(0)
    if name not in BENCHES:
        print(f"spikerec bench: unknown benchmark '{name}'; expected one of {', '.join(BENCHES)}", file=sys.stderr)
        return 2
    if name in EXPECTED and not {"-h", "--help"} & set(argv) and "cuda" not in argv:
        print(f"spikerec bench {name}: {EXPECTED[name]}", flush=True)
    return int(importlib.import_module(f"spikerec.bench.{name}").main(argv) or 0)
