"""Run a spikerec netx export in Lava (needs lava-nc and lava-dl, not spikerec dependencies).

    python hardware/scripts/run_lava_netx.py RUN/export/loihi2/netx.h5 --steps 100

Not run by spikerec's tests (Lava is not installed there). Feeds random input spikes and prints the output layer's voltages; compare them with
`spikerec.hardware.export.intsim.simulate` on the same input (the quantised network is in
`quantized.{safetensors,json}` next to the netx file).
"""
import argparse

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("netx")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rate", type=float, default=0.1)
    args = ap.parse_args()
    from lava.lib.dl import netx
    from lava.magma.core.run_conditions import RunSteps
    from lava.magma.core.run_configs import Loihi2SimCfg
    from lava.proc import io

    net = netx.hdf5.Network(net_config=args.netx)
    shape = net.inp.shape
    spikes = (np.random.default_rng(0).random((*shape, args.steps)) < args.rate).astype(np.int32)
    source = io.source.RingBuffer(data=spikes)
    source.s_out.connect(net.inp)
    net.run(condition=RunSteps(num_steps=args.steps), run_cfg=Loihi2SimCfg(select_tag="fixed_pt"))
    print("output voltage:", net.layers[-1].neuron.v.get())
    net.stop()


if __name__ == "__main__":
    main()
