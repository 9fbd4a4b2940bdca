"""Activation memory (Korthikanti et al. 2205.05198 §4, term by term) and activation checkpointing
(Chen et al. 1604.06174)."""
from __future__ import annotations

import math


def activation_bytes_per_layer(s: int, b: int, h: int, a: int, t: int = 1) -> float:
    """Korthikanti et al. §4, 16-bit with dropout: s·b·h·(10 + 24/t + 5·a·s/(h·t)); t = 1 gives 34 + 5as/h."""
    return s * b * h * (10 + 24 / t + 5 * a * s / (h * t))


def checkpointed_blocks(n: int, k: int) -> float:
    """Chen et al.: n blocks in k segments store about k + n/k block activations."""
    return k + n / k


def optimal_checkpoint_segments(n: int) -> int:
    """k = √n minimises k + n/k (at 2√n)."""
    return max(1, round(math.sqrt(n)))


def activation_bytes_per_layer_sequence_parallel(s: int, b: int, h: int, a: int, t: int) -> float:
    """Korthikanti et al. §4.2.2, 16-bit with dropout, tensor + sequence parallel: s·b·h·(34/t + 5·a·s/(h·t)).

    Sequence parallelism splits the layer norms, dropouts and the linear layers' inputs
    along the sequence, so the 10·s·b·h that tensor parallelism alone replicates is divided
    by t as well.
    """
    return s * b * h * (34 / t + 5 * a * s / (h * t))


def transformer_layer_activation_bytes(s: int, b: int, h: int, a: int, t: int = 1, sequence_parallel: bool = False,
                                       ffn: int | None = None, q_dim: int | None = None,
                                       kv_dim: int | None = None, element_bytes: int = 2, dropout: bool = True,
                                       fused_attention: bool = False, mlp: str = "gelu",
                                       cross_attention: bool = False, regather: bool = True) -> float:
    """Bytes one transformer layer saves for backward per micro-batch: Korthikanti et al. §4, term by term.

    Per token, ``e`` bytes per element: two norm inputs and the inputs of QKV and of the
    MLP (4e·h, kept whole on every TP rank unless sequence parallel) and two dropout masks
    (2h, 1 byte each); split over t: Q, K, V and the output projection's input
    (e·(2·q + 2·kv)), the MLP's activation input and second linear's input (2e·ffn; SwiGLU
    4e·ffn: gate, its SiLU, up, and their product), and per head either the materialised
    softmax (e·s) with its dropout mask (s) and output (e·s), or, fused (flash attention),
    the fp32 log-sum-exp (4 bytes). With e = 2, ffn = 4h, dropout, unfused this is
    s·b·h·(10 + 24/t + 5·a·s/(h·t)), and s·b·h·(34/t + 5·a·s/(h·t)) sequence parallel.
    A decoder layer's cross-attention adds a norm input, a query input, Q/K/V, the
    projection input, scores and a mask again (the encoder's output it reads is not counted).
    ``regather=False``: under sequence parallelism the column-parallel layers save their
    all-gathered input (e·h per token each, whole) instead of the shard Megatron keeps and
    gathers again in backward.
    """
    ffn = 4 * h if ffn is None else ffn
    q_dim = h if q_dim is None else q_dim
    kv_dim = q_dim if kv_dim is None else kv_dim
    e = element_bytes
    mask = 1 if dropout else 0
    norms, linear_inputs = 2 * e * h + 2 * mask * h, 2 * e * h
    mlp_bytes = (4 if mlp == "swiglu" else 2) * e * ffn
    attention = e * (2 * q_dim + 2 * kv_dim)
    scores = a * (4 if fused_attention else s * (e + mask * (1 + e)))
    if cross_attention:
        norms, linear_inputs = norms + e * h + mask * h, linear_inputs + e * h
        attention *= 2
        scores *= 2
    if sequence_parallel:
        norms, linear_inputs = norms / t, linear_inputs / t if regather else linear_inputs
    per_token = norms + linear_inputs + (attention + mlp_bytes + scores) / t
    return s * b * per_token


def embedding_activation_bytes(s: int, b: int, h: int, t: int = 1, sequence_parallel: bool = False,
                               dropout: bool = True) -> float:
    """The embedding's dropout mask, s·b·h bytes (Korthikanti §4.3); none without dropout (token ids not counted)."""
    if not dropout:
        return 0
    return s * b * h / (t if sequence_parallel else 1)


