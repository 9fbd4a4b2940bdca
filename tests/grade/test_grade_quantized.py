"""Exercise 17 (a block-quantized all-gather): the solution and zerokit's own codec pass every check, and each
planted wrong answer fails the check that names it, in a learner's words.

One launch of 3 ranks: the solution and its wrong variants are loaded as submissions, and the ranks run the
exercise's scenario on each in turn (the grader's seed for each, as ``zerokit.grade.core`` does); each check then
judges each submission's measurements. Every wrong answer here gives wrong numbers or wrong bytes, never an error or
a hang, so the variants share the ranks. (``tests/grade/test_grade.py`` grades the solution and the untouched
exercise through ``zerokit.grade``.)
"""
from __future__ import annotations

from planted import assert_each_named, assert_passes, grade_on_shared_ranks, load_variants, planted, solution

KEY = "17_quantized_allgather"

SCALES = "    scales = torch.where(absmax > 0, absmax / QMAX, torch.ones_like(absmax))\n"
CODES = "    codes = torch.round(blocks / scales[:, None]).clamp(-QMAX, QMAX)\n"
DEQUANTIZE = "    return q.reshape(-1)[:numel].to(torch.float32) * scales.repeat_interleave(block_size)[:numel]\n"
GATHER_RETURN = '''    return torch.cat([dequantize(q_j, s_j, block_size, numel)
                      for q_j, s_j in zip(every_q.chunk(n), every_scale.chunk(n))])
'''
PADDED = "    blocks = torch.cat([flat, flat.new_zeros((-numel) % block_size)]).view(-1, block_size)\n"

#: wrong answer -> ([(old, new) edits of the solution], the check that must fail, words its message holds)
WRONG = {
    "scale from another block (repeat, not repeat_interleave)": (
        [(DEQUANTIZE, DEQUANTIZE.replace("repeat_interleave", "repeat"))],
        "round-trip", "another block's scale"),
    "absmax/128 and no clamp": (
        [(SCALES, SCALES.replace("absmax / QMAX", "absmax / 128")),
         (CODES, "    codes = torch.round(blocks / scales[:, None])\n")],
        "round-trip", "sign flipped"),
    "the short last block dropped": (
        [(PADDED, "    blocks = flat[:numel - numel % block_size].view(-1, block_size)\n"),
         ("    return codes.reshape(-1)[:numel].to(torch.int8), scales\n",
          "    return codes.reshape(-1).to(torch.int8), scales\n")],
        "codec", "the last, short block"),
    "an all-zero block divided by zero": (
        [(SCALES, "    scales = absmax / QMAX\n")],
        "codec", "the all-zero block 2 has scale 0"),
    "one scale for the whole tensor": (
        [("    absmax = blocks.abs().amax(dim=1)\n",
          "    absmax = blocks.abs().max().expand(blocks.shape[0])\n")],
        "codec", "same scale"),
    "the gathered buffer dequantized as one tensor": (
        [(GATHER_RETURN, "    return dequantize(every_q, every_scale, block_size, n * numel)\n")],
        "all-gather", "cut into blocks as one tensor"),
    "the codes gathered as float32": (
        [("    every_q = torch.empty(n * q.numel(), dtype=torch.int8)\n",
          "    every_q = torch.empty(n * q.numel(), dtype=torch.float32)\n"
          "    q = q.to(torch.float32)\n")],
        "bytes", "4-byte floats"),
    "the shards gathered unquantized": (
        [(GATHER_RETURN, "    everything = torch.empty(n * numel)\n"
                         "    zerokit.comm.all_gather(everything, shard.float(), group=group)\n"
                         "    return everything\n"),
         ("    zerokit.comm.all_gather(every_q, q, group=group)\n"
          "    zerokit.comm.all_gather(every_scale, scales, group=group)\n", "")],
        "bytes", "unquantized"),
}

#: zerokit's own codec (zerokit.zero.quantize) in place of the learner's: it must pass too
LIBRARY = '''
from zerokit.zero.quantize import dequantize_blocks as _dequantize_blocks, quantize_blocks as _quantize_blocks


def quantize(x, block_size):
    return _quantize_blocks(x, block_size, bits=8)


def dequantize(q, scales, block_size, numel):
    return _dequantize_blocks(q, scales, block_size, numel, bits=8)
'''


def test_solution_and_library_pass_and_each_wrong_answer_is_named(tmp_path):
    source = solution(KEY)
    variants = {"solution": source, "library": source + LIBRARY,
                **{what: planted(source, edits, what) for what, (edits, _, _) in WRONG.items()}}
    graded = grade_on_shared_ranks(KEY, load_variants(tmp_path, KEY, variants))
    for right in ("solution", "library"):
        assert_passes(graded, right)
    assert_each_named(graded, WRONG)
    # the traffic mistakes give the right values: only the bytes tell them
    for what in ("the codes gathered as float32", "the shards gathered unquantized"):
        assert [c for c, r in graded[what].items() if not r.passed] == ["bytes"], what
