"""Activation memory of one transformer layer under tensor and sequence parallelism, measured
against Korthikanti et al. (arXiv 2205.05198 §4) term by term.

Each rank of a ``tp`` group of t = 1, 2, 4 builds a one-layer tiny GPT from one seed, applies
:func:`zerokit.tensor_parallel.tiny_gpt_plan` and runs ``blocks[0]`` forward inside
``MemoryLedger.watch_activations()`` (the block's parameters tracked as params, so only
activations are left): the ledger's ``activations`` are the bytes autograd saves for backward,
deduplicated by storage. Three layouts: tensor parallel only; sequence parallel with the
column-parallel layers saving their all-gathered input (``regather=False`` in theory); and
sequence parallel keeping only the sequence shard and gathering it again in backward
(``keep_input_sharded=True``, Megatron, the paper's 34/t). The rank also walks the autograd
graph and lists every saved tensor with the node and attribute that saved it, so a difference
from theory names its tensors.

The model against the paper: fp32 (e = 4 bytes), no dropout by default, and
``scaled_dot_product_attention``, which on CPU runs the fused (flash) kernel: it saves Q, K, V
(views of the packed qkv output, one storage), its output (the output projection's input, the
same storage) and a log-sum-exp of 4 bytes per head per token, never the s×s scores, so
``transformer_layer_activation_bytes(..., element_bytes=4, dropout=False, fused_attention=True)``
is the count to compare with. What the model saves that the formula does not count, found by
listing the saved tensors:

- each LayerNorm's statistics: ``native_layer_norm`` saves its mean and 1/σ (``result1``,
  ``result2``), one fp32 number each per token, so 2 norms × 2 × 4 = 16 bytes per token (split
  over t under sequence parallelism, whole without it). The paper leaves them out (8 bytes per
  token against the norm input's e·h); with them the measured bytes equal theory exactly, every
  layout and degree.
- with dropout (``zerokit.tiny_gpt(dropout=p)``: GPT-2's residual dropout after attention and
  after the MLP), the formula's masks are 1 byte per element (a bool, as CUDA's fused
  ``native_dropout`` saves). On CPU torch's dropout is ``input * (bernoulli mask / (1 − p))``
  and the multiplication saves that scaled mask in the input's dtype: e bytes per element, so
  each of the two masks costs (e − 1)·s·b·h bytes more than counted (split over t under
  sequence parallelism). Attention dropout is not added: a fused kernel stores no mask.

Nothing else differs: the GELU's input and the second MLP linear's input, Q/K/V, the output
projection's input and both norms' and column-parallel layers' inputs are exactly the
formula's terms, so ``theory.transformer_layer_activation_bytes`` is right for this model once
those two terms are added. The t-scaling: with sequence parallelism (kept shards) every saved
tensor is 1/t of the t = 1 one, so the per-rank bytes are the t = 1 bytes / t exactly; tensor
parallelism alone divides all but the replicated norm inputs, column-parallel inputs and
LayerNorm statistics (and dropout masks).

Measured (b = 2, s = 16, h = 64, a = 8, fp32; bytes per rank for one layer) against theory:

    dropout  t  layout                     measured    theory  norm stats  masks
    0        1  any                          132608    132096         512      0
    0        2  tp                            82944     82432         512      0
    0        2  sp, saves gathered input      74496     74240         256      0
    0        2  sp, keeps shard               66304     66048         256      0
    0        4  tp                            58112     57600         512      0
    0        4  sp, saves gathered input      45440     45312         128      0
    0        4  sp, keeps shard               33152     33024         128      0
    0.1      1  any                          148992    136192         512  16384
    0.1      2  tp                            99328     86528         512  16384
    0.1      2  sp, keeps shard               74496     68096         256   8192
    0.1      4  sp, keeps shard               37248     34048         128   4096

(with dropout theory counts 1 byte per mask element, 4096 of the 16384 at t = 1.)
"""
from collections import defaultdict

import pytest
import torch

