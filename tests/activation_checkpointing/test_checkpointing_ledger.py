"""What each checkpointing policy keeps for backward, measured against Chen et al. and Korthikanti et al.
through ``zerokit.theory``, and torch's checkpointing side by side.

The ledger (``measure.block_activations``: the tiny GPT's blocks alone, b = 2, s = 16, h = 64,
a = 8, fp32, residual dropout 0.1, CPU's fused attention; ``MemoryLedger.watch_activations()``
over forward and backward). Measured, in bytes (A = one block's activations, X = its input):

    policy           n=4 stored   peak      n=9 stored   peak
    none             595968       595968    1340928      1340928    n·A, A = 148992
    every            32768        173568    73728        214528     n·X, + A − X recomputing
    every_k 2        16384        306176    40960        322560
    sqrt (k=2, 3)    16384        306176    24576        463360
    every_k n        8192         595968    8192         1340928
    selective        591872       591872    1331712      1331712    n·(A − 4·a·s·b)

- A = 148992 is ``theory.transformer_layer_activation_bytes(16, 2, 64, 8, element_bytes=4,
  fused_attention=True)`` (136192) + the LayerNorms' mean and 1/σ (16 B per token, 512) + the
  dropout masks' extra (e − 1) bytes per element on CPU (2 × 6144); tests/tensor_parallel/test_tp_activations.py
  lists each saved tensor. FACTS §5's 16-bit, unfused formula s·b·h·(34 + 5as/h) gives 90112 for
  this shape: fp32 doubles the 2-byte terms and the fused kernel never stores the s × s scores.
- The stored part is exactly ⌈n/k⌉·X. The peak (one segment recomputed while every boundary is
  still kept) is ``theory.checkpointed_activation_bytes`` − X when k divides n: the recomputed
  segment's first block saves its input, which *is* the kept boundary — one storage, counted
  once. The formula's minimum over k lies where Chen's would only if a block's activations
  equalled its input: here A ≈ 18·X, so k = 1 (``every``) gives the smallest peak up to
  n ≈ 2A/X ≈ 36 blocks (then k ≈ √(n·X/A)), not √n; on a chain where A = X
  (``measure.scale_chain``) the measured peak is Chen's k + n/k blocks exactly, minimum 2√n at
  k = √n.
- ``selective`` on CPU saves 1024 bytes per block: the fused kernel's log-sum-exp (4 bytes per
  head per token) is all the attention core keeps of its own: Q, K and V (views of one qkv
  output) are its inputs, which the checkpoint keeps, and its output is the output projection's
  input. With the math kernel (``SDPBackend.MATH``) the core
  stores the a·s² softmax (16384 B per block here, the fp32 analogue of Korthikanti's 5·a·s²·b
  without attention dropout) and selective drops it: the same 591872 either way.
- torch's checkpoint keeps the same live bytes as ``every`` ((n + 1)·X after forward with the
  chain's output; n = 4: 40960, and 280072 at the peak, counted by live tensors); torch-selective keeps each block's matmul outputs (qkv 3X,
  attention projection X, MLP 4X + X) plus its input: 10·X per block. The ledger sees torch's
  kept inputs but not its recompute (its innermost saved-tensor hooks hide them).
"""

import math

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from zerokit import theory
from zerokit.activation_checkpointing.measure import block_activations, scale_chain
from zerokit.activation_checkpointing.policies import THEORY_NAME
from zerokit.workloads import TinyGPT

V, S, H, A, B, E = 64, 16, 64, 8, 2, 4  # vocab, sequence, hidden, heads, batch; fp32 (4 bytes)
X = S * B * H * E  # a block's input, the boundary a checkpoint keeps


def _gpt(n):
    torch.manual_seed(0)
    return TinyGPT(V, S, H, n, A, dropout=0.1), torch.randn(B, S, H)


def _block_bytes():
    """One block's activations by the term-by-term formula, plus the two things this model saves beyond
    it (tests/tensor_parallel/test_tp_activations.py): LayerNorm mean and 1/σ, and CPU dropout's masks in fp32."""
    formula = theory.transformer_layer_activation_bytes(S, B, H, A, element_bytes=E, dropout=True,
                                                        fused_attention=True)
    return formula + 2 * 2 * 4 * S * B + 2 * (E - 1) * S * B * H


