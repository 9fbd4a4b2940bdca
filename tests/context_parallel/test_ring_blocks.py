"""Ring attention's blocks: the fused kernels against the explicit math (a bound from the arithmetic, fp32 and bf16),
the part of each block the causal mask shows (block_plan), and the ring computing only that part on real ranks."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import zerokit
from zerokit.context_parallel import block_kernels, layout, ring_attention
from zerokit.context_parallel.block_kernels import CAUSAL
from zerokit.context_parallel.ring_attention import block_plan

U32 = 2.0 ** -24  # fp32's unit roundoff: the fp32 accumulations of both kernels
#: relative error of an fp32 exp: torch's is within an ulp; the CPU flash kernel's vectorised exp_u20, within 2 ulps
EXP = 2 * 2 * U32
ROUNDOFF = {torch.float32: U32, torch.bfloat16: 2.0 ** -8}


def _gamma(n):
    """γ_n = n·u / (1 − n·u): the relative bound on a sum of n fp32 products against the exact one (Higham, §3.1)."""
    return n * U32 / (1 - n * U32)


def _bounds(q, k, v, dout, mask, u):
    """Elementwise bounds on |kernel − exact| for one kernel of input unit roundoff ``u`` (``u`` for the fused one's
    storage of scores, probabilities and results in the input dtype; fp32 accumulation): out, ℓ, dq, dk, dv.

    The magnitudes come from the exact (fp64) values: A = scale·|q||k|ᵀ bounds a score's error as (γ_D + u)·A; a
    probability's relative error is that plus ℓ's and exp's and its rounding; each product of the backward adds γ of its
    length and its rounding u."""
    q, k, v, dout = (t.double() for t in (q, k, v, dout))
    d, lq, lk = q.shape[-1], q.shape[-2], k.shape[-2]
    scale = 1 / math.sqrt(d)
    s = q @ k.transpose(-1, -2) * scale
    hidden = torch.ones(lq, lk, dtype=torch.bool).triu(1) if mask is CAUSAL else torch.zeros(lq, lk, dtype=torch.bool)
    s = s.masked_fill(hidden, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None])
    out = p @ v
    a = (q.abs() @ k.abs().transpose(-1, -2) * scale).masked_fill(hidden, 0)
    score = (_gamma(d) + u) * a                                          # a score's error
    row = score.amax(-1)
    lse_err = row + _gamma(lk) + EXP + U32 * lse.abs()                   # ℓ = log Σ exp(S)
    rel_p = score + lse_err[..., None] + EXP + u                        # a probability's, relative
    out_err = ((rel_p + _gamma(lk)) * p) @ v.abs() + u * out.abs()
    dp_abs = dout.abs() @ v.abs().transpose(-1, -2)
    delta_abs = (dout.abs() * out.abs()).sum(-1, keepdim=True)
    g = p * (dp_abs + delta_abs)                                         # |dS|'s magnitude
    ds_err = (rel_p + 2 * (_gamma(d) + u) + u) * g                       # dP, Δ (O in the input dtype) and dS rounded
    dq_err = scale * ((ds_err + _gamma(lk) * g) @ k.abs()) + u * (scale * g @ k.abs())
    dk_err = scale * ((ds_err + _gamma(lq) * g).transpose(-1, -2) @ q.abs()) + u * (scale * g.transpose(-1, -2)
                                                                                    @ q.abs())
    dv_err = ((rel_p + _gamma(lq)) * p).transpose(-1, -2) @ dout.abs() + u * (p.transpose(-1, -2) @ dout.abs())
    return out_err, lse_err, dq_err, dk_err, dv_err


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", ["diagonal", "early keys", "late queries"])
def test_the_fused_block_kernel_gives_the_explicit_math_within_the_rounding_bound(dtype, shape):
    """One block, as the ring computes it (the diagonal one causal, the zig-zag's half blocks unmasked), through torch's
    fused kernel and through the explicit math, forward (o_b, ℓ_b) and backward (dq, dk, dv, given the merged O and ℓ):
    they differ by no more than the two kernels' rounding bounds added."""
    b, h, n, d = 2, 3, 32, 16
    g = torch.Generator().manual_seed(1)
    q, k, v, dout = (torch.randn(b, h, n, d, generator=g).to(dtype) for _ in range(4))
    mask = CAUSAL if shape == "diagonal" else None
    if shape == "early keys":
        k, v = k[:, :, :n // 2], v[:, :, :n // 2]
    if shape == "late queries":
        q, dout = q[:, :, n // 2:], dout[:, :, n // 2:]
    scale = 1 / math.sqrt(d)
    fused, explicit = block_kernels.choose("fused", q, k, v), block_kernels.choose("explicit", q, k, v)
    assert fused.name == "fused" and explicit.name == "explicit"
    ours_out, ours_lse, state = fused.forward(q, k, v, scale, mask)
    ref_out, ref_lse, _ = explicit.forward(q, k, v, scale, mask)
    ours = [ours_out, ours_lse, *fused.backward(dout, q, k, v, ref_out, ref_lse, scale, mask, state)]
    ref = [ref_out, ref_lse, *explicit.backward(dout, q, k, v, ref_out, ref_lse, scale, mask, None)]
    both = [x + y for x, y in zip(_bounds(q, k, v, dout, mask, ROUNDOFF[dtype]), _bounds(q, k, v, dout, mask, U32))]
    for name, a, r, bound in zip(("out", "lse", "dq", "dk", "dv"), ours, ref, both):
        assert a.shape == r.shape, name
        err = (a.double() - r.double()).abs()
        assert (err <= bound).all(), (name, dtype, shape, err.max().item(), bound.min().item())


def test_block_kernel_choice_is_checked():
    q = torch.randn(1, 2, 8, 4)
    with pytest.raises(ValueError, match="kernel='flash'; allowed: 'auto', 'fused', 'explicit'"):
        block_kernels.choose("flash", q, q, q)
    with pytest.raises(ValueError, match="kernel='fused': torch has no fused attention kernel"):
        block_kernels.choose("fused", q, q.bfloat16(), q)
    assert block_kernels.choose("auto", q, q.bfloat16(), q).name == "explicit"
    assert block_kernels.choose("auto", q, q, q).name == "fused"


def test_the_plan_leaves_out_what_the_causal_mask_hides():
    cp, t = 3, 24
    c = t // (2 * cp)
    zig = [layout.positions(r, cp, t) for r in range(cp)]
    for r in range(cp):
        for src in range(cp):
            block = block_plan(zig[r], zig[src])
            if src == r:  # the diagonal: every query, every key, causal
                assert block == (slice(0, 2 * c), slice(0, 2 * c), CAUSAL, 4 * c * c)
            elif src < r:  # an earlier rank's: every query sees its early chunk's keys only, unmasked
                assert block == (slice(0, 2 * c), slice(0, c), None, 2 * c * c)
            else:  # a later rank's: only the late chunk's queries see it, all of it
                assert block == (slice(c, 2 * c), slice(0, 2 * c), None, 2 * c * c)
    flat = [torch.arange(r * t // cp, (r + 1) * t // cp) for r in range(cp)]
    assert block_plan(flat[0], flat[1]) is None and block_plan(flat[1], flat[0])[2] is None
    odd = block_plan(torch.tensor([1, 5, 0, 3]), torch.tensor([4, 2, 6]))  # rows 1 and 3, keys 0 and 1: a mask left
    assert torch.equal(odd.rows, torch.tensor([1, 3])) and odd.cols == slice(0, 2)
    assert torch.equal(odd.mask, torch.tensor([[False, False], [True, False]])) and odd.pairs == 4


class _Kernels(TorchDispatchMode):
    """Records every fused attention call: (forward or backward, query rows, key rows, is_causal)."""

    OPS = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default: "forward",
           torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default: "backward"}

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.OPS:
            q, k = args[1:3] if self.OPS[func] == "backward" else args[:2]
            at = 7 if self.OPS[func] == "backward" else 4  # is_causal (the dispatcher drops a default False)
            causal = args[at] if len(args) > at else kwargs.get("is_causal", False)
            self.calls.append((self.OPS[func], q.shape[-2], k.shape[-2], causal))
        return func(*args, **kwargs)


B, H, T, D = 2, 2, 24, 8


def _inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, H, T, D, generator=g) for _ in range(4)]


def _ring(ctx, zigzag, kernel):
    """This rank's tokens (zig-zag or contiguous) through ring attention; its output and gradients, and the fused
    kernel calls it made."""
    cp, r = ctx.world_size, ctx.rank
    every = torch.stack([layout.positions(i, cp, T) if zigzag else torch.arange(i * T // cp, (i + 1) * T // cp)
                         for i in range(cp)])
    q, k, v, dout = (t[:, :, every[r]].clone() for t in _inputs())
    for t in (q, k, v):
        t.requires_grad_(True)
    with _Kernels() as kernels:
        out = ring_attention(q, k, v, every[r], every, None, kernel=kernel)
        out.backward(dout)
    return every[r], [out.detach(), q.grad, k.grad, v.grad], kernels.calls


@pytest.mark.parametrize("zigzag", [True, False])
def test_the_ring_computes_only_the_blocks_the_causal_mask_shows(zigzag):
    """cp = 3 ranks, each block computed by the fused kernel and counted: under the zig-zag cut every rank computes its
    diagonal block (causal) and half of each other block; under a contiguous cut rank r computes r + 1 blocks, those of
    the ranks before it whole and unmasked — a later rank's block, all above the diagonal, never. The result equals one
    process's attention either way; the explicit kernel, the same."""
    cp = 3
    q, k, v, dout = (t.clone().requires_grad_(True) for t in _inputs())
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    ref.backward(dout)
    reference = [ref.detach(), q.grad, k.grad, v.grad]
    n, c = T // cp, T // (2 * cp)
    for kernel in ("fused", "explicit"):
        for r, (positions, pieces, calls) in enumerate(zerokit.launch(_ring, cp, zigzag, kernel)):
            if kernel == "explicit":
                assert calls == []
            elif zigzag:
                expected = [(2 * c, 2 * c, True)] + [(2 * c, c, False) if (r - s) % cp < r else (c, 2 * c, False)
                                                     for s in range(1, cp)]
                assert calls == [("forward", *e) for e in expected] + [("backward", *e) for e in expected], calls
            else:
                expected = [(n, n, True)] + [(n, n, False)] * r
                assert calls == [("forward", *e) for e in expected] + [("backward", *e) for e in expected], calls
            for ours, theirs, name in zip(pieces, reference, ("out", "dq", "dk", "dv")):
                # fp32: the same sums in another order, a few ulps of values near 1
                assert torch.allclose(ours, theirs[:, :, positions], atol=1e-5, rtol=1e-5), (kernel, name)
