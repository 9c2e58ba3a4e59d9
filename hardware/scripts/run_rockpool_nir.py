"""Run a spikerec NIR export in Rockpool (needs rockpool, not a spikerec dependency).

    python hardware/scripts/run_rockpool_nir.py RUN/export/xylo/model.nir --steps 100

Rockpool's importer (`rockpool.nn.modules.torch.nir.from_nir`) reads Affine/Linear, LIF, CubaLIF and LI and
recovers its dt as `min(tau_mem / (1 + r))`; spikerec writes `r = tau/dt`, so check the dt it
reports against the graph's `dt` metadata. Rockpool resets by subtraction right after the spike.
Neither Rockpool nor Lava is installed in spikerec's test environment, so these scripts are not
run by the tests. Compare the printed spike counts with `spikerec export` (float model and integer simulator).
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
