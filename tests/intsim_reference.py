"""Plain-Python reference of the integer simulator: Python ``int`` per neuron, per sample, per step.

Written from the rules in :mod:`spikerec.hardware.export.profiles` without tensors, so that
:func:`spikerec.hardware.export.intsim.simulate` can be checked bit for bit against it. Slow; use small
networks.
"""
from __future__ import annotations

__all__ = ["simulate_reference", "simulate_xylo_reference"]


def _ov(x: int, bits: int, mode: str) -> int:
    if mode == "wrap_lava":  # Lava 0.10.0 PyLifModelBitAcc: (-2^(N-1), 2^(N-1)]
        half = 1 << (bits - 1)
        while x > half:
            x -= 1 << bits
        while x <= -half:
            x += 1 << bits
        return x
    if mode == "wrap":
        m = 1 << bits
        x = x % m
        return x - m if x >= (m >> 1) else x
    lim = (1 << (bits - 1)) - 1
    return max(-lim, min(lim, x))


def _decay(x: int, code: int, p) -> int:
    if p.decay == "mulshift":
        mag = (abs(x) * ((1 << p.decay_bits) - code)) >> p.decay_bits
        return mag if x >= 0 else -mag
    return x - (x >> code)


def _lst(t):
    return None if t is None else t.tolist()


def _dot(row, vec) -> int:
    return sum(w * s for w, s in zip(row, vec))


def _xylo_decay(x: int, dash: int) -> int:
    s = x >> dash
    if x > 0 and s == 0:
        s = 1
    return x - s


def _sat16(x: int) -> int:
    return max(-32768, min(32767, x))


def _xylo_membrane(v: int, dash: int, i: int, b: int, version: int) -> int:
    """v1: ``sat(D(v) + i + b)``; v2: ``sat(v + sat(sat(-L + i) + b))`` with the leak ``L = v - D(v)``
    negated in 16 bits (two's complement)."""
    if version == 1:
        return _sat16(_xylo_decay(v, dash) + i + b)
    neg = ((_xylo_decay(v, dash) - v + 32768) % 65536) - 32768
    return _sat16(v + _sat16(_sat16(neg + i) + b))


