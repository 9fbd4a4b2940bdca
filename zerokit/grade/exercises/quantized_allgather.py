"""Exercise 17: a block-quantized all-gather, ZeRO++'s qwZ (Wang et al., arXiv 2306.10209 §3.1).

Interface: ``quantize(x, block_size)`` → ``(q, scales)``: int8 codes (one per element) and one
float32 scale per block of ``block_size`` consecutive elements, the last block short when
``block_size`` does not divide the size; ``dequantize(q, scales, block_size, numel)`` → the
``numel`` float32 values; ``quantized_all_gather(shard, block_size, group=None)`` → every
rank's shard, quantized by its owner, gathered as codes and scales through
``zerokit.comm.all_gather`` and dequantized chunk by chunk. Graded: the codec on its own (pure
functions, called in the submission's process: a ``quantized_all_gather`` still unwritten
fails only the checks that need it) on one tensor (a short last block, an all-zero block,
magnitudes 10⁵ apart); then, on 3 ranks in one launch, the gather on the 3 ranks and on a
group of 2 of them (shard sizes that blocks do not divide),
judged against :mod:`zerokit.theory.zeropp`: each scale = its block's absmax/127
(:func:`~zerokit.theory.zeropp.block_quantization_scale`), each element within half its own
block's scale (:func:`~zerokit.theory.zeropp.block_quantization_error_bound`), and the
all-gathers' bytes to the byte (:func:`~zerokit.theory.zeropp.quantized_bytes`: int8 codes
plus float32 scales). The library's version: :mod:`zerokit.zero.quantize`.
"""
from __future__ import annotations

import math

import torch

from ... import theory
from ...theory import zeropp
from ..core import Check, Exercise, Fail, learner_answer, learner_call, Scenario

N = 3
QMAX = zeropp.quantization_levels(8)
#: the codec's tensor: 53 elements in blocks of 8 — six full blocks and a short one of 5; block 2 all zeros
CODEC_NUMEL, CODEC_BLOCK = 53, 8
CODEC_MAGNITUDES = (1.0, 1e3, 0.0, 1e-2, 10.0, 1e-1, 1e2)
#: the gathers: (phase, ranks, elements per shard, block size) — neither block size divides its shard
GATHERS = (("world", N, 37, 8), ("pair", 2, 20, 6))


