"""Write ``curse_of_memory.ipynb`` and ``wcrnn.ipynb`` (without outputs; ``_execute.py`` runs and stores them) with nbformat.

Run from anywhere: ``python notebooks/_make_analysis_notebooks.py``. Edit the cells here,
never the JSON.
"""
from __future__ import annotations

from pathlib import Path

from _nbwrite import write_notebook
from nbformat.v4 import new_code_cell, new_markdown_cell

HERE = Path(__file__).resolve().parent

SETUP = '''import os, math
from pathlib import Path
import numpy as np
import torch
from IPython.display import Image, display

QUICK = os.environ.get("SPIKEREC_QUICK") == "1"   # the test suite sets this: tiny sizes, seconds
OUT = Path(os.environ.get("SPIKEREC_OUT", "figures"))  # where the PNGs go
OUT.mkdir(parents=True, exist_ok=True)
torch.set_num_threads(min(4, torch.get_num_threads()))  # small matrices: few threads are faster
print("quick mode" if QUICK else "full mode", "| figures in", OUT.resolve())


def show_png(path, width=720):
    """Show a PNG written to OUT, scaled to `width` pixels and 64 colours (small enough to store here)."""
    import io
    from PIL import Image as PILImage
    im = PILImage.open(path).convert("RGB")
    if im.width > width:
        im = im.resize((width, round(im.height * width / im.width)), PILImage.LANCZOS)
    buf = io.BytesIO()
    im.quantize(colors=64).save(buf, format="png", optimize=True)
    display(Image(data=buf.getvalue()))'''


