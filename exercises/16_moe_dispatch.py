# %% [markdown]
# # Exercise 16 · MoE dispatch and combine over expert-parallel ranks
#
# **Goal.** A mixture-of-experts layer sends each token to its k best experts (the router's
# top-k) and sums their outputs weighted by the gates. Under **expert parallelism** the E
# experts are spread over the n ranks of an `ep` group — rank r holds experts
# r·E/n … (r+1)·E/n − 1 — and each rank routes its *own* tokens. So the tokens must travel:
# **dispatch** sorts the (token, expert) slots by the rank that owns the expert, tells every
# peer how many rows are coming (the counts, exchanged first, because the router decides
# them), and sends the rows in one **uneven all-to-all**; each rank runs its experts on what
# arrived; **combine** sends the outputs home by the reverse all-to-all, puts them back in
# token order, weights them by the gates and sums each token's k slots (GShard §2, Switch
# §2.2, DeepSpeed-MoE, Megatron-core's token dispatcher). An all-to-all's gradient is the same
# exchange run backwards, so the tokens get their experts' gradients back and each expert's
# gradient covers every rank's slots routed to it.
#
# **Interface.** `x` is (T, d), `chosen` (T, k) the router's experts per token, `gates` (T, k)
# their probabilities; slot s is token s // k's choice s % k (`chosen.reshape(-1)`).
# - `AllToAll.apply(rows, send_counts, recv_counts, group)`: rows grouped by destination
#   (`send_counts[j]` for rank j) in, the rows this rank receives (grouped by source) out;
#   its backward is the reverse exchange;
# - `exchange_counts(send_counts, group=None)`: how many rows each peer will send this rank;
# - `dispatch(x, chosen, n_experts, group=None)` → `(rows, ids, plan)`: the rows of every slot
#   routed to this rank's experts, from every rank, their expert ids, and whatever `combine`
#   needs (the sort, the counts);
# - `combine(out, plan, gates, group=None)` → (T, d): `out` holds the experts' outputs for
#   `rows`, in the same order.
# `owner(expert, n_experts, n)` is given. The grader runs the experts between your two
# functions.
#
# **What the grader checks** (2 ranks, E = 4 experts, 2 per rank, top-2, d = 8, T = 6 tokens per
# rank, each rank its own; `zerokit.grade.checks("16")`):
# - `dispatch` — each rank received exactly the slots routed to its experts from both ranks:
#   the rows and their expert ids;
# - `same-outputs` — every rank's output equals the whole layer's run in one process on both
#   ranks' tokens;
# - `same-gradients` — the gradients of the tokens, of every expert (on its rank) and of the
#   router (summed over the ranks) equal the whole layer's;
# - `bytes` — the dispatch all-to-all carries T·k·d·b bytes
#   (`theory.moe_dispatch_payload`), and the rows that leave each rank over forward and
#   backward are `theory.moe_alltoall_bytes`' terms in d on the split the router chose (rows
#   sent away and received).
#
# **Time.** About 45 minutes.
#
# **How to work.** Replace each `raise NotImplementedError(...)`, run the demo, grade with the
# last cell; `hint(EXERCISE)` unfolds one hint at a time. Cells under
# `if __name__ == "__main__":` do not run when the grader loads your notebook.
# `zerokit/expert_parallel/moe.py` and `alltoall.py` hold the library's version, to compare with
# afterwards.

# %%
import torch
import torch.distributed as dist
import torch.nn.functional as F

import zerokit
from zerokit.grade import hint

EXERCISE = "16_moe_dispatch"


def owner(expert, n_experts, n):
    """The ep rank that holds ``expert``: E/n consecutive experts per rank."""
    return expert // (n_experts // n)

# %%
class AllToAll(torch.autograd.Function):
    """Rows to every peer (send_counts[j] to rank j), rows from every peer; backward: the reverse exchange."""

    @staticmethod
    def forward(ctx, rows, send_counts, recv_counts, group):
        raise NotImplementedError('remember the counts and the group; an output of sum(recv_counts) rows; zerokit.comm.all_to_all_single with both split sizes')

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError('the same exchange the other way (the counts swapped); return (gradient of rows, None, None, None)')


def exchange_counts(send_counts, group=None):
    """How many rows each peer sends this rank, given how many this rank sends each peer."""
    raise NotImplementedError('an all-to-all of one int64 per peer')


def dispatch(x, chosen, n_experts, group=None):
    """(rows for this rank's experts from every rank, their expert ids, the plan combine needs)."""
    raise NotImplementedError("slots sorted by owner rank (stable), counts per rank exchanged, the slot rows and their ids all-to-all'd")


def combine(out, plan, gates, group=None):
    """Each token's output: the experts' outputs home, in token order, weighted by the gates, summed over k."""
    raise NotImplementedError("the reverse all-to-all, undo the sort, weight by the gates, sum each token's k slots")

# %% [markdown]
# Try it: four experts on 2 ranks, two each, against the whole layer in one process.

# %%
if __name__ == "__main__":
    def layer(x, router, experts, group=None):
        """Route, dispatch, run this rank's experts, combine."""
        gates, chosen = torch.softmax(x @ router.t(), dim=-1).topk(2, dim=-1)
        rows, ids, plan = dispatch(x, chosen, 4, group)
        out = torch.zeros_like(rows)
        for e, expert in experts.items():
            where = (ids == e).nonzero().flatten()
            out = out.index_copy(0, where, expert(rows[where]))
        return combine(out, plan, gates, group)

    def demo(ctx):
        torch.manual_seed(0)
        router, experts = torch.randn(4, 8), {e: torch.nn.Linear(8, 8) for e in range(4)}
        x = torch.randn(2, 5, 8)[ctx.rank]                       # each rank its own 5 tokens
        gates, chosen = torch.softmax(x @ router.t(), dim=-1).topk(2, dim=-1)
        whole = sum(gates[:, j, None] * torch.stack([experts[int(e)](x[t]) for t, e in enumerate(chosen[:, j])])
                    for j in range(2))
        mine = {e: m for e, m in experts.items() if owner(torch.tensor(e), 4, ctx.world_size) == ctx.rank}
        return float((layer(x, router, mine) - whole).abs().max().detach())

    print("max |expert-parallel − whole layer| per rank:", zerokit.launch(demo, 2))

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
if __name__ == "__main__":  # check `dispatch`, 3 points
    report = zerokit.grade(globals(), EXERCISE, checks=["dispatch"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `same-outputs`, 3 points
    report = zerokit.grade(globals(), EXERCISE, checks=["same-outputs"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `same-gradients`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["same-gradients"])
    assert report.passed, report

# %%
if __name__ == "__main__":  # check `bytes`, 2 points
    report = zerokit.grade(globals(), EXERCISE, checks=["bytes"])
    assert report.passed, report
