"""``zerokit.fully_shard`` driven exactly as an FSDP2 test suite drives torch's ``fully_shard``.

The shape such suites use: a ``Sequential`` whose children hold every parameter (nothing at the root),
``for b in model.children(): fully_shard(b)`` (activations included) then ``fully_shard(model)``,
``model.parameters()`` into ``torch.optim.SGD``; after each backward the gradients are compared on every
rank with a non-parallel copy's, and after each step the full parameters, gathered on every rank, with that
copy's. Side by side, torch's own ``fully_shard`` runs the same loop on the same data.

The bounds, from the arithmetic:

* **zerokit against FSDP2, fp32, 2 ranks: bit for bit.** Both gather the same fp32 values exactly and run the
  same local forward and backward, so each rank's local gradient g_r is the same on both. The reduction is
  the only arithmetic that differs in form: zerokit sums g_0/2 + g_1/2, FSDP2 averages (g_0 + g_1)/2. A sum
  of two fp32 terms is one correctly rounded addition, the same in either order, and dividing by 2 is exact
  (a power of two), so both give fl(g_0 + g_1)/2; SGD's update is elementwise on the same values. zerokit
  therefore differs from one process by exactly what FSDP2 does (~1e-8 here: the one process sums the batch
  rows in one GEMM, each rank sums its half and the halves are then added — another order of one sum).
* **16-bit compute (``mp_policy``), 2 ranks: bit for bit too**, for the same reason: both cast the same fp32
  shard to ``param_dtype``, reduce in ``param_dtype`` (fp16: FSDP2 pre-divides by 2, as zerokit always does;
  bf16: FSDP2 averages — a sum of two then a halving, exact again) and add the fp32 cast of the result to the
  fp32 shards the optimizer steps. Against one process in fp32, 16-bit compute is ~eps16 off per step.
* **3 ranks: a few fp32 units of the gradient.** Dividing by 3 is not exact and three terms are summed in the
  collective's order: zerokit rounds g_r/3 three times and adds twice, FSDP2 adds twice and divides once;
  each side is within 3u·Σ|g_r|/3 of the exact mean (u = 2⁻²⁴), so the two differ by at most 3·eps32·Σ|g_r|/3
  per element at the first backward, where both start from the same weights.

One launch per world size carries every check (a launch costs more than the checks).
"""
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import zerokit

IN, HID, OUT, B, STEPS, LR = 7, 11, 5, 12, 3, 0.1
EPS32 = torch.finfo(torch.float32).eps