CURSE = [
    new_markdown_cell("""# The curse of memory

Zucchet & Orvieto (NeurIPS 2024), *Recurrent neural networks: vanishing and exploding gradients are not
the end of the story*. For a stable diagonal recurrence `h_t = λ h_{t-1} + x_t`, the state's sensitivity
to λ grows like `(1-λ)^-3` while the state itself only grows like `(1-λ)^-1`: long memory makes the loss
sharp in the recurrent parameters. This notebook reproduces

1. **Figure 1A**: `E[(dh/dλ)²]` against `1-λ` for AR(1) inputs of correlation ρ (closed forms, checked by Monte
   Carlo; the paper's eq. 59 is wrong for 0 < ρ < 1, and the corrected form is used);
2. **Figure 2**: input normalisation `γ = sqrt(1-λ²)` plus the exp reparametrisation `λ = exp(-exp ω)` keep
   the white-noise sensitivity bounded, but not for strongly correlated inputs;
3. **Figure 3A (small)**: the linear teacher-student task, a dense linear RNN against a diagonal one (LRU), as
   the teacher's memory grows (ν0 → 1).

Set `SPIKEREC_QUICK=1` for a run of seconds (the tests do); the full run takes a few minutes on a laptop CPU."""),
    new_code_cell(SETUP + '''
from spikerec.analysis import curse_of_memory as cm, plots'''),
    new_markdown_cell("""## Figure 1A: sensitivity against memory

Closed forms (`second_moment_dh_dlam`, corrected), the grey line is `E[h²]` at ρ = 1, and the crosses are
Monte Carlo estimates (`monte_carlo_moments`: independent chains, stationary AR(1) inputs, burn-in
`20/(1-λ)`)."""),
    new_code_cell('''one_minus_lam = np.logspace(-4, -0.05, 60)
lam = 1 - one_minus_lam
rhos = [0.0, 0.9, 0.99, 0.999, 1.0]
sens = {f"rho={r}": cm.second_moment_dh_dlam(lam, r) for r in rhos}
mc_lams = [0.5, 0.8] if QUICK else [0.5, 0.8, 0.9, 0.95]
chains = 2000 if QUICK else 40000
mc = [cm.monte_carlo_moments(l, 0.9, n_chains=chains, seed=i) for i, l in enumerate(mc_lams)]
points = {"Monte Carlo, rho=0.9": (1 - np.array(mc_lams), [m["dh2"] for m in mc])}
path = plots.plot_sensitivity_scaling(one_minus_lam, sens, OUT / "curse_fig1a.png",
                                      h2_reference=cm.second_moment_h(lam, 1.0), mc_points=points)
show_png(path)
for l, m in zip(mc_lams, mc):
    print(f"lambda={l}: MC {m['dh2']:.4g} +- {m['dh2_se']:.2g} | corrected {cm.second_moment_dh_dlam(l, 0.9):.4g}"
          f" | paper eq. 59 {cm.paper_eq59(l, 0.9):.4g}")'''),
    new_code_cell('''# scaling exponents fitted on lambda = 1 - 10^-k, k = 2..4
l = 1 - 10.0 ** -np.arange(2, 5)
for r in [0.0, 0.9, 1.0]:
    print(f"rho={r}: slope E[h^2] {cm.loglog_slope(1 - l, cm.second_moment_h(l, r)):+.2f}, "
          f"slope E[(dh/dlam)^2] {cm.loglog_slope(1 - l, cm.second_moment_dh_dlam(l, r)):+.2f}")'''),
    new_markdown_cell("""## Figure 2: normalisation and reparametrisation

Panel A: `(1-λ²) E[h²]` (input normalised by `γ = sqrt(1-λ²)`, treated as a constant). Panel B: the
sensitivity to `ω` with `λ = exp(-exp ω)`. White noise (ρ = 0) is fixed exactly; correlated inputs still
diverge as ρ → 1. A small autograd check on an actual module (`ScalarRecurrence`) follows."""),
    new_code_cell('''rhos2 = [0.0, 0.9, 0.99, 0.999, 1.0]
lam2 = lam[lam < 1 - 1e-4]
h2 = {f"rho={r}": cm.normalized_h2(lam2, r, "detached") for r in rhos2}
dw2 = {f"rho={r}": cm.param_sensitivity(lam2, r, param="exp", gamma="detached") for r in rhos2}
path = plots.plot_normalized_sensitivity(1 - lam2, h2, dw2, OUT / "curse_fig2.png")
show_png(path)

n, T, l0 = (1000, 120, 0.8) if QUICK else (20000, 450, 0.95)
mod = cm.ScalarRecurrence(torch.full((n,), l0), param="exp", gamma="detached")
h = mod(torch.randn(T, n, dtype=torch.float64))
(g,) = torch.autograd.grad(h[-1].sum(), mod.omega)
print(f"autograd E[(dh/domega)^2] = {float((g**2).mean()):.4f}, closed form "
      f"{float(cm.param_sensitivity(l0, 0.0, 'exp', 'detached')):.4f}")'''),
    new_markdown_cell("""## Teacher-student: dense against diagonal recurrence

A 10-unit linear teacher with eigenvalue moduli in `[ν0, 1)` (eq. 15), white inputs, trained with Adam on
fresh batches. Students: a dense linear RNN and spikerec's LRU (`r_min = ν0`). The paper's finding (Fig. 3A):
the dense RNN stops reproducing the teacher as ν0 → 1, the LRU keeps doing so, because its sharp
directions sit on few (diagonal) coordinates that Adam rescales. In the full run (600 steps) the final
losses were, for ν0 = 0.36 / 0.84 / 0.96 / 0.99: dense 1.6e-5 / 1.6e-3 / 0.56 / 1.8, LRU 9.2e-5 / 4.7e-4 /
3.7e-3 / 3.2e-2. The quick run is far too short to converge and only checks that the pipeline works."""),
    new_code_cell('''from spikerec.analysis.teacher_student import DenseLinearRNN, LinearTeacher, train_student
from spikerec.layers.lru import LRU

nu0s = [0.5, 0.99] if QUICK else [0.36, 0.84, 0.96, 0.99]
cfg = dict(steps=15, batch=16, seq_len=60) if QUICK else dict(steps=600, batch=32, seq_len=200)
width = 16 if QUICK else 64
final = {"dense linear RNN": [], "LRU (diagonal)": []}
for nu0 in nu0s:
    teacher = LinearTeacher(10, nu0, seed=0)
    dense = DenseLinearRNN(width, seed=1)
    lru = LRU(1, width, r_min=nu0, r_max=1.0, generator=torch.Generator().manual_seed(1))
    for name, student, lr in (("dense linear RNN", dense, 1e-3), ("LRU (diagonal)", lru, 1e-2)):
        losses = train_student(student, teacher, lr=lr, **cfg)
        final[name].append(float(np.mean(losses[-max(1, len(losses) // 10):])))
    print(f"nu0={nu0}: " + ", ".join(f"{k} {v[-1]:.3g}" for k, v in final.items()))
path = plots.plot_teacher_student(nu0s, final, OUT / "curse_teacher_student.png")
show_png(path)'''),
    new_markdown_cell("""**Reading.** Memory makes the state explode only mildly (`(1-λ)^-1`), but its sensitivity to the
recurrent parameter explodes much faster (`(1-λ)^-3`). Normalising the input and reparametrising λ as
the LRU does removes the explosion for white inputs. The same theory applies to spiking layers:
a sub-threshold LIF neuron is this recurrence with `λ = α = exp(-dt/τ)`, and its log-τ parameter is the exp
reparametrisation (see `spikerec.analysis.model_memory` and `docs/analysis.md`)."""),
]


