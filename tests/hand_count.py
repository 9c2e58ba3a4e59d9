"""Synaptic operations, sparsity and connection sparsity counted by their definitions (NeuroBench,
Yik et al. 2025), for tests of the NeuroBench-backed deployment metrics."""
import torch


def hand_count(model, x):
    """Per sample: ACs/MACs by the definition (nnz weights in the column of every non-zero input)."""
    with torch.no_grad():
        _, _, hidden = model(x, record=True)
    T, B = x.shape[:2]
    layers = []
    for i, c in enumerate(model.cells):
        inp = x if i == 0 else hidden[i - 1]
        layers.append((c.weight, inp))
        rec = c.effective_recurrent_weight()
        if rec is not None:
            prev = torch.cat([torch.zeros_like(hidden[i][:1]), hidden[i][:-1]])
            layers.append((rec, prev))
    layers.append((model.readout.weight, hidden[-1]))
    ac = mac = dense = 0.0
    for w, inp in layers:
        nnz_col = (w != 0).sum(0).to(torch.float64)               # [in]
        ops = ((inp != 0).to(torch.float64) * nnz_col).sum().item()
        binary = bool(((inp == 0) | (inp == 1) | (inp == -1)).all())
        # NeuroBench decides AC vs MAC per call (per step); x is either binary or not at every step here
        if binary:
            ac += ops
        else:
            mac += ops
        dense += T * w.shape[0] * w.shape[1] * B
    zeros = sum(int((w == 0).sum()) for w, _ in layers)
    total = sum(w.numel() for w, _ in layers)
    spikes = torch.cat([h.reshape(-1) for h in hidden])
    per_layer = {f"layer{i}": 1 - h.count_nonzero().item() / h.numel() for i, h in enumerate(hidden)}
    return dict(ac=ac / B, mac=mac / B, dense=dense / B, conn=zeros / total,
                act=1 - spikes.count_nonzero().item() / spikes.numel(), per_layer=per_layer)
