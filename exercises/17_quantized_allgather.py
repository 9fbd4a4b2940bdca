# %% [markdown]
# # Exercise 17 · A block-quantized all-gather (ZeRO++'s qwZ)
#
# **Goal.** ZeRO-3 all-gathers every parameter shard before the forward: 2 bytes per
# element in bf16. ZeRO++'s **qwZ** (Wang et al. 2023, arXiv 2306.10209 §3.1) sends int8
# instead: each rank cuts its shard into **blocks** of `block_size` consecutive elements and
# sends, per block, one **scale** `s = absmax / 127` (the block's largest magnitude over the
# largest int8 code used) and one code per element, `q = clamp(round(x / s), −127, 127)`;
# the receiver computes `q · s`. Every element comes back within half a step of the grid,
# `|x − q·s| ≤ s/2` (`theory.zeropp.block_quantization_error_bound`). Three details make or break
# it: each block has *its own* scale; the last block of a shard whose size is not a multiple
# of `block_size` is **short** and still gets one; an **all-zero block** has absmax 0 and
# gets scale 1 (its codes are 0, it comes back exactly — no division by zero). The bytes on
# the wire are the codes plus the scales: `numel + 4·⌈numel/block_size⌉` per shard in int8
# (`theory.zeropp.quantized_bytes`), about half of bf16's `2·numel` for large blocks.
#
# **Interface.** All tensors flat, float32 scales, `QMAX = 127`:
# - `quantize(x, block_size)` → `(q, scales)`: `q` int8 with `x.numel()` codes, `scales`
#   float32 with ⌈numel/block_size⌉ entries;
# - `dequantize(q, scales, block_size, numel)` → the `numel` float32 values `(q, scales)`
#   encode (each code times its own block's scale);
# - `quantized_all_gather(shard, block_size, group=None)` → float32 of n·`shard.numel()`
#   elements: every rank's shard, in rank order, as its codes and scales say. Each rank
#   quantizes its own shard and sends the codes and the scales by `zerokit.comm.all_gather`
#   (zerokit's ledgered all-gather: the bytes are recorded); each chunk is dequantized with
#   the scales of the rank that sent it.
#
# **What the grader checks** (3 ranks; `zerokit.grade.checks("17")`):
# - `codec` — `quantize` on a tensor of 53 elements in blocks of 8 (a short last block of 5,
#   an all-zero block, blocks whose magnitudes differ by 10⁵): int8 codes in [−127, 127], one
#   float32 scale per block, each equal to its block's absmax/127
#   (`theory.zeropp.block_quantization_scale`), 1 for the all-zero block;
# - `round-trip` — `dequantize(quantize(x))` returns every element within its own block's
#   s/2 (`theory.zeropp.block_quantization_error_bound`), the short last block included, the zero
#   block exactly 0;
# - `all-gather` — on the 3 ranks (37 elements per shard, blocks of 8) and on a group of 2
#   of them (20 elements, blocks of 6), every rank returns every shard within the bound of
#   the block it came from;
# - `bytes` — the all-gathers carry int8 codes and float32 scales: to the byte n times
#   `theory.zeropp.quantized_bytes(shard numel, block_size)` in all, (n−1)/n of it leaving each rank.
#
# **Time.** About 30 minutes.
#
# **How to work.** Replace each `raise NotImplementedError(...)`, run the demo, grade with the
# last cell; `hint(EXERCISE)` unfolds one hint at a time. Cells under
# `if __name__ == "__main__":` do not run when the grader loads your notebook.
# `zerokit/zero/quantize.py` holds the library's version (int4 too), to compare with
# afterwards.

# %%
import torch
import torch.distributed as dist

import zerokit
from zerokit.grade import hint

EXERCISE = "17_quantized_allgather"
QMAX = 127  # the largest int8 code used: the grid −127 … 127 is symmetric around 0

# %%
def quantize(x, block_size):
    """(int8 codes, float32 scales) of a flat tensor in blocks of ``block_size``; the last block may be short."""
    raise NotImplementedError('blocks of block_size (pad the short last one with zeros: it keeps its absmax), scale = absmax/QMAX per block (1 where absmax is 0), codes = clamp(round(x/scale), −QMAX, QMAX) as int8, the padding cut off')


def dequantize(q, scales, block_size, numel):
    """The ``numel`` float32 values that (q, scales) encode: each code times its own block's scale."""
    raise NotImplementedError("element i belongs to block i // block_size: each code times its own block's scale, cut to numel")


def quantized_all_gather(shard, block_size, group=None):
    """Every rank's shard, in rank order, sent as int8 codes and float32 scales; each chunk dequantized with its own."""
    raise NotImplementedError("quantize this shard; zerokit.comm.all_gather the codes (int8) and the scales (float32) into buffers n times as long; dequantize chunk j with rank j's scales")

# %% [markdown]
# Try it: one shard of 10 elements in blocks of 4 (a short last block of 2), then a gather on 2 ranks.

# %%
if __name__ == "__main__":
    x = torch.tensor([0.5, -1.0, 0.25, 0.1, 0.0, 0.0, 0.0, 0.0, 300.0, -2.0])
    q, scales = quantize(x, 4)
    print("codes:", q.tolist(), "\nscales:", scales.tolist())
    print("max |x − dequantize(quantize(x))|:", float((x - dequantize(q, scales, 4, x.numel())).abs().max()))

    def demo(ctx):
        shard = torch.randn(10, generator=torch.Generator().manual_seed(ctx.rank)) * 10 ** ctx.rank
        full = quantized_all_gather(shard, 4)
        every = torch.cat([torch.randn(10, generator=torch.Generator().manual_seed(r)) * 10 ** r
                           for r in range(ctx.world_size)])
        return float((full - every).abs().max())

    print("max |gathered − every shard| per rank:", zerokit.launch(demo, 2))

# %%
if __name__ == "__main__":
    hint(EXERCISE)

# %%
if __name__ == "__main__":
    report = zerokit.grade(globals(), EXERCISE)
    print(report)

# %% [markdown]
# **Autograded cells** (nbgrader's): one per check, worth that check's points. A teacher who grades with
# nbgrader runs them (`nbgrader autograde`); each asks `zerokit.grade` what the cell above reports, one
# check at a time. Leave them as they are.

# %%
if __name__ == "__main__":  # check `codec`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["codec"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `round-trip`, 3 points
    report = zerokit.grade(globals(), EXERCISE, checks=["round-trip"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `all-gather`, 3 points
    report = zerokit.grade(globals(), EXERCISE, checks=["all-gather"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `bytes`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["bytes"])
    assert report.passed, report