def simulate_xylo_reference(spec, x) -> dict:
    """Xylo's core (rules of :mod:`spikerec.hardware.export.xylo.arithmetic`) neuron by neuron, event by event:
    ``{"spikes", "vmem", "isyn", "out_spikes", "vmem_out", "isyn_out"}`` as ``[T][B][n]`` lists."""
    W_in, W_rec, W_out = spec.weights_in.tolist(), spec.weights_rec.tolist(), spec.weights_out.tolist()
    dm, ds, thr = spec.dash_mem.tolist(), spec.dash_syn.tolist(), spec.threshold.tolist()
    dmo, dso, thro = spec.dash_mem_out.tolist(), spec.dash_syn_out.tolist(), spec.threshold_out.tolist()
    bias = spec.bias.tolist() if spec.bias is not None else [0] * spec.n_hidden
    bias_o = spec.bias_out.tolist() if spec.bias_out is not None else [0] * spec.n_out
    N, K = spec.n_hidden, spec.n_out
    xs = [[[int(c) for c in row] for row in step] for step in x.tolist()]
    keys = ("spikes", "vmem", "isyn", "out_spikes", "vmem_out", "isyn_out")
    rec = {k: [[None] * len(xs[0]) for _ in xs] for k in keys}
    for b in range(len(xs[0])):
        i, v, n, io, vo = [0] * N, [0] * N, [0] * N, [0] * K, [0] * K
        for t, step in enumerate(xs):
            counts = [min(c, 15) for c in step[b]]
            new_n = []
            for j in range(N):
                a = i[j]
                for p, c in enumerate(counts):
                    for _ in range(c):
                        a = _sat16(a + (W_in[p][j] << spec.weight_shift_in))
                for p in range(N):
                    for _ in range(n[p]):
                        a = _sat16(a + (W_rec[p][j] << spec.weight_shift_rec))
                i[j] = _xylo_decay(a, ds[j])
                u = _xylo_membrane(v[j], dm[j], i[j], bias[j], spec.version)
                k = min(u // thr[j], 31) if u >= thr[j] else 0
                v[j] = u - k * thr[j]
                new_n.append(k)
            so = []
            for j in range(K):
                a = io[j]
                for p in range(N):
                    for _ in range(n[p]):
                        a = _sat16(a + (W_out[p][j] << spec.weight_shift_out))
                io[j] = _xylo_decay(a, dso[j])
                u = _xylo_membrane(vo[j], dmo[j], io[j], bias_o[j], spec.version)
                s = 1 if u >= thro[j] else 0
                vo[j] = u - s * thro[j]
                so.append(s)
            n = new_n
            for key, val in zip(keys, (n, v, i, so, vo, io)):
                rec[key][t][b] = list(val)
    return rec


def simulate_reference(qnet, x) -> tuple[list, list]:
    """Returns ``(y[T][B][K], spikes[layer][T][B][N])`` as nested lists of Python ints (for a Xylo
    network ``y`` is ``Vmem_out`` and the spikes are 0/1 per layer: at least one spike in the step)."""
    if hasattr(qnet, "spec"):
        r = simulate_xylo_reference(qnet.spec, x)
        spikes, o = [], 0
        for n in qnet.spec.layer_sizes:
            spikes.append([[[int(c > 0) for c in row[o:o + n]] for row in step] for step in r["spikes"]])
            o += n
        return r["vmem_out"], spikes
    p = qnet.profile
    xs = [[[int(round(float(c))) for c in row] for row in step] for step in x.tolist()]
    T, B = len(xs), len(xs[0])
    layers = []
    for q in qnet.layers:
        layers.append({k: _lst(getattr(q, k)) for k in ("weight", "recurrent_weight", "bias", "decay_i", "decay_v",
                                                         "threshold", "reset_amount", "decay_a", "adapt_inc", "b", "beta")}
                      | {"kind": q.kind, "shift": q.shift, "reset": q.reset, "n": q.size})
    hidden, ro = layers[:-1], layers[-1]
    ys = []
    spikes = [[] for _ in hidden]
    for b in range(B):
        st = [{"i": [0] * L["n"], "v": [0] * L["n"], "z": [0] * L["n"], "a": [0] * L["n"]} for L in hidden]
        y = [0] * ro["n"]
        for t in range(T):
            h = xs[t][b]
            for k, L in enumerate(hidden):
                S = st[k]
                new = {"i": [], "v": [], "z": [], "a": []}
                for j in range(L["n"]):
                    acc = _dot(L["weight"][j], h)
                    if L["recurrent_weight"] is not None:
                        acc += _dot(L["recurrent_weight"][j], S["z"])
                    acc <<= L["shift"]
                    if p.bias_into == "current":
                        acc += L["bias"][j]
                    i = _ov(_decay(S["i"][j], L["decay_i"][j], p) + acc, p.current_bits, p.current_overflow)
                    drive = i if p.bias_into == "current" else i + L["bias"][j]
                    zp = S["z"][j]
                    a = S["a"][j]
                    if L["kind"] == "alif":
                        a = _ov(_decay(a, L["decay_a"][j], p) + L["adapt_inc"][j] * zp, p.state_bits, p.state_overflow)
                        theta = L["b"][j] + ((L["beta"][j] * a) >> p.adapt_frac_bits)
                        v = _ov(_decay(S["v"][j], L["decay_v"][j], p) + drive - theta * zp, p.state_bits, p.state_overflow)
                        z = 1 if v > theta else 0
                    else:
                        v = S["v"][j]
                        R = L["reset_amount"][j]
                        if L["reset"] == "zero" and zp:
                            v = 0
                        if L["reset"] == "subtract" and p.reset_timing == "immediate":
                            v -= R * zp
                        v = _decay(v, L["decay_v"][j], p) + drive
                        if L["reset"] == "subtract" and p.reset_timing == "next_step":
                            v -= R * zp
                        v = _ov(v, p.state_bits, p.state_overflow)
                        z = 1 if v > L["threshold"][j] else 0
                    for key, val in (("i", i), ("v", v), ("z", z), ("a", a)):
                        new[key].append(val)
                st[k] = new
                h = new["z"]
                if b == 0:
                    spikes[k].append([])
                spikes[k][t].append(list(h))
            out = []
            for j in range(ro["n"]):
                acc = _dot(ro["weight"][j], h) << ro["shift"]
                if p.bias_into == "current":
                    i = _ov(acc + ro["bias"][j], p.current_bits, p.current_overflow)
                else:
                    i = _ov(acc, p.current_bits, p.current_overflow) + ro["bias"][j]
                out.append(_ov(_decay(y[j], ro["decay_v"][j], p) + i, p.state_bits, p.state_overflow))
            y = out
            if b == 0:
                ys.append([])
            ys[t].append(list(y))
    return ys, spikes