@pytest.mark.parametrize("n", [4, 9])
def test_stored_and_peak_activations_per_policy_match_chen_and_korthikanti(n):
    model, x = _gpt(n)
    layer = _block_bytes()
    none = block_activations(model, x, "none", live=False)
    assert none["stored"] == none["peak"] == n * layer, "exact: every saved tensor is a formula term"
    assert layer == 148992 and theory.activation_bytes_per_layer(S, B, H, A) == 90112  # FACTS §5, 16-bit unfused
    peaks = {}
    for k in sorted({1, 3 if n % 3 == 0 else 2, n}):
        policy, every = ("every", None) if k == 1 else ("every_k", k)
        got = block_activations(model, x, policy, every, live=False)
        formula = theory.checkpointed_activation_bytes(n, layer, X, THEORY_NAME[policy], segment_layers=every)
        assert got["stored"] == math.ceil(n / k) * X, (k, got)
        # exact up to one boundary: the recomputed segment's first block saves the kept input itself
        assert got["peak"] == formula - X, (k, got["peak"], formula)
        assert got["recomputed_forwards"] == n
        peaks[k] = got["peak"]
    sqrt = block_activations(model, x, "sqrt", live=False)
    assert sqrt["segment_layers"] == -(-n // theory.optimal_checkpoint_segments(n))
    assert sqrt["peak"] == theory.checkpointed_activation_bytes(n, layer, X, "sqrt") - X
    # A ≈ 18·X: the smallest peak is at one block per segment, as the formula says, not at √n
    assert min(peaks, key=peaks.get) == 1
    formula_best = min(range(1, n + 1), key=lambda k: theory.checkpointed_activation_bytes(n, layer, X, "every-k",
                                                                                          segment_layers=k))
    assert formula_best == 1


def test_uneven_segments_store_the_ceiling_and_peak_below_the_formula():
    model, x = _gpt(9)
    got = block_activations(model, x, "every_k", 2, live=False)  # segments of 2, 2, 2, 2, 1
    formula = theory.checkpointed_activation_bytes(9, _block_bytes(), X, "every-k", segment_layers=2)
    assert got["stored"] == 5 * X
    # the last, shorter segment is recomputed (and its boundary freed) before the first full one
    assert formula - 5 * X <= got["peak"] <= formula - X


def test_a_chain_whose_blocks_keep_their_input_size_peaks_at_chen_k_plus_n_over_k():
    n, d = 16, 256
    model = scale_chain(n, d)
    x = torch.randn(8, d)
    unit = x.numel() * 4
    peaks = {}
    for k in (1, 2, 4, 8, 16):
        policy, every = ("every", None) if k == 1 else ("every_k", k)
        peaks[k] = block_activations(model, x, policy, every, live=False)["peak"]
        assert peaks[k] == theory.checkpointed_blocks(n, n // k) * unit, k  # exact
        assert peaks[k] == theory.checkpointed_activation_bytes(n, unit, unit, "every-k", segment_layers=k)
    assert min(peaks, key=peaks.get) == 4 == theory.optimal_checkpoint_segments(n)
    assert peaks[4] == 2 * math.sqrt(n) * unit


def test_selective_drops_only_the_attention_core_fused_or_not():
    n = 2
    model, x = _gpt(n)
    lse = 4 * A * S * B  # the fused kernel's log-sum-exp: theory's fused_attention term, 4 bytes/head/token
    fused_none, fused_sel = (block_activations(model, x, p, live=False) for p in ("none", "selective"))
    assert fused_none["stored"] - fused_sel["stored"] == n * lse
    with sdpa_kernel(SDPBackend.MATH):
        math_none, math_sel = (block_activations(model, x, p, live=False) for p in ("none", "selective"))
    scores = (theory.transformer_layer_activation_bytes(S, B, H, A, element_bytes=E, dropout=False)
              - theory.transformer_layer_activation_bytes(S, B, H, A, element_bytes=E, dropout=False,
                                                          fused_attention=True))
    assert math_none["stored"] - fused_none["stored"] == n * scores  # the s² softmax instead of the lse
    assert math_sel["stored"] == fused_sel["stored"]  # either kernel's own tensors are all dropped
    assert math_sel["recomputed_forwards"] == fused_sel["recomputed_forwards"] == n


def test_torch_checkpoint_keeps_what_every_keeps_and_selective_keeps_the_matmuls():
    n = 3
    model, x = _gpt(n)
    ours, theirs, sac = (block_activations(model, x, p) for p in ("every", "torch-every", "torch-selective"))
    # live tensors: the n kept inputs and the output, after forward; the same peak while recomputing
    assert ours["live_stored"] == theirs["live_stored"] == (n + 1) * X
    assert ours["live_peak"] == theirs["live_peak"]
    # torch-selective: each block's input and its matmul outputs (qkv 3X, projection X, MLP 4X and X)
    assert sac["live_stored"] == n * 10 * X + X
    # the ledger counts torch's kept inputs but is blind to its recompute (torch's own hooks are innermost)
    assert theirs["stored"] == theirs["peak"] == n * X < ours["peak"]
