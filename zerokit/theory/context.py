"""Context parallelism's bytes on the ``cp`` axis, per attention call (ring attention and Ulysses).

``block_bytes`` is one rank's key tensor, ``[batch, heads, seq_len / cp, head dim]`` × element
size (its queries and values are the same size). Ring attention sends each block to the next
rank: forward (cp − 1) transfers of K and V; backward (cp − 1) transfers of K and V and, one
step behind them on a second ring, cp of dK and dV — the last brings each block's gradients
home. Ulysses runs all-to-alls, each sending (cp − 1)/cp of one such tensor: q, k, v and the
output in forward, their gradients in backward. (Derivations: :mod:`zerokit.context_parallel.ring_attention`, :mod:`~.ulysses`.)
"""
from __future__ import annotations

from fractions import Fraction

from .activations import transformer_layer_activation_bytes


def _check(cp: int, block_bytes: int) -> None:
    if isinstance(cp, bool) or not isinstance(cp, int) or cp < 1:
        raise ValueError(f"cp={cp!r} must be a positive integer")
    if block_bytes < 0:
        raise ValueError(f"block_bytes={block_bytes!r} must be >= 0")


def ring_attention_bytes(cp: int, block_bytes: int) -> dict:
    """Bytes one rank sends per ring-attention call: ``{"forward": …, "backward": …}``."""
    _check(cp, block_bytes)
    if cp == 1:
        return {"forward": 0, "backward": 0}
    return {"forward": 2 * (cp - 1) * block_bytes, "backward": 4 * (cp - 1) * block_bytes + 2 * block_bytes}


def ulysses_bytes(cp: int, block_bytes: int) -> dict:
    """Bytes one rank sends per Ulysses call: four all-to-alls each way, (cp − 1)/cp of a block each."""
    _check(cp, block_bytes)
    each = Fraction(cp - 1, cp) * block_bytes
    total = 4 * each
    return {"forward": int(total), "backward": int(total)}


# --- for the planner: a layer's bytes from the model's shape, and what a rank saves for backward -----------------

ATTENTIONS = ("ring", "ulysses")


def check_context_parallel(cp: int, seq_len: int, heads: int, attention: str = "ring", kv_heads: int | None = None,
                           t: int = 1) -> None:
    """Refuse a layout context parallelism cannot run: a sequence that does not cut into 2·cp zig-zag chunks,
    an unknown attention, Ulysses with heads (per tensor-parallel rank) that do not divide over cp."""
    _check(cp, 0)
    if attention not in ATTENTIONS:
        raise ValueError(f"cp_attention={attention!r}; allowed: {', '.join(ATTENTIONS)}")
    if cp > 1 and seq_len % (2 * cp):
        raise ValueError(f"cp={cp}: seq_len={seq_len} must be a multiple of 2·cp = {2 * cp} (the zig-zag layout gives "
                         f"each rank two chunks of seq_len / (2·cp) tokens)")
    if attention == "ulysses" and cp > 1:
        for name, n in (("heads", heads), ("KV heads", kv_heads or heads)):
            if (n // t) % cp:
                raise ValueError(f"cp_attention='ulysses' splits the heads over cp = {cp} ranks; {n} {name}"
                                 + (f" over tp = {t} leave {n // t} per rank," if t > 1 else "")
                                 + f" not divisible by {cp} (use ring, or a cp that divides them)")


def cp_attention_bytes(attention: str, cp: int, s: int, b: int, q_dim: int, kv_dim: int | None = None,
                       element_bytes: int = 2) -> dict:
    """Bytes one rank sends on ``cp`` per attention call for a micro-batch of ``b`` sequences of ``s`` tokens cut
    over ``cp`` ranks: ``{"forward": …, "backward": …}``.

    Ring: :func:`ring_attention_bytes` on the rank's key block, b·(s/cp)·kv_dim·e (K and V travel; grouped-query
    heads make it smaller than Q). Ulysses: :func:`ulysses_bytes`'s four all-to-alls of (cp − 1)/cp each, with Q and
    the output q_dim wide and K, V kv_dim wide: (cp − 1)/cp·b·(s/cp)·(2·q_dim + 2·kv_dim)·e each way (the same as
    ``ulysses_bytes(cp, block)`` when q_dim = kv_dim).
    """
    kv_dim = q_dim if kv_dim is None else kv_dim
    local = s // cp
    if attention == "ring":
        return ring_attention_bytes(cp, b * local * kv_dim * element_bytes)
    if attention == "ulysses":
        _check(cp, 0)
        each = Fraction(cp - 1, cp) * b * local * (2 * q_dim + 2 * kv_dim) * element_bytes
        return {"forward": int(each), "backward": int(each)}
    raise ValueError(f"cp_attention={attention!r}; allowed: {', '.join(ATTENTIONS)}")


def moe_aux_cp_bytes(rows: int, experts: int, cp: int) -> float:
    """Bytes one rank sends on ``cp`` per MoE layer and micro-batch of ``rows`` sequences for the load-balancing
    loss, whose per-sequence statistics sum over the cp ranks' chunks: all-reduces of the slots per expert and of
    the router's probability mass forward, and of the mass's gradient backward — 3 · 2(cp − 1)/cp · rows · E · 4."""
    if cp <= 1:
        return 0.0
    return 3 * 2 * (cp - 1) / cp * rows * experts * 4


def cp_attention_calls(attention: str, cp: int) -> dict:
    """Collective calls on ``cp`` per attention call: the ring's sends (forward, one per step that moves a block;
    backward, the K/V blocks' cp − 1 and the dK/dV ring's cp, home included), Ulysses's all-to-alls (q, k, v,
    output; and their gradients)."""
    if cp <= 1:
        return {"forward": 0, "backward": 0}
    if attention == "ring":
        return {"forward": cp - 1, "backward": 2 * cp - 1}
    return {"forward": 4, "backward": 4}


def cp_layer_activation_bytes(s: int, b: int, h: int, a: int, cp: int, attention: str = "ring", t: int = 1,
                              q_dim: int | None = None, fused_attention: bool = True, **korthikanti) -> float:
    """Bytes one transformer layer saves for backward on one of ``cp`` ranks (a micro-batch of ``b`` sequences of
    ``s`` tokens, s/cp of them on this rank).

    Every term of :func:`~.activations.transformer_layer_activation_bytes` is per token, so it is that function on
    s/cp tokens — except the scores, which span every key: unfused, each of the rank's queries keeps a row of s
    scores (Ulysses: the whole sequence for a/cp heads, the same bytes). Ring adds the fp32 output accumulator it
    saves for backward (4·q_dim per token) next to a 16-bit projection's input; with fp32 activations the
    projection reads the accumulator itself (zerokit's ring: its fused block kernel returns the output in the
    projection's layout, tokens-first; the explicit kernel's heads-first output would add a copy, not counted here).
    ``korthikanti``: that function's other arguments.
    """
    local = s // cp
    q_dim = h if q_dim is None else q_dim
    out = transformer_layer_activation_bytes(local, b, h, a, t=t, q_dim=q_dim, fused_attention=fused_attention,
                                             **korthikanti)
    if not fused_attention and cp > 1:  # rows of s scores, not of s/cp
        e, mask = korthikanti.get("element_bytes", 2), 1 if korthikanti.get("dropout", True) else 0
        out += local * b * a * (s - local) * (e + mask * (1 + e)) / t
    if attention == "ring" and cp > 1 and korthikanti.get("element_bytes", 2) != 4:
        out += local * b * 4 * q_dim / t
    return out
