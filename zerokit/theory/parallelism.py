"""Model parallelism: the pipeline's makespan, bubble and stash (GPipe; Megatron 2104.04473 §2.2) and
the traffic of tensor, sequence and pipeline parallelism (Megatron 1909.08053 §3; Korthikanti
§4.2.2)."""
from __future__ import annotations


def pipeline_makespan(p: int, m: int, t_f: float = 1.0, t_b: float = 1.0) -> float:
    """(m + p − 1)(t_f + t_b) for p equal stages and m micro-batches."""
    return (m + p - 1) * (t_f + t_b)


def bubble_fraction(p: int, m: int, v: int = 1) -> float:
    """Share of wall time the pipeline idles: (p − 1)/(v·m + p − 1)."""
    return (p - 1) / (v * m + p - 1)


def zb_h1_bubble_fraction(p: int, m: int, t_f: float = 1.0, t_i: float = 1.0, t_w: float = 1.0) -> float:
    """Idle share of ZB-H1 (Qi et al. 2401.10241) for m ≥ p: each rank idles (p − 1)·max(t_f, t_i, t_f + t_i − t_w)
    next to m(t_f + t_i + t_w) of work (the paper's (p − 1)(T_F + T_B − T_W) when T_W ≤ min(T_F, T_B); T_B is the
    input-gradient pass, torch's I). With equal times: (p − 1)/(3m + p − 1), a third of 1F1B's idle time."""
    if m < p:
        raise ValueError(f"zb_h1_bubble_fraction: m={m} < p={p}; the closed form holds for m >= p "
                         f"(use zerokit.simulate for fewer micro-batches)")
    idle = (p - 1) * max(t_f, t_i, t_f + t_i - t_w)
    return idle / (m * (t_f + t_i + t_w) + idle)


def bubble_over_ideal(p: int, m: int, v: int = 1) -> float:
    """Bubble time over ideal compute time: (p − 1)/(v·m)."""
    return (p - 1) / (v * m)


def peak_stashed_microbatches(schedule: str, p: int, m: int, stage: int) -> int:
    """Micro-batches whose activations stage ``stage`` (0-indexed) holds at peak: GPipe m, 1F1B min(p − i, m)."""
    if schedule == "gpipe":
        return m
    if schedule == "1f1b":
        return min(p - stage, m)
    raise ValueError(f"schedule={schedule!r}; allowed: gpipe, 1f1b")


def tp_elements_sent_per_layer(b: int, s: int, h: int, t: int) -> float:
    """Elements a device sends per transformer layer per micro-batch: 4 all-reduces of b·s·h, 8·b·s·h·(t−1)/t."""
    return 8 * b * s * h * (t - 1) / t


def tp_comm_bytes_per_step(tokens: int, reduced_width: int, t: int, bytes_per_element: int,
                           micro_batches: int = 1, gathered_width: int = 0, loss_reductions: int = 0,
                           sequence_parallel_numel: int = 0) -> float:
    """Bytes a rank sends on ``tp`` per step under the ring formula, for any model a plan split.

    Per micro-batch of ``tokens`` (local b·s): every conjugate pair f/g moves ``tokens``
    times its width once, as an all-reduce (2(t−1)/t) or, under sequence parallelism, as an
    all-gather + reduce-scatter pair ((t−1)/t each, the same bytes); ``reduced_width`` is
    the sum of those widths (Megatron's layer: 4h, so 8·b·s·h·(t−1)/t elements, §3).
    ``gathered_width``: outputs all-gathered whole, (t−1)/t. ``loss_reductions``: the
    vocabulary-parallel cross-entropy's all-reduces of ``tokens`` fp32 values (max,
    Σexp, target logit: 3). ``sequence_parallel_numel``: replicated parameters whose
    gradients are all-reduced over ``tp`` once per backward. The planner's per-term view of the
    same traffic for a Megatron transformer: :func:`tp_bytes_sent_per_step`,
    :func:`tp_edge_bytes_per_step`, :func:`sequence_parallel_grad_bytes`.
    """
    if t < 1:
        raise ValueError(f"t={t!r}: the tensor-parallel degree must be >= 1")
    if t == 1:
        return 0
    per_micro_batch = (2 * (t - 1) / t * tokens * reduced_width * bytes_per_element
                       + (t - 1) / t * tokens * gathered_width * bytes_per_element
                       + 2 * (t - 1) / t * tokens * loss_reductions * 4)
    return (per_micro_batch * micro_batches
            + sequence_parallel_grad_bytes(sequence_parallel_numel, t, bytes_per_element, micro_batches))