def make():
    """Children-only parameters, odd sizes (each flat unit padded), activations as children too."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(IN, HID), nn.Tanh(), nn.Linear(HID, HID), nn.Tanh(), nn.Linear(HID, OUT))


def data(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(B, IN, generator=g), torch.randn(B, OUT, generator=g)


def full_grads(model, kind):
    """Every parameter's gradient, whole, on every rank: zerokit's 1-D shards concatenated rank by rank (each
    parameter's slices are contiguous and in rank order), FSDP2's DTensors' ``full_tensor()``."""
    if kind == "torch":
        return {n: p.grad.full_tensor() for n, p in model.named_parameters()}
    mine = {n: p.grad.clone() if p.grad is not None else torch.zeros(0) for n, p in model.named_parameters()}
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    shapes = {n: p.shape for n, p in make().named_parameters()}
    return {n: torch.cat([r[n] for r in every]).view(shapes[n]) for n in mine}


def full_params(model, kind):
    """The full parameters on every rank: zerokit's ``full_state_dict()`` (every rank by default), FSDP2's
    through torch's ``get_model_state_dict(full_state_dict=True)``."""
    if kind == "torch":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return model.full_state_dict()


def train(ctx, kind, dtype=None):
    """The FSDP2 test loop, zerokit's or torch's ``fully_shard``; per step: the full gradients after backward,
    the full parameters after the step, and the non-parallel copy's (fp32)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from torch.distributed.fsdp import fully_shard as torch_fully_shard

    shard = zerokit.fully_shard if kind == "zerokit" else torch_fully_shard
    policy = MixedPrecisionPolicy(param_dtype=dtype)
    reference, model = make(), make()
    if kind == "zerokit" and ctx.rank:  # ranks start different: zerokit broadcasts rank 0's values
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    for block in model.children():  # Tanh too, as FSDP2 allows
        shard(block, mp_policy=policy)
    shard(model, mp_policy=policy)  # the root: no parameter of its own
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=LR, momentum=0.9)
    per = B // ctx.world_size
    mine = slice(ctx.rank * per, (ctx.rank + 1) * per)
    steps = []
    for step in range(STEPS):
        x, y = data(step)
        F.mse_loss(model(x[mine]).float(), y[mine]).backward()
        F.mse_loss(reference(x), y).backward()
        record = {"grads": full_grads(model, kind), "ref grads": {n: p.grad.clone() for n, p in
                                                                  reference.named_parameters()}}
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
        record["params"] = full_params(model, kind)
        record["ref params"] = {n: p.detach().clone() for n, p in reference.named_parameters()}
        steps.append(record)
    return steps


def local_scale(ctx):
    """Σ|g_r|/N per element at the first backward: each rank's own gradient (a non-parallel copy on its rows),
    the scale of the 3-rank bound."""
    one = make()
    per = B // ctx.world_size
    x, y = data(0)
    F.mse_loss(one(x[ctx.rank * per:(ctx.rank + 1) * per]), y[ctx.rank * per:(ctx.rank + 1) * per]).backward()
    total = {n: p.grad.abs() for n, p in one.named_parameters()}
    for t in total.values():
        dist.all_reduce(t)
    return {n: t / ctx.world_size for n, t in total.items()}


def biggest(a, b):
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in b)


def compare(ours, theirs):
    """Per step, max |difference| of the gradients and of the parameters: zerokit to FSDP2, each to one process."""
    out = {"grads vs fsdp2": [], "params vs fsdp2": [], "grads vs one": [], "params vs one": [],
           "fsdp2 grads vs one": [], "fsdp2 params vs one": []}
    for a, b in zip(ours, theirs):
        out["grads vs fsdp2"].append(biggest(a["grads"], b["grads"]))
        out["params vs fsdp2"].append(biggest(a["params"], b["params"]))
        out["grads vs one"].append(biggest(a["grads"], a["ref grads"]))
        out["params vs one"].append(biggest(a["params"], a["ref params"]))
        out["fsdp2 grads vs one"].append(biggest(b["grads"], b["ref grads"]))
        out["fsdp2 params vs one"].append(biggest(b["params"], b["ref params"]))
    start = make().state_dict()
    out["largest update"] = max(float((ours[-1]["ref params"][k] - start[k]).abs().max()) for k in start)
    out["largest grad"] = max(float(t.abs().max()) for s in ours for t in s["ref grads"].values())
    out["largest weight"] = max(float(t.abs().max()) for s in ours for t in s["ref params"].values())
    return out


def _runs(ctx, dtypes):
    return {str(d): compare(train(ctx, "zerokit", d), train(ctx, "torch", d)) for d in dtypes}


def _state_dicts(ctx):
    """zerokit's state-dict entry points next to torch's on FSDP2, same options, same model."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import fully_shard as torch_fully_shard

    ours, theirs = make(), make()
    for model, shard in ((ours, zerokit.fully_shard), (theirs, torch_fully_shard)):
        for block in model.children():
            shard(block)
        shard(model)
    out = {}
    for name, options in (("default", None), ("full", StateDictOptions(full_state_dict=True)),
                          ("cpu", StateDictOptions(full_state_dict=True, cpu_offload=True))):
        got = ours.full_state_dict(options)
        want = get_model_state_dict(theirs, options=options or StateDictOptions(full_state_dict=True))
        out[name] = (sorted(got) == sorted(want) and all(torch.equal(got[k], want[k].cpu()) for k in want),
                     len(got), {str(t.device) for t in got.values()})
    refused = {}
    for name, options in (("sharded", StateDictOptions()), ("fqn", StateDictOptions(full_state_dict=True,
                                                                                      dsd_fqn_modifiers="x"))):
        try:
            ours.full_state_dict(options)
        except ValueError as e:
            refused[name] = str(e)
    try:  # torch's own function would read model.state_dict(): flat shards, refused rather than taken as whole
        get_model_state_dict(ours, options=StateDictOptions(full_state_dict=True))
    except RuntimeError as e:
        refused["torch's"] = str(e)
    out["refused"] = refused
    # load: rank 0's dict broadcast (the others pass {}), then each rank's own whole dict
    torch.manual_seed(7)
    other = nn.Sequential(nn.Linear(IN, HID), nn.Tanh(), nn.Linear(HID, HID), nn.Tanh(), nn.Linear(HID, OUT))
    sent = other.state_dict() if ctx.rank == 0 else {}
    keys = ours.load_full_state_dict(sent, StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    back = ours.full_state_dict()
    out["broadcast load"] = (not keys.missing_keys and not keys.unexpected_keys,
                             all(torch.equal(back[k], v) for k, v in other.state_dict().items()))
    ours.load_full_state_dict(make().state_dict())
    x, y = data(0)
    out["own load"] = torch.equal(ours(x), make()(x))
    try:
        ours.load_full_state_dict({"0.weight": torch.zeros(HID, IN)})
    except RuntimeError as e:
        out["strict"] = str(e)
    return out


def _two(ctx):
    return {"runs": _runs(ctx, (None, torch.float16, torch.bfloat16)), "state dicts": _state_dicts(ctx)}


def _three(ctx):
    ours, theirs = train(ctx, "zerokit"), train(ctx, "torch")
    scale = local_scale(ctx)
    first = ours[0]["grads"], theirs[0]["grads"]
    return {"runs": {"None": compare(ours, theirs)},
            "first grads": max(float(((first[0][k] - first[1][k]).abs() / (scale[k] + 1e-30)).max()) for k in scale)}


@pytest.fixture(scope="module")
def on_two_ranks():
    return zerokit.launch(_two, 2)


@pytest.fixture(scope="module")
def on_three_ranks():
    return zerokit.launch(_three, 3)


SIXTEEN = {"torch.float16": torch.float16, "torch.bfloat16": torch.bfloat16}


@pytest.mark.parametrize("dtype", ["None", "torch.float16", "torch.bfloat16"])
def test_two_ranks_match_fsdp2_bit_for_bit_and_one_process_as_closely_as_fsdp2(dtype, on_two_ranks):
    """fp32, and 16-bit compute through ``mp_policy`` with fp32 shards stepped by torch's SGD: the full gradients
    after every backward and the full parameters after every step, on every rank, equal FSDP2's exactly (the
    module docstring says why); so each is exactly as far from the non-parallel copy as FSDP2's."""
    for rank in on_two_ranks:
        r = rank["runs"][dtype]
        assert r["grads vs fsdp2"] == r["params vs fsdp2"] == [0.0] * STEPS, r
        assert r["grads vs one"] == r["fsdp2 grads vs one"] and r["params vs one"] == r["fsdp2 params vs one"]
        if dtype == "None":  # another order of one fp32 sum over the batch rows: ~1e-8
            assert max(r["grads vs one"] + r["params vs one"]) <= 1e-6, r
        else:  # 16-bit compute against the fp32 copy: within two 16-bit units of the largest gradient, and of the
            # largest distance the weights moved
            eps16 = torch.finfo(SIXTEEN[dtype]).eps
            assert max(r["grads vs one"]) <= 2 * eps16 * r["largest grad"], r
            assert max(r["params vs one"]) <= 2 * eps16 * r["largest update"], r


def test_three_ranks_are_within_a_few_fp32_units_of_fsdp2(on_three_ranks):
    """An odd world: dividing by 3 rounds, three terms are summed; at the first backward (same weights on both)
    the gradients differ by at most 3·eps32·Σ|g_r|/3 per element; the weights, every step, by a few fp32 units."""
    for rank in on_three_ranks:
        r = rank["runs"]["None"]
        assert rank["first grads"] <= 3 * EPS32, rank["first grads"]
        assert max(r["params vs fsdp2"]) <= 4 * EPS32 * r["largest weight"], r
        assert max(r["grads vs one"] + r["params vs one"]) <= 1e-6, r


def test_full_state_dict_is_torchs_get_model_state_dict_with_the_same_options(on_two_ranks):
    """Every rank the whole dict by default; ``cpu_offload=True``: rank 0 only, on the CPU, ``{}`` elsewhere —
    equal to torch's ``get_model_state_dict`` on FSDP2 with the same options, on every rank."""
    for rank, r in enumerate(on_two_ranks):
        state = r["state dicts"]
        for name in ("default", "full", "cpu"):
            assert state[name][0], (rank, name)
        assert state["default"][1] == state["full"][1] == 6
        assert state["cpu"][1:] == ((6, {"cpu"}) if rank == 0 else (0, set()))


def test_state_dict_options_zerokit_cannot_honour_are_refused_by_name(on_two_ranks):
    refused = on_two_ranks[0]["state dicts"]["refused"]
    assert "full_state_dict=False" in refused["sharded"] and "full_state_dict=True" in refused["sharded"]
    assert "dsd_fqn_modifiers='x'" in refused["fqn"] and "rename the dict's keys yourself" in refused["fqn"]
    assert "model.state_dict() would hold this rank's flat 1-D shards" in refused["torch's"]
    assert "model.full_state_dict(options)" in refused["torch's"]


def test_load_full_state_dict_broadcasts_rank_0s_or_takes_each_ranks_own_strictly(on_two_ranks):
    for r in on_two_ranks:
        state = r["state dicts"]
        assert state["broadcast load"] == (True, True)  # no missing or unexpected keys; read back as sent
        assert state["own load"]  # the loaded model computes what the unwrapped one does
        assert "Missing key(s)" in state["strict"] and '"4.bias"' in state["strict"]  # torch's strict error


# --- the memory ledger, against FSDP2's: fully-shard and fsdp2-zero3 inside zerokit.train ---------------------

def deep_gpt():
    """Four blocks, every dimension even: at 2 ranks neither side pads a unit."""
    return zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=4, n_head=2, batch_size=8)


@pytest.fixture(scope="module")
def peaks():
    from zerokit.job import make_job
    from zerokit.train import run_job

    return {name: run_job(make_job(deep_gpt(), name, 2, 3, "fp32", "sgd", 0.1, 1, {}), 2)
            for name in ("fully-shard", "fsdp2-zero3")}


def test_fully_shard_is_measured_in_backward_next_to_fsdp2(peaks):
    """Both sampled in backward as each gathered parameter gets its gradient (fully_shard's whole parameters and
    FSDP2's unsharded ones are swapped into the modules for the forward), both ledgers reading what each holds.
    The bytes that differ are named: FSDP2 gathers one block ahead in backward (its params peak one block more;
    each fully_shard call is its own zero3 unit, none gathered ahead) and keeps a block's all-gather output in
    forward until the next copy-out (buffers); zero3's reduce-scatter bucket of each unit (allocated whole at the
    unit's first gradient) stays in flight until the end of backward — DeepSpeed's reduce_bucket_size, which
    fully_shard keeps — so its gradient peak is every unit's bucket and the blocks' gradient shards, where FSDP2
    holds one reduce-scatter input at a time. The activations are the same tensors."""
    from zerokit import theory
    from zerokit.zero.units import form_units

    units = [sum(p.numel() for p in spec.params) for spec in form_units(deep_gpt().build_model(), "block", set())]
    block = 4 * max(units[:-1])
    for ours, theirs in zip(peaks["fully-shard"].ranks, peaks["fsdp2-zero3"].ranks):
        assert ours.peak_where.startswith("backward "), ours.peak_where
        assert ours.peak_by_category["params"] == theory.hsdp_peak_param_bytes(units, 2, 4, prefetch_units=0)
        assert theirs.peak_by_category["params"] == ours.peak_by_category["params"] + block
        assert (ours.peak_by_category["buffers"], theirs.peak_by_category["buffers"]) == (0, block)
        assert ours.peak_by_category["grads"] == 4 * sum(units) + 4 * sum(units[:-1]) // 2
        assert ours.peak_by_category["activations"] == theirs.peak_by_category["activations"]
