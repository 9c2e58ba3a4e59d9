"""``spikerec bench lif``: forward + backward of one Linear + one LIF layer.

spikerec, snnTorch and Norse run side by side (T=500, B=16, N=512, float32 by default).
Each library runs in its own subprocess, so its peak resident memory is its own. The
peers get their best case: the Linear is applied to the whole sequence at once, then
their per-step neuron is looped (snnTorch ``Leaky``, Norse ``LIFBoxCell``, the neuron
each library offers without a synaptic current). "LIF part" times the neuron alone
(given the input currents); its achieved bandwidth counts the minimal traffic of the
layer: read the currents and write the spikes forward, read the spike gradients and
write the current gradients backward (4 tensors of ``T*B*N`` floats).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
import warnings


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _worker(lib: str, T: int, B: int, N: int, reps: int, threads: int) -> dict:
    import torch

    warnings.filterwarnings("ignore")
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    x = (torch.rand(T, B, N) < 0.1).float()
    beta = 0.95
    if lib == "spikerec":
        from spikerec.layers import LIF

        cell = LIF(N, N, tau_mem=-1.0 / torch.log(torch.tensor(beta)).item(), reset="subtract", learn_tau=False)

        def full():
            z, _ = cell(x)
            return z

        def neuron(I):
            from spikerec.layers._lif_kernel import LIFSequence

            alpha, _ = cell.decays()
            z, _, _ = LIFSequence.apply(I, torch.zeros(B, N), None, alpha.detach(), None, cell.threshold.detach(),
                                        None, cell.surrogate, "subtract", True)
            return z
    elif lib == "snntorch":
        import snntorch as snn

        fc = torch.nn.Linear(N, N)
        lif = snn.Leaky(beta=beta, threshold=1.0, reset_mechanism="subtract")

        def neuron(I):
            mem = torch.zeros(B, N)
            out = []
            for t in range(T):
                spk, mem = lif(I[t], mem)
                out.append(spk)
            return torch.stack(out)

        def full():
            return neuron(fc(x))
    elif lib == "norse":
        import norse.torch as nt

        fc = torch.nn.Linear(N, N)
        p = nt.LIFBoxParameters(tau_mem_inv=torch.tensor((1 - beta) / 1e-3), v_th=torch.tensor(1.0))
        cellN = nt.LIFBoxCell(p, dt=1e-3)

        def neuron(I):
            s = None
            out = []
            for t in range(T):
                z, s = cellN(I[t], s)
                out.append(z)
            return torch.stack(out)

        def full():
            return neuron(fc(x))
    else:
        raise ValueError(lib)

    def run_full():
        z = full()
        z.sum().backward()

    I0 = torch.randn(T, B, N) * 0.5 + 0.3

    def run_neuron():
        I = I0.clone().requires_grad_()
        z = neuron(I)
        z.backward(torch.ones_like(z))

    base = _rss_mb()
    run_full()  # warm-up
    run_neuron()
    tf, tn = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        run_full()
        tf.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        run_neuron()
        tn.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"lib": lib, "full_s": min(tf), "neuron_s": min(tn), "peak_rss_mb": peak, "base_rss_mb": base}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="spikerec bench lif", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--T", type=int, default=500)
    ap.add_argument("--B", type=int, default=16)
    ap.add_argument("--N", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5, help="timed repetitions (the minimum is reported)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--libs", default="spikerec,snntorch,norse")
    ap.add_argument("--json", help="also write the results to this JSON file")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        print(json.dumps(_worker(a.worker, a.T, a.B, a.N, a.reps, a.threads)))
        return 0
    rows = []
    for lib in a.libs.split(","):
        cmd = [sys.executable, "-m", "spikerec.bench.lif", "--worker", lib, "--T", str(a.T), "--B", str(a.B),
               "--N", str(a.N), "--reps", str(a.reps), "--threads", str(a.threads)]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{lib}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
            continue
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    if not rows:
        return 1
    ref = next((r for r in rows if r["lib"] == "spikerec"), rows[0])
    nbytes = 4 * a.T * a.B * a.N * 4
    print(f"Linear + LIF forward+backward, T={a.T} B={a.B} N={a.N} float32, {a.threads} threads, "
          f"{platform.processor() or platform.machine()}")
    print(f"{'library':<10} {'full ms':>9} {'x spikerec':>11} {'LIF-part ms':>12} {'x spikerec':>11} {'LIF GB/s':>9} {'peak RSS MB':>12}")
    for r in rows:
        print(f"{r['lib']:<10} {1e3*r['full_s']:>9.1f} {r['full_s']/ref['full_s']:>11.2f} {1e3*r['neuron_s']:>12.1f} "
              f"{r['neuron_s']/ref['neuron_s']:>11.2f} {nbytes/r['neuron_s']/1e9:>9.2f} {r['peak_rss_mb']:>12.0f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"T": a.T, "B": a.B, "N": a.N, "threads": a.threads, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
