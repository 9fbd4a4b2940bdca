"""Expert parallelism's bytes: the all-to-alls of a mixture-of-experts layer (dispatch and combine).

A rank routes its T tokens to k experts each: T·k rows of d elements leave its router — the
dispatch payload, T·k·d·b bytes per layer per direction (:func:`moe_dispatch_payload`). Which
peer each row goes to is the router's choice, so the bytes that actually leave the rank are
a formula on the measured split (:func:`moe_alltoall_bytes`): with s rows sent to other ranks
and q received from them, per layer and call (forward and backward):
8(n − 1) for the counts, (2d·b + 4)·s for the rows there and back with their expert ids (int32,
:data:`EXPERT_ID_BYTES` each, whatever the rows' dtype), 2d·b·q for the rows it computed and
their gradients. (Derivation: :mod:`zerokit.expert_parallel.moe`.)
"""
from __future__ import annotations

from fractions import Fraction

from .transformer import ParamTensor

#: bytes of one routed row's expert id on the wire: int32 (a 16-bit float holds integers exactly only up to 256)
EXPERT_ID_BYTES = 4


def moe_dispatch_payload(tokens: int, top_k: int, d_model: int, element_bytes: int) -> int:
    """Bytes of one dispatch all-to-all's input on one rank: every routed slot's row (dropless)."""
    return tokens * top_k * d_model * element_bytes


def moe_alltoall_bytes(sent_away: int, received_away: int, d_model: int, element_bytes: int, ep: int,
                       calls: int = 1) -> int:
    """Bytes one rank sends on ``ep`` for one MoE layer's ``calls`` forwards and backwards, given the rows it sent to
    other ranks (``sent_away``) and received from them (``received_away``) over those calls."""
    if ep <= 1:
        return 0
    return (8 * (ep - 1) * calls + (2 * d_model * element_bytes + EXPERT_ID_BYTES) * sent_away
            + 2 * d_model * element_bytes * received_away)


def moe_gates_tp_bytes(tokens: int, top_k: int, t: int, layers: int = 1, micro_batches: int = 1) -> float:
    """Bytes one rank sends on ``tp`` for the gates of tensor-parallel MoE layers: with the experts' reductions
    deferred to the layer (:meth:`zerokit.expert_parallel.MoEMLP.split_experts`) each gate's gradient is a partial
    sum over tp, so backward all-reduces the k fp32 gates of each of the ``tokens``: 2(t − 1)/t · tokens · k · 4 per
    layer per micro-batch."""
    if t <= 1:
        return 0.0
    return 2 * (t - 1) / t * tokens * top_k * 4 * layers * micro_batches


# --- for the planner: uniform routing, the parameter inventory, what a layer saves -------------------------------

def moe_alltoall_bytes_uniform(tokens: int, top_k: int, d_model: int, element_bytes: int, ep: int,
                               calls: int = 1) -> dict:
    """:func:`moe_alltoall_bytes` under **uniform routing** (an assumption: every expert equally likely, so
    (ep − 1)/ep of a rank's T·k routed rows go to other ranks, and as many arrive), per layer for ``calls``
    micro-batches: ``{"forward": …, "backward": …}``. Forward: the counts, 8(ep − 1); the rows and their expert
    ids, (d·b + 4)·S; the combine, d·b·S. Backward: the two gradients, 2·d·b·S; S = calls·T·k·(ep − 1)/ep. Their sum
    is ``moe_alltoall_bytes(S, S, …)``."""
    if ep <= 1:
        return {"forward": 0, "backward": 0}
    rows = Fraction(calls * tokens * top_k * (ep - 1), ep)
    forward = 8 * (ep - 1) * calls + (2 * d_model * element_bytes + EXPERT_ID_BYTES) * rows
    backward = 2 * d_model * element_bytes * rows
    return {"forward": forward, "backward": backward}


def moe_parameters(dense: list, experts: int, hidden: int) -> list:
    """The parameter tensors of a transformer whose MLPs are mixtures of ``experts`` experts, in zerokit's MoE
    order: each layer's router (hidden·E weights, no bias: Switch, Mixtral, zerokit's MoE; it stays dense), then
    the layer's MLP tensors (``<block>.mlp.*``) once per expert (``<block>.mlp.experts.<e>.*``). ``dense``: the
    dense model's :class:`~.transformer.ParamTensor` list."""
    out, mlp = [], []

    def flush():
        if not mlp:
            return
        prefix = mlp[0].module.partition(".mlp.")[0]
        out.append(ParamTensor(f"{prefix}.mlp.router.weight", hidden * experts, f"{prefix}.mlp.router",
                               mlp[0].layer, False))
        for e in range(experts):
            for p in mlp:
                module = f"{prefix}.mlp.experts.{e}.{p.module.partition('.mlp.')[2]}"
                out.append(ParamTensor(f"{module}.{p.name.rsplit('.', 1)[1]}", p.numel, module, p.layer,
                                       p.tp_sharded))
        mlp.clear()

    for p in dense:
        if ".mlp." in p.module:
            if mlp and mlp[0].layer != p.layer:
                flush()
            mlp.append(p)
        else:
            flush()
            out.append(p)
    flush()
    return out


def is_expert(tensor) -> bool:
    """Whether a :class:`~.transformer.ParamTensor` of :func:`moe_parameters` belongs to an expert."""
    return ".mlp.experts." in tensor.module


def moe_extra_activation_bytes(s: int, b: int, h: int, ffn: int, experts: int, top_k: int, t: int = 1,
                               element_bytes: int = 2, mlp: str = "gelu", ep: int = 1) -> float:
    """What a MoE MLP saves beyond a dense MLP's (e·h input, 2e·ffn or SwiGLU's 4e·ffn), per layer and micro-batch
    of ``b`` sequences of ``s`` tokens, dropless and with uniform routing, as zerokit's MoE saves it: per token the
    router's fp32 probabilities (4·E); per routed slot (k per token) the expert's input row (e·h), its MLP
    (2e·ffn / 4e·ffn, once more than dense for each slot beyond the first), three rows of output on the way back
    (the experts' outputs, put back in token order, gated: 3e·h) and the bookkeeping (the chosen expert, the slot's
    token and order as int64, its fp32 gate: 28 bytes; dropless, no slot is selected, so no kept flag). Per token:
    4k·e·h + (k − 1)·mlp + 4E + 28k. With ``ep`` > 1 each slot's row is also held as it arrived from the
    all-to-all, put in expert order, with that order (int64): + k·(e·h + 8). Under uniform routing a rank computes
    as many rows as it routes (T·k); a router that favours its experts makes it more."""
    e = element_bytes
    mlp_bytes = (4 if mlp == "swiglu" else 2) * e * ffn
    per_token = 4 * top_k * e * h + (top_k - 1) * mlp_bytes / t + 4 * experts + 28 * top_k
    if ep > 1:
        per_token += top_k * (e * h + 8)
    return s * b * per_token
