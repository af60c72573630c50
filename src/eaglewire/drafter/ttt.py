"""Training-time test (TTT) for EAGLE-3 drafters.

Shift convention (all indices are sequence positions, T = sequence length)::

    input_ids       x[0] x[1] ... x[T-1]                         [B, T]
    features        f[0] f[1] ... f[T-1]   target features at s  [B, T, A*Ht]
    target_hidden   g[0] g[1] ... g[T-1]   final post-norm state [B, T, Ht]
    target dist.    p[s] = softmax(W_draft g[s])  predicts x[s+1]

    step k (k = 0..steps-1), draft position t:
        token        x[t+1+k]                 (ground truth, shifted again per step)
        hidden in    fc(f[t])  if k == 0  else  draft output of step k-1 at t
        rope pos     t + k                    (as official EAGLE-3 / SpecForge)
        target       p[s],  s = t + 1 + k
        mask         loss_mask[s] * attention_mask[s] * t2d[argmax_full(W g[s])]
                     (0 where s >= T)

So step 0 at t sees (f[t], x[t+1]) and learns the target's distribution at
t+1, i.e. its prediction of x[t+2]. Loss mask, attention mask, argmax and soft
target are all indexed by the *target* position s: "the target distribution at
s is trained iff s is a loss position". With a chat loss mask (1 on assistant
tokens) this trains exactly the distributions the drafter must reproduce when
decoding a response (the first draft of a response matches p[a] where a is
the first response token). Note: the official EAGLE-3 code indexes loss_mask at
the draft position t, i.e. loss_mask[s - 1], which differs by one position at
turn boundaries.

Attention at step k: query t sees the step-0 keys of positions <= t (causal)
and the keys of steps 1..k at position t only (diagonal).

The soft target is softmax over the target logits *restricted to the draft
vocabulary* (rows ``arange(D) + d2t`` of the target head), computed without
materialising full-vocab logits. The full-vocab argmax (needed only for the
mask and the accuracy) is either given (``target_argmax``, e.g. stored by the
capture step) or computed in vocab chunks with a running max.

Loss_k = masked mean (over all valid positions of the batch) of the soft
cross-entropy; total = sum_k decay**k * loss_k. Per-step correct and mask
counts are returned as integers so accuracy aggregates exactly across batches.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from eaglewire.drafter.model import KV, Eagle3Drafter


@dataclass
class TTTOutput:
    """Result of one TTT pass. ``correct[k] / counts[k]`` = acc_k on this batch."""

    loss: torch.Tensor  # scalar, differentiable
    step_losses: list[torch.Tensor] = field(default_factory=list)  # scalars
    # 0-dim int64 tensors, left on device so a training step needs no host sync.
    correct: list[torch.Tensor] = field(default_factory=list)
    counts: list[torch.Tensor] = field(default_factory=list)

    def record(self, weight: float, loss_k: torch.Tensor, correct: torch.Tensor, count: torch.Tensor) -> None:
        """Add one unrolled step: weighted into the total loss, counts kept for exact accuracy."""
        self.loss = self.loss + weight * loss_k
        self.step_losses.append(loss_k)
        self.correct.append(correct)
        self.counts.append(count)

    @property
    def acc(self) -> list[float]:
        """Per-step accuracy on this batch (syncs); 0.0 where nothing is counted."""
        return [
            int(c) / int(n) if int(n) else 0.0
            for c, n in zip(self.correct, self.counts, strict=True)
        ]


@dataclass
class _Targets:
    probs: torch.Tensor  # [B, T, D] soft targets over the draft vocab
    argmax: torch.Tensor  # [B, T] full-vocab target argmax (target ids)
    valid: torch.Tensor  # [B, T] bool position mask (before the per-step shift)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


@torch.no_grad()
def target_full_argmax(
    target_hidden: torch.Tensor, head_weight: torch.Tensor, chunk: int = 32768
) -> torch.Tensor:
    """Full-vocab argmax of ``target_hidden @ head_weight.T`` without [B, T, V] logits.

    Scans the vocab in chunks keeping a running (max, index); strict ``>``
    keeps the first index on ties, like ``torch.argmax``.
    """
    best_val = torch.full(target_hidden.shape[:-1], -torch.inf, device=target_hidden.device)
    best_idx = torch.zeros(target_hidden.shape[:-1], dtype=torch.long, device=target_hidden.device)
    for start in range(0, head_weight.shape[0], chunk):
        logits = target_hidden @ head_weight[start : start + chunk].T  # [B, T, c]
        val, idx = logits.float().max(dim=-1)  # [B, T]
        better = val > best_val
        best_val = torch.where(better, val, best_val)
        best_idx = torch.where(better, idx + start, best_idx)
    return best_idx


@torch.no_grad()
def prepare_targets(
    model: Eagle3Drafter,
    target_hidden: torch.Tensor,  # [B, T, Ht]
    head_weight: torch.Tensor,  # [V, Ht]
    loss_mask: torch.Tensor,  # [B, T]
    attention_mask: torch.Tensor,  # [B, T]
    target_argmax: torch.Tensor | None = None,  # [B, T]
    temperature: float = 1.0,
) -> _Targets:
    """Soft targets over the draft vocab plus the unshifted position mask.

    ``temperature`` sharpens (< 1) or softens the target distribution; 0 gives
    one-hot targets on the target's argmax (plain CE: greedy serving only
    accepts the argmax, so the tail of q is capacity spent elsewhere).

    The head matmul runs in the target's dtype (as the target itself would);
    logits are promoted to at least fp32 before the softmax.
    """
    rows = head_weight[model.draft_target_ids()]  # [D, Ht]
    logits = (target_hidden @ rows.T).to(_compute_dtype(target_hidden.dtype))  # [B, T, D]
    if temperature == 0:
        probs = F.one_hot(logits.argmax(dim=-1), logits.shape[-1]).to(logits.dtype)  # [B, T, D]
    else:
        probs = (logits / temperature).softmax(dim=-1)
    if target_argmax is None:
        target_argmax = target_full_argmax(target_hidden, head_weight)
    target_argmax = target_argmax.to(device=probs.device, dtype=torch.long)
    valid = loss_mask.bool() & attention_mask.bool() & model.t2d[target_argmax]  # [B, T]
    return _Targets(probs, target_argmax, valid)


def ttt_attention_mask(t: int, k: int, device: torch.device | None = None) -> torch.Tensor:
    """bool ``[1, 1, T, (k+1)T]`` for step k: [causal | eye | eye | ... ]."""
    causal = torch.ones(t, t, dtype=torch.bool, device=device).tril()
    eye = torch.eye(t, dtype=torch.bool, device=device)
    return torch.cat([causal] + [eye] * k, dim=1)[None, None]


def shift_left(x: torch.Tensor, n: int) -> torch.Tensor:
    """``out[:, t] = x[:, t+n]``, zero-filled past the end.  [B, T] -> [B, T]."""
    out = torch.zeros_like(x)
    if n < x.shape[1]:
        out[:, : x.shape[1] - n] = x[:, n:]
    return out


def _step_loss(
    model: Eagle3Drafter,
    hidden: torch.Tensor,
    tg: _Targets,
    shift: int,
    gather: bool | None = None,
    lk_weight: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Masked soft CE (+ ``lk_weight`` x the LK loss) and top-1 agreement of positions t vs targets at t+shift.

    ``gather`` (default: on CPU): run the draft head only on the valid rows.
    Masked rows contribute exactly zero loss and gradient either way, so this
    only skips work; it is off on accelerators, where boolean indexing would
    sync with the host.
    """
    n = hidden.shape[1] - shift  # draft positions whose target exists
    if n <= 0:
        zero = torch.zeros((), dtype=torch.long, device=hidden.device)
        return hidden.sum() * 0.0, zero, zero
    if gather is None:
        gather = hidden.device.type == "cpu"
    probs = tg.probs[:, shift:]  # [B, n, D]
    valid = tg.valid[:, shift:]  # [B, n]
    target = tg.argmax[:, shift:]  # [B, n]
    count = valid.sum()
    if gather:
        hidden, probs, target = hidden[:, :n][valid], probs[valid], target[valid]  # [N, ...]
        logits = model.logits(hidden)  # [N, D]
        dtype = torch.promote_types(_compute_dtype(logits.dtype), probs.dtype)
        ce = F.cross_entropy(logits.to(dtype), probs.to(dtype), reduction="sum")  # soft targets
        if lk_weight:
            ce = ce + lk_weight * lk_loss(logits.to(dtype).log_softmax(dim=-1), probs.to(dtype)).sum()
        loss = ce / count.clamp(min=1)
        with torch.no_grad():
            correct = (model.draft_to_target(logits.argmax(dim=-1)) == target).sum()
        return loss, correct, count
    logits = model.logits(hidden[:, :n])  # [B, n, D]
    logp = logits.to(_compute_dtype(logits.dtype)).log_softmax(dim=-1)
    ce = -(probs * logp).sum(dim=-1)  # [B, n]
    if lk_weight:
        ce = ce + lk_weight * lk_loss(logp, probs)
    loss = (ce * valid).sum() / count.clamp(min=1)
    with torch.no_grad():
        pred = model.draft_to_target(logits.argmax(dim=-1))  # [B, n] target ids
        correct = ((pred == target) & valid).sum()
    return loss, correct, count


