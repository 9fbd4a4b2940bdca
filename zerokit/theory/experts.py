"""Expert parallelism's bytes: the all-to-alls of a mixture-of-experts layer (dispatch and combine).

A rank routes its T tokens to k experts each: T·k rows of d elements leave its router — the
dispatch payload, T·k·d·b bytes per layer per direction (:func:`moe_dispatch_payload`). Which
peer each row goes to is the router's choice, so the bytes that actually leave the rank are
a formula on the measured split (:func:`moe_alltoall_bytes`): with s rows sent to other ranks
and q received from them, per layer and call (forward and backward):
8(n − 1) for the counts, (2d + 1)·b·s for the rows there and back with their expert ids,
2d·b·q for the rows it computed and their gradients. (Derivation: :mod:`zerokit.expert_parallel.moe`.)
"""
from __future__ import annotations


def moe_dispatch_payload(tokens: int, top_k: int, d_model: int, element_bytes: int) -> int:
    """Bytes of one dispatch all-to-all's input on one rank: every routed slot's row (dropless)."""
    return tokens * top_k * d_model * element_bytes


def moe_alltoall_bytes(sent_away: int, received_away: int, d_model: int, element_bytes: int, ep: int,
                       calls: int = 1) -> int:
    """Bytes one rank sends on ``ep`` for one MoE layer's ``calls`` forwards and backwards, given the rows it sent to
    other ranks (``sent_away``) and received from them (``received_away``) over those calls."""
    if ep <= 1:
        return 0
    return (8 * (ep - 1) * calls + (2 * d_model + 1) * element_bytes * sent_away
            + 2 * d_model * element_bytes * received_away)