WCRNN_NB = [
    new_markdown_cell("""# Weakly coupled residual RNNs: Lyapunov spectra and sMNIST-lite

Dubinin & Effenberger, *Fading memory as inductive bias in residual recurrent networks*. A WCRNN updates
`x_t = R x_{t-1} + γ tanh(W x_{t-1} + W_in s_t)` with a fixed residual `R` and a small coupling `γ`, so the
Lyapunov exponents of the input-driven network stay close to `log|eig R|` (eq. 13), and `R` chooses the
memory timescales and the distance to the edge of chaos. This notebook

1. estimates Lyapunov spectra by the QR method (`spikerec.analysis.lyapunov`) and compares them with
   `log|eig R|` for several residuals, and labels them sub-critical / critical / super-critical;
2. shows that the same estimator works for any spikerec cell (an LRU: exactly `log|λ|`);
3. checks the type-B / Elman equivalence;
4. trains WCRNNs with different residuals on **sMNIST-lite**: scikit-learn's 8x8 digits read pixel by
   pixel (64 steps; characteristic frequency `2π/8`, one image row)."""),
    new_code_cell(SETUP + '''
from spikerec.analysis import plots
from spikerec.analysis.lyapunov import (classify_criticality, lyapunov_spectrum, memory_timescales,
                                        residual_lyapunov_prediction)
from spikerec.analysis.wcrnn import WCRNN, characteristic_frequency
from spikerec.analysis.experiments import digits_sequences, train_sequence_classifier

xtr, ytr, xte, yte = digits_sequences()
phi_c = characteristic_frequency(xtr[:, :, 0].t().numpy())[0]
print(f"train {tuple(xtr.shape)}, test {tuple(xte.shape)}, characteristic frequency {phi_c:.4f} = 2 pi / {2 * math.pi / phi_c:.1f}")'''),
    new_markdown_cell("""## Lyapunov spectra against `log|eig R|`

Driven by a sequence of concatenated digits, γ = 0.01, float64, the time Jacobian taken analytically
(`jacobian="analytic"`; the default `"auto"` uses the stability module's `cell_time_jacobian` and gives the
same numbers, slower)."""),
    new_code_cell('''N = 16 if QUICK else 64
T = 256 if QUICK else 1536
drive = xtr[:, : T // 64, :].transpose(0, 1).reshape(T, 1, 1).double()  # digits one after another
configs = {
    "r=0.95": dict(residual="identity", r=0.95),
    "r=0.995": dict(residual="identity", r=0.995),
    "r=1": dict(residual="identity", r=1.0),
    "r=1.0025": dict(residual="identity", r=1.0025),
    "heterogeneous r0=0.96": dict(residual="heterogeneous", r0=0.96, dr=0.06),
    "informed": dict(residual="informed", gamma=0.01),
}
spectra, predicted, runs = {}, {}, {}
for name, kw in configs.items():
    kw = {"gamma": 0.01, **kw}
    cell = WCRNN(1, N, seed=0, **kw)
    res = lyapunov_spectrum(cell, drive, jacobian="analytic", return_running=True)
    spectra[name] = res.exponents[0].numpy()
    predicted[name] = residual_lyapunov_prediction(cell.residual)
    runs[name] = res.running[:, 0].numpy()
    print(f"{name:>22}: LE max {spectra[name][0]:+.5f} (pred {predicted[name][0]:+.5f}), "
          f"min {spectra[name][-1]:+.5f} (pred {predicted[name][-1]:+.5f}), "
          f"label {classify_criticality(spectra[name], tol=1e-3)} / residual {classify_criticality(cell.residual, kind='residual')}, "
          f"sum-logdet gap {abs(res.exponents.sum().item() - res.mean_logdet.item()):.1e}")
sel = ["r=0.95", "r=0.995", "r=1.0025", "heterogeneous r0=0.96"]
path = plots.plot_lyapunov_spectrum({k: spectra[k] for k in sel}, OUT / "wcrnn_spectra.png",
                                    predicted={k: predicted[k] for k in sel})
show_png(path)
path = plots.plot_running_exponents(runs["heterogeneous r0=0.96"], OUT / "wcrnn_running.png",
                                    predicted=predicted["heterogeneous r0=0.96"])
show_png(path)
print("memory timescale of the mean exponent, r=0.995:", float(memory_timescales(spectra["r=0.995"].mean())),
      "steps (prediction -1/log 0.995 = 199.5)")'''),
    new_markdown_cell("""## Any cell: an LRU and a spiking layer

The estimator only needs the cell protocol. For the LRU the time Jacobian is `diag(λ)` in the real
`(Re, Im)` view, so the exponents are exactly `log|λ|` (each twice). A recurrent LIF layer uses its
surrogate derivative in place of the spike's."""),
    new_code_cell('''from spikerec.layers import LIF
from spikerec.layers.lru import LRU

lru = LRU(1, 6, r_min=0.9, r_max=0.999, generator=torch.Generator().manual_seed(0))
le = lyapunov_spectrum(lru, drive[:64]).exponents[0]
ll = torch.log(lru.lam().abs().double()).detach()
print("LRU: max |LE - log|lambda|| =", float((le - torch.sort(torch.cat([ll, ll]), descending=True).values).abs().max()))
lif = LIF(1, 8, recurrent=True, tau_mem=10.0, threshold=0.5)
res = lyapunov_spectrum(lif, 3 * drive[:64])
print("recurrent LIF: LE max", round(res.exponents.max().item(), 4), "| label", classify_criticality(res.exponents, tol=1e-3))'''),
    new_markdown_cell("""## Type B is a weakly coupled residual initialisation of an Elman RNN

`tanh(R x + γ (W x + W_in s))` is `torch.nn.RNN` with `W_hh = R + γ W`, `W_ih = γ W_in` (Sec. 4.4)."""),
    new_code_cell('''cell_b = WCRNN(1, N, residual="rotation", phi=phi_c, r=1.0, gamma=0.01, variant="B", seed=0).double()
rnn = cell_b.to_elman()
with torch.no_grad():
    print("max |WCRNN type B - nn.RNN| =", float((cell_b(drive)[0] - rnn(drive)[0]).abs().max()))'''),
    new_markdown_cell("""## sMNIST-lite

SGD with momentum 0.9, cross-entropy on the last state's readout. The coupling is larger than the
paper's (γ = 0.1 instead of 0.01, informed γ_i in [0.05, 0.2]) so that learning shows within a few epochs at
this short length; `R` is fixed. In the full run (15 epochs) the informed heterogeneous residual reached
about 96% test accuracy, the rotation at the characteristic frequency about 89%, the sub-critical `r = 0.9`
about 74%, while the plain critical identity `r = 1` did not learn: it integrates the non-zero-mean pixel
drive without forgetting, so its state drifts. Rotations at `φ_c` and heterogeneous timescales are what the
paper recommends (Sec. 4.2-4.3)."""),
    new_code_cell('''epochs = 2 if QUICK else 15
hidden = 32 if QUICK else 64
max_train = 400 if QUICK else None
from spikerec.layers import LeakyReadout
from spikerec.models import RecurrentStack

residuals = {
    "r=0.9 (subcritical)": dict(residual="identity", r=0.9, gamma=0.1),
    "r=1 (critical)": dict(residual="identity", r=1.0, gamma=0.1),
    "rotation phi_c": dict(residual="rotation", phi=phi_c, r=1.0, gamma=0.1),
    "informed heterogeneous": dict(residual="informed", gamma_range=(0.05, 0.2)),
}
curves = {}
for name, kw in residuals.items():
    torch.manual_seed(0)
    model = RecurrentStack([WCRNN(1, hidden, seed=0, **kw)], LeakyReadout(hidden, 10, init="kaiming_uniform"),
                           readout_mode="last")
    hist = train_sequence_classifier(model, xtr, ytr, xte, yte, epochs=epochs, lr=0.1, max_train=max_train)
    curves[name] = (hist["epoch"], hist["test_accuracy"])
    print(f"{name:>24}: test accuracy {hist['test_accuracy'][-1]:.3f}")
path = plots.plot_training_curves(curves, OUT / "wcrnn_smnist_lite.png", ylabel="test accuracy (sMNIST-lite)")
show_png(path)'''),
]



def _write(cells, name):
    write_notebook(cells, name, HERE)


if __name__ == "__main__":
    _write(CURSE, "curse_of_memory.ipynb")
    _write(WCRNN_NB, "wcrnn.ipynb")
