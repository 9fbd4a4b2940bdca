"""Context parallelism's attention on real ranks: ring attention and Ulysses against one process's causal attention
(forward and every gradient), the zig-zag layout's balance, and the bytes on the cp axis against the theory."""
import pytest
import torch
import torch.nn.functional as F

import zerokit
from zerokit import theory
from zerokit.context_parallel import ATTENTION, layout
from zerokit.runtime import comm

B, H, T, D = 2, 4, 24, 8


def _inputs():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, generator=g) for _ in range(3))
    dout = torch.randn(B, H, T, D, generator=g)
    return q, k, v, dout


def _attend(ctx, kind):
    """This rank's tokens through ``kind``; the outputs and gradients, gathered back into sequence order."""
    import torch.distributed as dist

    cp, r = ctx.world_size, ctx.rank
    q, k, v, dout = _inputs()
    mine = [layout.split(t, r, cp, dim=2).clone().requires_grad_(t is not dout) for t in (q, k, v, dout)]
    positions = layout.positions(r, cp, T)
    all_positions = torch.stack([layout.positions(i, cp, T) for i in range(cp)])
    ledger = comm.ledger()
    ledger.reset()
    with comm.phase("forward"):
        out = ATTENTION[kind](*mine[:3], positions, all_positions, None)
    with comm.phase("backward"):
        out.backward(mine[3])
    sent = {ph: sum(rec.ring_cost_bytes for rec in ledger.records if rec.phase == ph) for ph in ("forward", "backward")}
    pieces = []
    for t in (out.detach(), mine[0].grad, mine[1].grad, mine[2].grad):
        parts = [torch.empty_like(t) for _ in range(cp)]
        dist.all_gather(parts, t.contiguous())
        pieces.append(layout.gather(parts, dim=2))
    return pieces, sent, mine[1].numel() * mine[1].element_size()


def _reference():
    q, k, v, dout = (t.clone().requires_grad_(True) for t in _inputs())
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.backward(dout)
    return [out.detach(), q.grad, k.grad, v.grad]


@pytest.mark.parametrize("cp", [2, 3])
def test_ring_attention_and_ulysses_equal_one_process(cp):
    if cp == 3 and H % 3:  # Ulysses splits heads; 4 heads do not split over 3 ranks: the ring alone at cp = 3
        kinds = ["ring"]
    else:
        kinds = ["ring", "ulysses"]
    reference = _reference()
    for kind in kinds:
        ranks = zerokit.launch(_attend, cp, kind)
        for pieces, sent, block in ranks:
            # fp32: the same sums in another order (blocks merged by log-sum-exp), a few ulps of values near 1
            for ours, theirs, name in zip(pieces, reference, ("out", "dq", "dk", "dv")):
                assert torch.allclose(ours, theirs, atol=1e-5, rtol=1e-5), (kind, name, (ours - theirs).abs().max())
            formula = (theory.ring_attention_bytes if kind == "ring" else theory.ulysses_bytes)(cp, block)
            assert sent == formula, (kind, sent, formula)


def test_ulysses_refuses_heads_that_do_not_split():
    with pytest.raises(Exception, match="do not divide over cp = 3"):
        zerokit.launch(_attend, 3, "ulysses")


def test_the_zigzag_layout_balances_the_causal_work():
    cp, t = 4, 64
    zig = [layout.causal_pairs(r, cp, t) for r in range(cp)]
    flat = [layout.causal_pairs(r, cp, t, zigzag=False) for r in range(cp)]
    assert len(set(zig)) == 1 and sum(zig) == sum(flat) == t * (t + 1) // 2
    assert flat[-1] / flat[0] == pytest.approx((2 * cp - 1), rel=0.2)  # contiguous: the last rank ~2cp−1 × the first
    x = torch.arange(t).view(1, t)
    assert torch.equal(layout.gather([layout.split(x, r, cp) for r in range(cp)]), x)
    with pytest.raises(ValueError, match="multiple of 2·cp"):
        layout.check(30, 4)