def _blocked(numel: int, block: int, magnitudes, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(numel, generator=g)
    scale = torch.tensor([magnitudes[i // block] for i in range(numel)], dtype=torch.float32)
    return x * scale


def codec_tensor() -> torch.Tensor:
    return _blocked(CODEC_NUMEL, CODEC_BLOCK, CODEC_MAGNITUDES, 17)


def shard(phase: str, rank: int) -> torch.Tensor:
    """Rank ``rank``'s shard in the ``world`` or ``pair`` gather: blocks of magnitudes 10⁻²…10³, rank 1 an all-zero block."""
    _, _, numel, block = next(g for g in GATHERS if g[0] == phase)
    blocks = -(-numel // block)
    shift = 0 if phase == "world" else 2
    magnitudes = [10.0 ** (((b + rank + shift) % 5) - 2) for b in range(blocks)]
    if rank == 1:
        magnitudes[1] = 0.0
    return _blocked(numel, block, magnitudes, 100 * (1 + shift) + rank)


def _copy(value):
    return value.detach().clone() if torch.is_tensor(value) else value


def _codec(ctx, ns, probe):
    """Scenario ``codec`` (no ranks, in the submission's process): quantize and dequantize on their own — pure
    functions — on the codec's tensor, so that a quantized_all_gather still unwritten fails only the checks that
    need it, and a dequantize still unwritten only the round trip. Each call's answer, or what it raised."""
    x = codec_tensor()

    def quantized():
        q, scales = ns["quantize"](x.clone(), CODEC_BLOCK)
        return _copy(q), _copy(scales)

    coded = learner_call(quantized)
    out = {"quantize": coded}
    if "value" in coded:
        q, scales = coded["value"]
        out["dequantize"] = learner_call(lambda: _copy(ns["dequantize"](q, scales, CODEC_BLOCK, CODEC_NUMEL)))
    return out


def _run(ctx, ns, probe):
    import torch.distributed as dist

    rank = ctx.rank
    out = {}
    pair = dist.new_group(list(range(2)))
    for phase, n, _, block in GATHERS:
        group = None if phase == "world" else pair
        with probe.phase(phase):
            out[phase] = _copy(ns["quantized_all_gather"](shard(phase, rank), block, group)) if rank < n else None
    out["calls"] = probe.calls()
    return out


# --- what a right answer gives, and the wrong answers the judges recognise ---------------------------------

def block_scales(x: torch.Tensor, block: int) -> torch.Tensor:
    """Each block's step from zerokit.theory: absmax/127, 1 for an all-zero block."""
    return torch.tensor([zeropp.block_quantization_scale(float(b.abs().max()), 8) for b in x.split(block)])


def bound(x: torch.Tensor, block: int) -> torch.Tensor:
    """Each element's allowed |x − deq|: half its own block's scale (0 in an all-zero block, which comes back exact),
    plus float32's own rounding of the quotient and the product (a few ulps of the value)."""
    per_block = [0.0 if float(b.abs().max()) == 0 else zeropp.block_quantization_error_bound(float(s))
                 for b, s in zip(x.split(block), block_scales(x, block))]
    half = torch.tensor(per_block).repeat_interleave(block)[:x.numel()]
    return half * (1 + 1e-5) + x.abs() * 2.0 ** -21


def _codes(x: torch.Tensor, scales_per_element: torch.Tensor) -> torch.Tensor:
    return torch.round(x / scales_per_element).clamp(-QMAX, QMAX)


def _tiled(x: torch.Tensor, block: int) -> torch.Tensor:
    """Right codes, each times the scale ``scales.repeat(block)`` puts there: another block's."""
    s = block_scales(x, block)
    return _codes(x, s.repeat_interleave(block)[:x.numel()]) * s.repeat(block)[:x.numel()]


def _one_scale(x: torch.Tensor, block: int) -> torch.Tensor:
    """One scale for the whole tensor (its absmax), as if it were one block."""
    s = zeropp.block_quantization_scale(float(x.abs().max()), 8)
    return _codes(x, torch.full_like(x, s)) * s


def _as_one_buffer(phase: str, n: int, block: int) -> torch.Tensor:
    """Every shard's right codes, gathered, dequantized as one tensor with the gathered scales: each shard's short last
    block shifts every later element onto another block's scale."""
    shards = [shard(phase, j) for j in range(n)]
    codes = torch.cat([_codes(x, block_scales(x, block).repeat_interleave(block)[:x.numel()]) for x in shards])
    scales = torch.cat([block_scales(x, block) for x in shards])
    return codes * scales.repeat_interleave(block)[:codes.numel()]


def _diagnose(x: torch.Tensor, got, block: int, what: str, rank=None) -> None:
    """Fail with what is wrong with ``got`` as the values ``x`` was quantized to, in blocks of ``block``."""
    numel = x.numel()
    if not torch.is_tensor(got):
        raise Fail(f"{what} returned {type(got).__name__}, not a tensor", "a float32 tensor", type(got).__name__, rank)
    got = got.reshape(-1).to(torch.float32)
    short = numel % block
    if got.numel() != numel:
        dropped = short and got.numel() == numel - short
        raise Fail(f"{what} returned {got.numel()} values for {numel} elements" +
                   (f": the last, short block ({numel} = {numel // block}·{block} + {short}) is missing — "
                    f"⌈{numel}/{block}⌉ = {-(-numel // block)} blocks, the last one short, with its own scale"
                    if dropped else ""), numel, got.numel(), rank)
    zero = torch.tensor([float(b.abs().max()) == 0 for b in x.split(block)]).repeat_interleave(block)[:numel]
    if not torch.isfinite(got).all():
        where = ~torch.isfinite(got)
        if bool((where & zero).any()):
            raise Fail(f"{what}: an all-zero block came back as NaN — its absmax is 0, so absmax/127 = 0 and "
                       f"0/0 = NaN; give an all-zero block the scale 1 (its codes are 0, it comes back exact)",
                       "exact zeros", "NaN", rank)
        raise Fail(f"{what}: {int(where.sum())} values came back as NaN or inf", "finite values", "NaN/inf", rank)
    error, allowed = (got - x).abs(), bound(x, block)
    bad = error > allowed
    if not bool(bad.any()):
        return
    first = int(bad.nonzero()[0])
    b = first // block
    blocks = -(-numel // block)
    if short and bool(bad[(blocks - 1) * block:].all()) and not bool(bad[:(blocks - 1) * block].any()):
        raise Fail(f"{what}: only the last, short block ({short} of {block} elements) is off, by up to "
                   f"{float(error[bad].max()):.3g} — it is a block of its own, with its own absmax and scale",
                   f"≤ {float(allowed[first]):.3g}", f"{float(error[first]):.3g}", rank)
    flipped = bad & (x != 0) & ((got + x).abs() <= 1e-3 * x.abs())
    if bool(flipped.any()):
        i = int(flipped.nonzero()[0])
        raise Fail(f"{what}: element {i} ({float(x[i]):.4g}, its block's largest) came back as {float(got[i]):.4g}, "
                   f"its sign flipped — a code of 128 wrapped to −128 in int8. The scale is absmax/127 (127 the "
                   f"largest code), and the codes are clamped to [−127, 127] before .to(torch.int8)",
                   f"{float(x[i]):.4g}", f"{float(got[i]):.4g}", rank)
    for alternative, why in ((_tiled, "each code was multiplied by another block's scale: element i belongs to "
                                      "block i // block_size, so each scale repeats block_size times in place — "
                                      "scales.repeat_interleave(block_size), not scales.repeat(block_size)"),
                             (_one_scale, "one scale served the whole tensor (its absmax/127): its small blocks "
                                          "lost their digits — each block has its own absmax and scale")):
        if torch.allclose(got, alternative(x, block), rtol=1e-5, atol=1e-6 * float(x.abs().max())):
            raise Fail(f"{what}: {why}", f"each element within s/2 of its own block", "another scale", rank)
    s = float(block_scales(x, block)[b])
    raise Fail(f"{what}: element {first} (block {b}, scale {s:.3g}) came back as {float(got[first]):.6g} for "
               f"{float(x[first]):.6g}: |Δ| = {float(error[first]):.3g} > s/2 = {s / 2:.3g} "
               f"(theory.zeropp.block_quantization_error_bound); {int(bad.sum())} of {numel} elements are off",
               f"≤ {float(allowed[first]):.3g}", f"{float(error[first]):.3g}", rank)


# --- the judges ------------------------------------------------------------------------------------------------

def _judge_codec(results, ns):
    q, scales = learner_answer(results["quantize"], f"quantize(x, block_size={CODEC_BLOCK})")
    x = codec_tensor()
    blocks = -(-CODEC_NUMEL // CODEC_BLOCK)
    if not torch.is_tensor(q) or q.dtype != torch.int8:
        kind = q.dtype if torch.is_tensor(q) else type(q).__name__
        raise Fail(f"the codes are {kind}: they travel as int8, one byte per element — .to(torch.int8) after the "
                   f"clamp", "torch.int8", str(kind))
    if q.numel() != CODEC_NUMEL:
        short = CODEC_NUMEL % CODEC_BLOCK
        raise Fail(f"{q.numel()} codes for {CODEC_NUMEL} elements: one code per element" +
                   (f" — the last, short block ({CODEC_NUMEL} = {CODEC_NUMEL // CODEC_BLOCK}·{CODEC_BLOCK} + {short}) "
                    f"has no codes: it is a block of its own, with its own scale" if q.numel() == CODEC_NUMEL - short
                    else ", the padding of the short last block cut off"), CODEC_NUMEL, q.numel())
    if not torch.is_tensor(scales) or scales.numel() != blocks:
        count = scales.numel() if torch.is_tensor(scales) else type(scales).__name__
        dropped = count == CODEC_NUMEL // CODEC_BLOCK
        raise Fail(f"{count} scales for {CODEC_NUMEL} elements in blocks of {CODEC_BLOCK}" +
                   (f": the last, short block ({CODEC_NUMEL % CODEC_BLOCK} elements) has no scale — ⌈{CODEC_NUMEL}/"
                    f"{CODEC_BLOCK}⌉ = {blocks} blocks" if dropped else f"; ⌈numel/block_size⌉ = {blocks}"),
                   blocks, count)
    if scales.dtype != torch.float32:
        raise Fail(f"the scales are {scales.dtype}: float32, 4 bytes per block (what theory.zeropp.quantized_bytes "
                   f"counts)", "torch.float32", str(scales.dtype))
    want = block_scales(x, CODEC_BLOCK)
    zero = CODEC_MAGNITUDES.index(0.0)
    if not math.isfinite(float(scales[zero])) or float(scales[zero]) == 0:
        raise Fail(f"the all-zero block {zero} has scale {float(scales[zero])}: absmax 0 gives 0/0 = NaN codes — "
                   f"give it scale 1 (theory.zeropp.block_quantization_scale(0) = 1)", 1.0, float(scales[zero]))
    if not torch.allclose(scales, want, rtol=1e-6, atol=0):
        ratio = (scales / want)[[i for i in range(blocks) if i != zero]]
        if torch.allclose(ratio, torch.full_like(ratio, 127 / 128), rtol=1e-5):
            raise Fail("each scale is absmax/128: the grid is symmetric, −127 … 127, so the scale is absmax/127 "
                       "(theory.zeropp.quantization_levels(8) = 127) — with /128 the largest element's code is 128, "
                       "which int8 does not hold", f"absmax/{QMAX}", "absmax/128")
        if torch.allclose(scales, torch.full_like(scales, float(x.abs().max()) / QMAX), rtol=1e-6):
            raise Fail("every block has the same scale, the whole tensor's absmax/127: each block has its own absmax "
                       "and scale (blocks 10⁵ apart in magnitude here)", "one scale per block", "one scale")
        b = int(((scales - want).abs() > 1e-6 * want).nonzero()[0])
        raise Fail(f"block {b}'s scale is {float(scales[b]):.6g}; its absmax/127 is {float(want[b]):.6g} "
                   f"(theory.zeropp.block_quantization_scale)", float(want[b]), float(scales[b]))
    if int(q.min()) < -QMAX:
        raise Fail(f"a code is {int(q.min())}: the grid is symmetric, −127 … 127 (clamp to ±127), so 0 is exact and "
                   f"+x and −x are coded alike", f"≥ −{QMAX}", int(q.min()))
    return (f"int8 codes in [−127, 127], one float32 scale per block ({blocks} for {CODEC_NUMEL} elements in blocks of "
            f"{CODEC_BLOCK}, the last of {CODEC_NUMEL % CODEC_BLOCK}), each its block's absmax/127, 1 for the all-zero "
            f"block")


def _judge_round_trip(results, ns):
    x = codec_tensor()
    learner_answer(results["quantize"], f"quantize(x, block_size={CODEC_BLOCK})")
    deq = learner_answer(results["dequantize"], f"dequantize(q, scales, block_size={CODEC_BLOCK}, "
                                                f"numel={CODEC_NUMEL})")
    _diagnose(x, deq, CODEC_BLOCK, "dequantize(quantize(x))")
    worst = float(((deq - x).abs() / bound(x, CODEC_BLOCK).clamp_min(1e-30)).max())
    return (f"every element within half its own block's scale (worst at {worst:.0%} of the bound), the short last "
            f"block included, the all-zero block exactly 0")


def _judge_gather(results, ns):
    lines = []
    for phase, n, numel, block in GATHERS:
        every = torch.cat([shard(phase, j) for j in range(n)])
        for rank in range(n):
            got = results[rank][phase]
            what = f"rank {rank}'s quantized_all_gather on {n} ranks ({numel} elements per shard, blocks of {block})"
            for j in range(n):
                chunk = got.reshape(-1)[j * numel:(j + 1) * numel] if torch.is_tensor(got) and \
                    got.numel() == n * numel else got
                try:
                    _diagnose(shard(phase, j), chunk, block, f"{what}, rank {j}'s chunk", rank)
                except Fail as f:
                    if torch.is_tensor(got) and got.numel() == n * numel and numel % block:
                        if torch.allclose(got.reshape(-1).float(), _as_one_buffer(phase, n, block), rtol=1e-5,
                                          atol=1e-6 * float(every.abs().max())):
                            raise Fail(f"{what}: the gathered buffer was cut into blocks as one tensor — but each "
                                       f"rank quantized its own shard, {numel} elements = {numel // block}·{block} + "
                                       f"{numel % block}, with its own short last block: dequantize chunk j of the "
                                       f"codes with chunk j of the scales", "each shard's own blocks",
                                       "the buffer's blocks", rank) from f
                    raise
        lines.append(f"{n} ranks, {numel} elements per shard in blocks of {block}")
    return "every rank returned every shard within the bound of the block it came from (" + "; ".join(lines) + ")"


def _judge_bytes(results, ns):
    lines = []
    for phase, n, numel, block in GATHERS:
        want = n * zeropp.quantized_bytes(numel, block, 8)
        codes, scales = n * numel, n * 4 * -(-numel // block)
        for rank in range(n):
            gathers = [c for c in results[rank]["calls"] if c["phase"] == phase and c["op"] == "all_gather"]
            if not gathers:
                raise Fail(f"rank {rank} made no all-gather on {n} ranks: send the codes and the scales with "
                           f"zerokit.comm.all_gather (the ledger records its bytes)", "2 all-gathers", "none", rank)
            payload = sum(c["nbytes"] for c in gathers)
            if payload == want:
                continue
            shown = ", ".join(f"{c['nbytes']:,} B of {math.prod(c['shape']) if c['shape'] else '?'} elements"
                              for c in gathers)
            fourfold = any(c["nbytes"] == 4 * codes and math.prod(c["shape"] or (0,)) == codes for c in gathers)
            if fourfold and payload == 4 * codes:
                why = (f" — the shards went as float32, unquantized: qwZ sends int8 codes and one float32 scale per "
                       f"block, {want:,} B")
            elif fourfold:
                why = (f" — the codes travelled as 4-byte floats ({4 * codes:,} B for {codes} codes): the values "
                       f"come back the same, but the all-gather's bytes are what the ledger counts; gather the codes "
                       f"as int8, one byte each")
            elif payload == codes:
                why = " — the codes alone: the scales must travel too, 4 bytes per block of every shard"
            else:
                why = f" — int8 codes ({codes:,} B) and float32 scales ({scales:,} B)"
            raise Fail(f"rank {rank}'s all-gathers on {n} ranks carried {payload:,} B ({shown}); n × "
                       f"theory.zeropp.quantized_bytes({numel}, {block}) = {want:,} B{why}", want, payload, rank)
        ring = theory.ring_bytes_sent("all_gather", want, n)
        lines.append(f"{n} ranks: {codes:,} B of codes + {scales:,} B of scales = {want:,} B, {ring:,.0f} B leaving "
                     f"each rank")
    return "the all-gathers carry int8 codes and float32 scales, to the byte: " + "; ".join(lines)


EXERCISE = Exercise(
    key="17_quantized_allgather",
    title="A block-quantized all-gather (ZeRO++'s qwZ)",
    minutes=30,
    needs=("quantize", "dequantize", "quantized_all_gather"),
    scenarios={"codec": Scenario("codec", 0, _codec), "gather": Scenario("gather", N, _run)},
    checks=[
        Check("codec", 2, "codec", _judge_codec,
              "symmetric block quantization: one scale per block, absmax/127, 1 for an all-zero block; int8 codes "
              "clamped to [−127, 127]"),
        Check("round-trip", 3, "codec", _judge_round_trip,
              "every element comes back within half its own block's scale: code × that block's scale, the short "
              "last block a block of its own"),
        Check("all-gather", 3, "gather", _judge_gather,
              "each rank quantizes its own shard (its own blocks); the codes and the scales are gathered, and chunk "
              "j is dequantized with rank j's scales"),
        Check("bytes", 2, "gather", _judge_bytes,
              "qwZ's saving is in the bytes: int8 codes plus 4 bytes per block, theory.zeropp.quantized_bytes, "
              "instead of 2 or 4 bytes per element"),
    ],
    hints=[
        "ZeRO++'s qwZ cuts the bytes of a weight all-gather by sending int8 codes instead of floats: each block of "
        "consecutive elements gets its own scale, its absmax over 127, so that a block of small numbers keeps its "
        "precision beside a block of large ones. The scales travel with the codes.",
        "quantize: pad the flat tensor with zeros to whole blocks (the short last block keeps its own absmax), one "
        "scale per block — 1 for an all-zero block — then each code is the element over its block's scale, rounded and "
        "clamped to ±127 before the cast to int8 (int8 wraps 128 to −128), the padding cut off.",
        "dequantize: element i belongs to block i // block_size: each code times its own block's scale — each scale "
        "repeated block_size times in place, not the list of scales tiled — cut to numel.",
        "quantized_all_gather: quantize this rank's shard; all-gather the codes (int8) and the scales (float32) into "
        "buffers n times as long, through zerokit.comm.all_gather; then dequantize chunk j of the codes with chunk j "
        "of the scales, and concatenate.",
        "The code:\n"
        "quantize:\n"
        "    flat = x.detach().reshape(-1).float()\n"
        "    blocks = torch.cat([flat, flat.new_zeros((-flat.numel()) % block_size)]).view(-1, block_size)\n"
        "    absmax = blocks.abs().amax(dim=1)\n"
        "    scales = torch.where(absmax > 0, absmax / QMAX, torch.ones_like(absmax))\n"
        "    codes = torch.round(blocks / scales[:, None]).clamp(-QMAX, QMAX)\n"
        "    return codes.reshape(-1)[:flat.numel()].to(torch.int8), scales\n"
        "dequantize:\n"
        "    return q.reshape(-1)[:numel].float() * scales.repeat_interleave(block_size)[:numel]\n"
        "quantized_all_gather:\n"
        "    n = dist.get_world_size(group)\n"
        "    q, scales = quantize(shard, block_size)\n"
        "    every_q = torch.empty(n * q.numel(), dtype=torch.int8)\n"
        "    every_scale = torch.empty(n * scales.numel(), dtype=torch.float32)\n"
        "    zerokit.comm.all_gather(every_q, q, group=group)\n"
        "    zerokit.comm.all_gather(every_scale, scales, group=group)\n"
        "    return torch.cat([dequantize(q_j, s_j, block_size, shard.numel())\n"
        "                      for q_j, s_j in zip(every_q.chunk(n), every_scale.chunk(n))])",
    ],
)