import zerokit
from zerokit import tensor_parallel as tp
from zerokit import theory
from zerokit.runtime.memory import MemoryLedger
from zerokit.workloads import TinyGPT

# vocab, sequence, hidden, heads, batch: s, h, heads and 4h divisible by t = 1, 2, 4; the
# per-token terms e·h = 256, 4·a = 32 (log-sum-exp) and 16 (norm statistics) stay distinct
V, S, H, A, B = 64, 16, 64, 8, 2
E = 4  # fp32
P = 0.1  # dropout probability when on
DEGREES = (1, 2, 4)
#: name → (sequence_parallel, keep_input_sharded)
LAYOUTS = {"tp": (False, False), "sp, saves gathered input": (True, False), "sp, keeps shard": (True, True)}

NORM_STATS = {"NativeLayerNormBackward0._saved_result1", "NativeLayerNormBackward0._saved_result2"}
DROPOUT_MASK = "MulBackward0._saved_other"  # CPU dropout: input * scaled mask


def _saved_inventory(output: torch.Tensor, param_storages: set) -> list:
    """Every storage autograd saved for ``output``'s backward (parameters left out): its bytes,
    and each ``Node.attribute`` that saved it, with shape and dtype."""
    found: dict = {}
    seen, stack = set(), [output.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        name = type(node).__name__
        saved = [(a, getattr(node, a)) for a in dir(node) if a.startswith("_saved_")]
        if not saved and hasattr(node, "saved_tensors"):  # a custom autograd.Function's ctx
            saved = [(f"saved_tensors[{i}]", t) for i, t in enumerate(node.saved_tensors)]
        for attr, value in saved:
            for t in value if isinstance(value, (tuple, list)) else [value]:
                if not torch.is_tensor(t):
                    continue
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key in param_storages:
                    continue
                entry = found.setdefault(key, {"bytes": storage.nbytes(), "saved_by": []})
                entry["saved_by"].append(f"{name}.{attr} {tuple(t.shape)} {str(t.dtype).replace('torch.', '')}")
        stack.extend(n for n, _ in node.next_functions)
    return sorted(({"bytes": e["bytes"], "saved_by": sorted(e["saved_by"])} for e in found.values()),
                  key=lambda e: e["saved_by"])


def _measure(ctx, t: int, dropout: float) -> dict:
    ctx.set_mesh({"dp": 1, "tp": t, "pp": 1})
    group = ctx.mesh.group("tp")
    out = {}
    for layout, (sp, keep) in LAYOUTS.items():
        torch.manual_seed(0)
        model = TinyGPT(V, S, H, 1, A, dropout=dropout)
        tp.apply_plan(model, tp.tiny_gpt_plan(sp, keep), group)
        block = model.blocks[0]
        assert block.training
        x = torch.randn(B, S // t if sp else S, H, requires_grad=True)  # a middle layer's input
        ledger = MemoryLedger()
        ledger.track_model(block)
        with ledger.watch_activations():
            y = block(x)
        measured = ledger.current()["activations"]
        params = {p.untyped_storage().data_ptr() for p in block.parameters()}
        inventory = _saved_inventory(y, params)
        y.sum().backward()  # the saved tensors are released by backward
        out[layout] = {"measured": measured, "after_backward": ledger.current()["activations"],
                       "inventory": inventory}
    return out


@pytest.fixture(scope="module")
def measured():
    """{(dropout, t): [per rank {layout: result}]}: one launch per degree and dropout setting."""
    return {(p, t): zerokit.launch(_measure, t, t, p) for p in (0.0, P) for t in DEGREES}


def _bytes_saved_by(inventory: list, labels) -> int:
    return sum(e["bytes"] for e in inventory if any(s.split(" ")[0] in labels for s in e["saved_by"]))


def _theory(t: int, layout: str, dropout: bool) -> float:
    sp, keep = LAYOUTS[layout]
    return theory.transformer_layer_activation_bytes(S, B, H, A, t, sp, element_bytes=E, dropout=dropout,
                                                     fused_attention=True, regather=keep)


def _table(measured) -> str:
    rows = ["dropout  t  layout                     measured    theory  norm stats  masks"]
    for (p, t), ranks in sorted(measured.items()):
        for layout, got in ranks[0].items():
            inv = got["inventory"]
            rows.append(f"{p:<7}  {t}  {layout:<25} {got['measured']:>9} {_theory(t, layout, p > 0):>9.0f} "
                        f"{_bytes_saved_by(inv, NORM_STATS):>10} {_bytes_saved_by(inv, {DROPOUT_MASK}):>8}")
    return "\n".join(rows)


@pytest.mark.parametrize("t", DEGREES)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_measured_activations_equal_theory_plus_layer_norm_statistics(measured, t, layout):
    """No dropout: measured = Korthikanti's count (fp32, fused attention) + the norms' mean and 1/σ."""
    sp, _ = LAYOUTS[layout]
    tokens = B * S // (t if sp else 1)  # tokens whose norm statistics this rank saves
    for rank in measured[(0.0, t)]:
        got = rank[layout]
        inventory = got["inventory"]
        # the graph walk finds exactly what the ledger counts, and backward frees it all
        assert sum(e["bytes"] for e in inventory) == got["measured"], inventory
        assert got["after_backward"] == 0
        # the tensors theory leaves out: two (b, s/t or s, 1) fp32 tensors per LayerNorm
        stats = [e for e in inventory if {s.split(" ")[0] for s in e["saved_by"]} <= NORM_STATS]
        assert len(stats) == 4 and all(e["bytes"] == tokens * 4 for e in stats), stats
        assert _bytes_saved_by(inventory, {DROPOUT_MASK}) == 0
        assert got["measured"] == _theory(t, layout, False) + 2 * 2 * 4 * tokens, _table(measured)


@pytest.mark.parametrize("t", DEGREES)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_with_dropout_the_cpu_masks_cost_e_bytes_per_element(measured, t, layout):
    """Dropout on: theory(dropout=True) counts 1-byte masks; CPU dropout saves fp32 scaled masks."""
    sp, _ = LAYOUTS[layout]
    tokens = B * S // (t if sp else 1)
    for rank in measured[(P, t)]:
        got = rank[layout]
        inventory = got["inventory"]
        assert sum(e["bytes"] for e in inventory) == got["measured"] and got["after_backward"] == 0
        masks = [e for e in inventory if any(s.startswith(DROPOUT_MASK) for s in e["saved_by"])]
        assert len(masks) == 2 and all(e["bytes"] == E * tokens * H for e in masks), masks
        # the only change from no dropout: the two masks
        assert got["measured"] == measured[(0.0, t)][0][layout]["measured"] + 2 * E * tokens * H
        assert got["measured"] == (_theory(t, layout, True) + 2 * 2 * 4 * tokens
                                   + 2 * (E - 1) * tokens * H), _table(measured)


def test_the_saved_tensors_are_the_papers_terms(measured):
    """t = 2, kept shards: what each op saves, by storage, per token of the local sequence shard."""
    inventory = measured[(0.0, 2)][0]["sp, keeps shard"]["inventory"]
    by_op = defaultdict(int)
    for e in inventory:
        ops = {s.split(".")[0] for s in e["saved_by"]}
        by_op["+".join(sorted(ops))] += e["bytes"]
    local, full = B * S // 2, B * S  # tokens of the shard, of the whole sequence
    assert dict(by_op) == {
        # two norm inputs (the block's input, the residual after attention) and their outputs,
        # which the column-parallel layers keep sharded along the sequence
        "NativeLayerNormBackward0": 2 * (E * H + 2 * 4) * local,
        "SequenceParallelColumnLinearBackward": 2 * E * H * local,
        # q, k, v: views of the packed qkv output (its heads on this rank, whole sequence)
        "ScaledDotProductFlashAttentionForCpuBackward0": (3 * E * H // 2 + 4 * A // 2) * full,
        # the attention output is the row-parallel projection's input: one storage
        "MmBackward0+ScaledDotProductFlashAttentionForCpuBackward0": E * H // 2 * full,
        "GeluBackward0": E * 4 * H // 2 * full,  # the GELU's input (the first MLP linear's output)
        "MmBackward0": E * 4 * H // 2 * full,  # the second MLP linear's input
    }, inventory


def test_sequence_parallel_divides_every_activation_by_t(measured):
    """Korthikanti §4.2.2: with sequence parallelism (kept shards) per-rank bytes = the t = 1 bytes / t,
    exactly; tensor parallelism alone divides all but the replicated terms."""
    for p in (0.0, P):
        one = measured[(p, 1)][0]["tp"]["measured"]
        for t in DEGREES:
            assert all(r["sp, keeps shard"]["measured"] * t == one for r in measured[(p, t)])
            # replicated without sequence parallelism: two norm inputs, two column-parallel inputs,
            # the norms' statistics, and the dropout masks
            replicated = B * S * (4 * E * H + 16 + (2 * E * H if p else 0))
            got = measured[(p, t)][0]["tp"]["measured"]
            assert (got - replicated) * t == one - replicated
            assert (got - measured[(p, t)][0]["sp, keeps shard"]["measured"]) * t == replicated * (t - 1)


def test_the_papers_headline_ratios():
    """16-bit with dropout, unfused attention (the paper's assumptions): the closed forms, the term-by-term count,
    and what sequence parallelism saves at the paper's sizes (its Table 3 models at t = 8, s = 2048)."""
    savings = []
    for s, h, a, t in [(2048, 6144, 64, 8), (2048, 12288, 96, 8), (2048, 20480, 128, 8), (2048, 25600, 160, 8)]:
        b = 1
        full = theory.activation_bytes_per_layer(s, b, h, a, 1)
        tp_only = theory.activation_bytes_per_layer(s, b, h, a, t)
        sp = theory.activation_bytes_per_layer_sequence_parallel(s, b, h, a, t)
        assert full == pytest.approx(s * b * h * (34 + 5 * a * s / h))
        assert sp == pytest.approx(full / t)  # everything divided by t
        assert tp_only - sp == pytest.approx(10 * s * b * h * (1 - 1 / t))  # the replicated 10·sbh
        assert theory.transformer_layer_activation_bytes(s, b, h, a, t) == pytest.approx(tp_only)
        assert theory.transformer_layer_activation_bytes(s, b, h, a, t, True) == pytest.approx(sp)
        savings.append(round(1 - sp / tp_only, 3))
    # 5as/h = 107, 80, 64, 64 against the 10 + 24/t: at t = 8 sequence parallelism saves a third
    # to two fifths of what tensor parallelism alone keeps per layer
    assert savings == [0.332, 0.38, 0.417, 0.417]
    # fused attention (what the tiny GPT runs) saves no s² scores: TP+SP is s·b·(34h + 4a)/t, the
    # log-sum-exp in fp32 in place of 5as/h
    s, h, a, t = 2048, 12288, 96, 8
    fused = theory.transformer_layer_activation_bytes(s, 1, h, a, t, True, fused_attention=True)
    assert fused == pytest.approx(s * (34 * h + 4 * a) / t)


def test_tiny_gpt_dropout_is_off_by_default_and_checked():
    """``dropout=0`` (the default) adds no module, so the default model is unchanged; p > 0 adds one per block."""
    plain = zerokit.tiny_gpt(n_layer=2).build_model()
    assert not any(isinstance(m, torch.nn.Dropout) for m in plain.modules())
    assert all(block.resid_dropout is None for block in plain.blocks)
    dropped = zerokit.tiny_gpt(n_layer=2, dropout=P).build_model()
    assert [n for n, m in dropped.named_modules() if isinstance(m, torch.nn.Dropout)] == [
        "blocks.0.resid_dropout", "blocks.1.resid_dropout"]
    assert plain.state_dict().keys() == dropped.state_dict().keys()
    for bad in (True, -0.1, 1.0, "0.1"):
        with pytest.raises(ValueError, match="dropout"):
            zerokit.tiny_gpt(dropout=bad)