def tp_bytes_sent_per_step(s: int, b: int, h: int, t: int, layers: int, micro_batches: int,
                           element_bytes: int = 2, recompute: bool = False) -> float:
    """Bytes a TP rank sends per step: 8·b·s·h·(t−1)/t elements per layer per micro-batch (Megatron §3).

    Sequence parallelism replaces each all-reduce by an all-gather + reduce-scatter of the
    same total (Korthikanti §4.2.2). Recomputing the forward (full checkpointing) repeats its
    two all-reduces: 1.5 × the traffic.
    """
    per_layer = tp_elements_sent_per_layer(b, s, h, t) * element_bytes
    return per_layer * layers * micro_batches * (1.5 if recompute else 1)


def tp_edge_bytes_per_step(s: int, b: int, h: int, t: int, micro_batches: int, element_bytes: int = 2,
                           embedding: bool = True, head: bool = True) -> dict:
    """Bytes a TP rank sends per step outside the layers (Megatron §3), by what sends them.

    The vocabulary-parallel embedding sums its partial lookups (g: an all-reduce of b·s·h
    forward); the column-parallel head's f all-reduces its input's gradient (b·s·h backward);
    the vocabulary-parallel cross-entropy all-reduces three fp32 numbers per token (the max
    logit, the sum of exponentials, the target's logit). Sequence parallelism swaps the first
    two for reduce-scatter/all-gather pairs of the same total. Each 2(t−1)/t of its size,
    per micro-batch.
    """
    if t <= 1:
        return {}
    ring = 2 * (t - 1) / t * micro_batches
    out = {}
    if embedding:
        out["embedding"] = ring * b * s * h * element_bytes
    if head:
        out["head"] = ring * b * s * h * element_bytes
        out["loss"] = ring * 3 * b * s * 4
    return out


def sequence_parallel_grad_bytes(replicated_numel: int, t: int, bytes_per_element: int = 2,
                                 micro_batches: int = 1) -> float:
    """Bytes a TP rank sends to sum the gradients of the parameters every rank holds whole (norms, row-parallel
    biases, positions), which under sequence parallelism each saw only 1/t of the sequence: an all-reduce of
    2(t−1)/t of them per backward (zerokit's hooks; Megatron once per step, after accumulation)."""
    if t <= 1:
        return 0.0
    return 2 * (t - 1) / t * replicated_numel * bytes_per_element * micro_batches


def pipeline_send_bytes(boundary_elements: int, micro_batches: int, element_bytes: int) -> int:
    """Bytes a pipeline rank sends across one boundary, one way, per step: m tensors of the boundary's size
    (activations forward, or their gradients backward). For a transformer the boundary is b·s·h elements:
    :func:`pipeline_p2p_bytes`."""
    return micro_batches * boundary_elements * element_bytes


def pipeline_p2p_bytes(s: int, b: int, h: int, micro_batches: int, element_bytes: int = 2, t: int = 1,
                       sequence_parallel: bool = False) -> float:
    """Bytes a stage sends across one pipeline boundary per step, each way: m activations (or gradients) of s·b·h.

    A middle stage sends this forward and again backward. With sequence parallelism each
    TP rank sends its 1/t of the sequence.
    """
    return micro_batches * s * b * h * element_bytes / (t if sequence_parallel else 1)