def lk_loss(logp: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """-log alpha per row, alpha = sum_x min(p(x), q(x)): the chance a sampled draft token is accepted.

    Forward KL is a proxy for acceptance; a drafter with 1-5% of the target's capacity
    converges where KL is low but alpha is not maximal. This is the LK loss of
    Samarin et al. (arXiv 2602.23881), negative log-acceptance, whose gradient is the
    total-variation gradient scaled by 1/alpha (large where acceptance is poor);
    added to KL, which keeps the early gradients informative. [..., D] -> [...].
    """
    alpha = torch.minimum(logp.exp(), q).sum(dim=-1)  # [...]
    return -alpha.clamp(min=1e-6).log()


def _defaults(
    input_ids: torch.Tensor, loss_mask: torch.Tensor | None, attention_mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    ones = torch.ones_like(input_ids, dtype=torch.bool)
    return (ones if loss_mask is None else loss_mask), (
        ones if attention_mask is None else attention_mask
    )


def ttt_forward(
    model: Eagle3Drafter,
    features: torch.Tensor,  # [B, T, A*Ht]
    input_ids: torch.Tensor,  # [B, T]
    target_hidden: torch.Tensor,  # [B, T, Ht] final post-norm target hidden
    target_head_weight: torch.Tensor,  # [V, Ht] frozen target lm_head
    loss_mask: torch.Tensor | None = None,  # [B, T]
    attention_mask: torch.Tensor | None = None,  # [B, T], 1 = real token, right padding
    target_argmax: torch.Tensor | None = None,  # [B, T] optional precomputed full argmax
    steps: int = 7,
    decay: float = 0.8,
    target_temperature: float = 1.0,
    lk_weight: float = 0.0,
) -> TTTOutput:
    """Efficient TTT: one ``model.step_ttt`` per unrolled step over all positions.

    Each layer keeps a list of per-step K/V (never re-concatenated); step k
    attends causally to the step-0 keys and diagonally to steps 1..k, which is
    exactly the block mask [causal | eye * k] of the previous implementation (kept as a
    test reference in ``src/eaglewire_testing/ttt_blockmask.py``)
    without computing its (k+1)T masked keys. With right padding, causal
    attention never lets a real query see a pad key, so ``attention_mask``
    only enters the loss mask.
    """
    loss_mask, attention_mask = _defaults(input_ids, loss_mask, attention_mask)
    tg = prepare_targets(
        model, target_hidden, target_head_weight, loss_mask, attention_mask, target_argmax,
        temperature=target_temperature,
    )
    b, t = input_ids.shape
    hidden = model.project(features)  # [B, T, H]
    cache: list[list[KV]] = [[] for _ in model.decoder_layers]  # per layer, per step
    out = TTTOutput(loss=hidden.new_zeros(()))
    for k in range(steps):
        tokens = shift_left(input_ids, 1 + k)  # [B, T]: x[t+1+k]
        pos = torch.arange(t, device=input_ids.device)[None] + k  # [1, T]
        hidden, new_kv = model.step_ttt(tokens, hidden, pos, cache)  # [B, T, H]
        for layer_cache, kv in zip(cache, new_kv, strict=True):
            layer_cache.append(kv)
        loss_k, correct, count = _step_loss(model, hidden, tg, 1 + k, lk_weight=lk_weight)
        out.record(decay**k, loss_k, correct, count)
    return out


def ttt_forward_naive(
    model: Eagle3Drafter,
    features: torch.Tensor,
    input_ids: torch.Tensor,
    target_hidden: torch.Tensor,
    target_head_weight: torch.Tensor,
    loss_mask: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    target_argmax: torch.Tensor | None = None,
    steps: int = 7,
    decay: float = 0.8,
) -> TTTOutput:
    """Slow reference: position by position, with each query's key list spelled out.

    Shares no mask, shift or target code with :func:`ttt_forward`: targets use
    full-vocab logits and a boolean ``t2d`` column selection, every query is a
    one-token ``step`` whose past is the explicit list [step-0 keys of
    positions <= t, step-1..k-1 keys at t] with an all-True mask.
    """
    loss_mask, attention_mask = _defaults(input_ids, loss_mask, attention_mask)
    b, t_len = input_ids.shape
    with torch.no_grad():
        full = target_hidden @ target_head_weight.T  # [B, T, V]
        full = full.to(_compute_dtype(full.dtype))
        argmax = full.argmax(-1) if target_argmax is None else target_argmax.long()
        probs = full[..., model.t2d].softmax(-1)  # [B, T, D] (draft ids ascend with target ids)
    proj = model.project(features)  # [B, T, H]
    keys: dict[tuple[int, int], list[KV]] = {}  # (step, position) -> per-layer KV [B,nkv,1,hd]
    prev = [proj[:, u : u + 1] for u in range(t_len)]  # hidden input per position
    out = TTTOutput(loss=proj.new_zeros(()))
    for k in range(steps):
        cur = []
        for t in range(t_len):
            s = t + 1 + k
            tok = input_ids[:, s : s + 1] if s < t_len else torch.zeros_like(input_ids[:, :1])
            visible = [(0, u) for u in range(t + 1 if k > 0 else t)] + [(j, t) for j in range(1, k)]
            past = None
            if visible:
                past = [
                    (
                        torch.cat([keys[v][li][0] for v in visible], 2),
                        torch.cat([keys[v][li][1] for v in visible], 2),
                    )
                    for li in range(len(model.decoder_layers))
                ]
            pos = torch.full((b, 1), t + k, dtype=torch.long, device=input_ids.device)
            mask = torch.ones(1, 1, 1, len(visible) + 1, dtype=torch.bool, device=input_ids.device)
            h, kv = model.step(tok, prev[t], pos, past, mask)  # [B, 1, H]
            keys[(k, t)] = kv
            cur.append(h)
        prev = cur
        _naive_accumulate(model, out, cur, probs, argmax, loss_mask, attention_mask, k, decay)
    return out


def _naive_accumulate(
    model: Eagle3Drafter,
    out: TTTOutput,
    hiddens: list[torch.Tensor],  # T x [B, 1, H]
    probs: torch.Tensor,  # [B, T, D]
    argmax: torch.Tensor,  # [B, T]
    loss_mask: torch.Tensor,  # [B, T]
    attention_mask: torch.Tensor,  # [B, T]
    k: int,
    decay: float,
) -> None:
    """Per-position soft CE for step k with explicit target index s = t + 1 + k."""
    t_len = len(hiddens)
    total = hiddens[0].new_zeros(())
    correct = count = 0
    for t in range(t_len):
        s = t + 1 + k
        if s >= t_len:
            continue
        logits = model.logits(hiddens[t])[:, 0]  # [B, D]
        logp = F.log_softmax(logits.to(probs.dtype), dim=-1)
        for bi in range(logits.shape[0]):
            ok = bool(loss_mask[bi, s]) and bool(attention_mask[bi, s])
            ok = ok and bool(model.t2d[argmax[bi, s]])
            if not ok:
                continue
            total = total - (probs[bi, s] * logp[bi]).sum()
            count += 1
            pred = int(logits[bi].argmax()) + int(model.d2t[int(logits[bi].argmax())])
            correct += int(pred == int(argmax[bi, s]))
    loss_k = total / max(count, 1)
    out.loss = out.loss + decay**k * loss_k
    out.step_losses.append(loss_k)
    out.correct.append(torch.tensor(correct))
    out.counts.append(torch.tensor(count))
