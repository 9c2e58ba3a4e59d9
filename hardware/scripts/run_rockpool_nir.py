"""Run a spikerec NIR export in Rockpool (needs rockpool, not a spikerec dependency).

    python hardware/scripts/run_rockpool_nir.py RUN/export/generic/model.nir --steps 100

Rockpool's importer (`rockpool.nn.modules.torch.nir.from_nir`) reads Affine/Linear, CubaLIF and LI; in
Rockpool 3.1 it fails on NIR `LIF` nodes (it reads `tau_mem`). `spikerec export` runs it itself when
Rockpool is installed (`pip install "spikerec[rockpool]"`) and reports its spike agreement; this script
is for running a file by hand. Compare the printed spike counts with `spikerec export`.
"""
import argparse

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("nir")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rate", type=float, default=0.1)
    args = ap.parse_args()
    import nir
    import torch
    try:
        from rockpool.nn.modules.torch.nir import from_nir
    except ImportError:  # older layouts
        from rockpool.nn.modules import from_nir

    graph = nir.read(args.nir)
    net = from_nir(graph)
    n_in = int(np.asarray(graph.nodes["input"].input_type["input"]).reshape(-1)[0])
    x = (torch.rand(1, args.steps, n_in, generator=torch.Generator().manual_seed(0)) < args.rate).float()
    out, _, rec = net(x, record=True)
    print("graph dt:", graph.metadata.get("dt"), " output shape:", tuple(out.shape))
    print("output sum over time:", out.sum(1))


if __name__ == "__main__":
    main()