def output_activation_bytes(s: int, b: int, h: int, v: int, t: int = 1, sequence_parallel: bool = False,
                            element_bytes: int = 2) -> float:
    """The final norm's and the head's inputs (e·s·b·h each) and the fp32 logits cross-entropy keeps, 4·s·b·v/t.

    Korthikanti §4.3: "2sbh + 2sbh + 4sbv/t" in 16-bit; sequence parallelism splits the
    norm's input, the head's is gathered whole.
    """
    norm_input = element_bytes * s * b * h / (t if sequence_parallel else 1)
    return norm_input + element_bytes * s * b * h + 4 * s * b * v / t


CHECKPOINTING = ("none", "full", "every-k", "sqrt")


def checkpointed_activation_bytes(n: int, layer_bytes: float, boundary_bytes: float, policy: str = "none",
                                  segment_layers: int | None = None, in_flight: int = 1) -> float:
    """Activation bytes of n layers under a checkpointing policy, with ``in_flight`` micro-batches stashed.

    ``none``: every layer's activations, n·A per micro-batch. ``full`` (Korthikanti §5): each
    layer keeps only its input X (``boundary_bytes``), n·X, and one layer's A exists while
    it is recomputed. ``every-k`` (Chen et al. 1604.06174): segments of k layers keep their
    input, ⌈n/k⌉·X, and one segment's k·A during its recompute. ``sqrt``: k = √n, about
    2√n of Chen's blocks. Each in-flight micro-batch holds its stored part; the recompute
    working set exists once (one micro-batch is recomputed at a time).
    """
    if n < 0 or in_flight < 0:
        raise ValueError(f"n={n!r} and in_flight={in_flight!r} must be >= 0")
    if policy == "none":
        return in_flight * n * layer_bytes
    if n == 0:
        return 0
    if policy == "full":
        k = 1
    elif policy == "sqrt":
        k = -(-n // optimal_checkpoint_segments(n))
    elif policy == "every-k":
        if not isinstance(segment_layers, int) or segment_layers < 1:
            raise ValueError(f"segment_layers={segment_layers!r}: every-k needs a positive number of layers")
        k = min(segment_layers, n)
    else:
        raise ValueError(f"policy={policy!r} is not a checkpointing policy; allowed: {', '.join(CHECKPOINTING)}")
    return in_flight * -(-n // k) * boundary_bytes + k * layer_bytes


#: cuBLAS's workspace per handle and stream under torch's default ``CUBLAS_WORKSPACE_CONFIG`` (``:4096:2:16:8``:
#: two 4096 KiB chunks and eight 16 KiB ones; ``:4096:8:16:8`` on Hopper), taken from the caching allocator the
#: first time a matmul runs on a stream (torch's aten/src/ATen/cuda/CublasHandlePool.cpp)
CUBLAS_WORKSPACE_BYTES = 4096 * 1024 * 2 + 16 * 1024 * 8
CUBLAS_WORKSPACE_BYTES_HOPPER = 4096 * 1024 * 8 + 16 * 1024 * 8


def step_transients(batch_size: int, seq_len: int, vocab: int, stepped_numel: int, precision: str = "fp32",
                    hopper: bool = False) -> dict:
    """Estimates of what a training step allocates on a GPU that no ledger category holds (bytes, by name).

    - ``logits' gradient``: B·T·V elements in the parameters' dtype, made by the loss's backward and alive until
      the output layer's backward has used it (at the step's peak in a small model);
    - ``fp32 copies of 16-bit gradients``: in bf16 mixed precision the optimizer step casts each stepped
      gradient to fp32 for its fp32 master, 4·``stepped_numel`` at once; nothing in fp32;
    - ``cuBLAS workspace``: :data:`CUBLAS_WORKSPACE_BYTES` (Hopper: ``_HOPPER``) per stream that ran a matmul.

    These name the gap between the ledger and ``torch.cuda.memory_allocated``; they are not added to the ledger.
    """
    b = 2 if precision == "bf16-mixed" else 4
    return {"logits' gradient": batch_size * seq_len * vocab * b,
            "fp32 copies of 16-bit gradients": 4 * stepped_numel if precision == "bf16-mixed" else 0,
            "cuBLAS workspace": CUBLAS_WORKSPACE_BYTES_HOPPER if hopper else CUBLAS_WORKSPACE_BYTES}
