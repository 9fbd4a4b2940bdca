"""Your own model, your own loop, on torch's and DeepSpeed's contracts: what the tests in this folder share.

One model zerokit never saw (``Odd``: ``nn.MultiheadAttention``, odd sizes, an embedding tied to the head, a frozen
bias, a buffer and a non-persistent one), ranks seeded differently, each rank on its slice of the batch, compared
with a non-parallel copy after every step. One launch per world size carries every check (a launch costs more than
the checks): the launches' bodies are here, their fixtures in ``conftest.py``, the checks in the ``test_*_contract.py``
files, one per API.
"""
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import zerokit

V, D, T, B, STEPS = 13, 6, 5, 6, 3


class Odd(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.attn = nn.MultiheadAttention(D, 2, batch_first=True)
        self.proj = nn.Linear(D, 7)
        self.proj.bias.requires_grad_(False)  # a frozen bias
        self.out = nn.Linear(7, D)
        self.head = nn.Linear(D, V, bias=False)
        self.head.weight = self.emb.weight  # tied
        self.register_buffer("scale", torch.tensor(0.5))
        self.register_buffer("mask", torch.triu(torch.ones(T, T, dtype=torch.bool), 1), persistent=False)

    def forward(self, idx):
        x = self.emb(idx)
        a, _ = self.attn(x, x, x, attn_mask=self.mask, need_weights=False)
        return self.head(self.out(torch.tanh(self.proj(x + a))) * self.scale)


def batch(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randint(0, V, (B, T), generator=g), torch.randint(0, V, (B, T), generator=g)


def loss_of(model, x, y):
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten())


def groups(model, wd=0.1):
    """Two groups, as people write them: decay on matrices, none on biases and norms."""
    trained = [p for p in model.parameters()]
    return [{"params": [p for p in trained if p.dim() > 1]},
            {"params": [p for p in trained if p.dim() <= 1], "weight_decay": 0.0}]


def max_diff(a, b):
    return max(float((p.detach() - q.detach()).abs().max()) for p, q in zip(a.parameters(), b.parameters()))


def engine_against_reference(engine, sched, reference, ref_opt, ref_sched, mine) -> list:
    """STEPS steps of an engine on this rank's rows and of the reference on the whole batch, each with its scheduler;
    the largest parameter difference after each."""
    diffs = []
    for step in range(STEPS):
        x, y = batch(step)
        engine.backward(loss_of(engine, x[mine], y[mine]))
        engine.step()
        sched.step()
        ref_opt.zero_grad()
        loss_of(reference, x, y).backward()
        ref_opt.step()
        ref_sched.step()
        with engine.gathered():
            diffs.append(max_diff(engine.module, reference))
    return diffs


def _contracts(ctx):
    out = {}
    rank, n = ctx.rank, ctx.world_size
    per = B // n
    mine = slice(rank * per, (rank + 1) * per)

    # -- ShardedOptimizer: a frozen parameter, param groups, ranks seeded differently, an LR scheduler ------------
    torch.manual_seed(0)
    reference = Odd()
    torch.manual_seed(rank)  # every rank builds another model: the optimizer broadcasts rank 0's
    model = Odd()
    ref_opt = torch.optim.SGD(groups(reference), lr=0.1, momentum=0.9, weight_decay=0.1)
    opt = zerokit.ShardedOptimizer(groups(model), torch.optim.SGD, lr=0.1, momentum=0.9, weight_decay=0.1)
    out["is an Optimizer"] = isinstance(opt, torch.optim.Optimizer)
    sched, ref_sched = (torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5) for o in (opt, ref_opt))
    diffs = []
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad()
        loss_of(model, x[mine], y[mine]).backward()
        opt.step()
        sched.step()
        ref_opt.zero_grad()
        loss_of(reference, x, y).backward()
        ref_opt.step()
        ref_sched.step()
        diffs.append(max_diff(model, reference))
    out["sharded diffs"] = diffs
    out["lrs"] = [g["lr"] for g in opt.param_groups]
    frozen = model.proj.bias.detach().clone()
    every = [torch.empty_like(frozen) for _ in range(n)]
    dist.all_gather(every, frozen)
    out["frozen equal on every rank"] = all(torch.equal(every[0], t) for t in every)

    # -- its states out and back in, torch's way ---------------------------------------------------------------
    opt.consolidate_state_dict(to=0)
    state = [opt.state_dict() if rank == 0 else None]
    dist.broadcast_object_list(state, src=0)
    torch.manual_seed(0)
    again = Odd()
    opt2 = zerokit.ShardedOptimizer(groups(again), torch.optim.SGD, lr=0.1, momentum=0.9, weight_decay=0.1)
    opt2.load_state_dict(state[0])
    opt2.consolidate_state_dict(to=0)
    if rank == 0:
        back = opt2.state_dict()
        out["state round trip"] = (back["param_groups"] == state[0]["param_groups"] and all(
            torch.equal(back["state"][i]["momentum_buffer"], s["momentum_buffer"])
            for i, s in state[0]["state"].items()))
    try:
        zerokit.checkpoint.save(tempfile.mkdtemp(), opt)
    except TypeError as e:
        out["checkpoint.save(sharded optimizer)"] = str(e)

    # -- initialize: model_parameters with a frozen one, an LR scheduler on engine.optimizer, a strict reload -----
    torch.manual_seed(0)
    reference = Odd()
    torch.manual_seed(rank)
    model = Odd()
    engine, optimizer, _, _ = zerokit.initialize(model=model, model_parameters=model.parameters(), config={
        "train_micro_batch_size_per_gpu": per, "gradient_clipping": 0, "zero_optimization": {"stage": 2},
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})
    sched = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=1, gamma=0.5)
    out["engine diffs"] = engine_against_reference(engine, sched, reference, ref_opt, ref_sched, mine)
    out["engine lr"] = optimizer.param_groups[0]["lr"]
    full = engine.full_state_dict()
    if rank == 0:
        fresh = Odd()
        fresh.load_state_dict(full, strict=True)
        out["strict reload"] = max_diff(fresh, reference)

    # -- double wrapping: refused, with the reason ---------------------------------------------------------------
    refused = {}
    for name, make in {
        "DDP(DDP(m))": lambda: zerokit.DistributedDataParallel(zerokit.DistributedDataParallel(Odd())),
        "DDP(torch DDP(m))": lambda: zerokit.DistributedDataParallel(torch.nn.parallel.DistributedDataParallel(Odd())),
        "initialize(DDP(m))": lambda: zerokit.initialize(model=zerokit.DistributedDataParallel(Odd()),
                                                         config={"zero_optimization": {"stage": 1}}),
    }.items():
        try:
            make()
        except ValueError as e:
            refused[name] = str(e)
    out["refused"] = refused

    # -- measure around torch's own DDP (its buckets, all-reduced in C++) and around ZeRO-3 with offload ---------
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(Odd())
    sgd = torch.optim.SGD(ddp.parameters(), lr=0.1)
    x, y = batch(0)
    with zerokit.measure(ddp, sgd) as m:
        loss_of(ddp, x[mine], y[mine]).backward()
        sgd.step()
    out["measure torch ddp"] = (m.collectives, m.seconds)
    engine, _, _, _ = zerokit.initialize(model=Odd(), config={
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}, "gradient_clipping": 0})
    with zerokit.measure(engine) as m:
        engine.backward(loss_of(engine, x[mine], y[mine]))
        engine.step()
    out["measure offload"] = (m.memory["host_optimizer"], m.table())

    # -- ShardedOptimizer under a DDP wrapper, zerokit's or torch's: the wrapper reduces, the optimizer does not ----
    for name, wrap in (("zerokit", zerokit.DistributedDataParallel), ("torch", torch.nn.parallel.DistributedDataParallel)):
        torch.manual_seed(0)
        reference = Odd()
        ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
        torch.manual_seed(0)
        model = wrap(Odd())
        opt = zerokit.ShardedOptimizer(model.parameters(), torch.optim.SGD, lr=0.1)
        zerokit.comm.ledger().reset()
        diffs = []
        for step in range(STEPS):
            x, y = batch(step)
            opt.zero_grad()
            with zerokit.comm.phase("backward"):
                loss_of(model, x[mine], y[mine]).backward()
            if name == "zerokit":
                model.finish_gradient_synchronization()  # after a synchronised backward: nothing left to reduce
            opt.step()
            ref_opt.zero_grad()
            loss_of(reference, x, y).backward()
            ref_opt.step()
            diffs.append(max_diff(model.module, reference))
        ops = {r.op for r in zerokit.comm.ledger().records if r.phase != "setup"}
        out[f"under {name} DDP"] = (diffs, sorted(ops))
    return out


def _batch_message(ctx):
    try:
        zerokit.initialize(model=Odd(), config={"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4})
    except ValueError as e:
        return str(e)


def _lr_groups(model):
    """Two groups that differ in every value they set: matrices at lr 0.1 with decay, the rest at 0.05 without."""
    trained = [p for p in model.parameters()]
    return [{"params": [p for p in trained if p.dim() > 1], "lr": 0.1, "weight_decay": 0.1},
            {"params": [p for p in trained if p.dim() <= 1], "lr": 0.05, "weight_decay": 0.0}]


def _groups_given_to_initialize(ctx):
    """initialize(optimizer=SGD(groups)) at every stage and model_parameters=groups under the config's optimizer,
    against torch's SGD with the same groups in one process, after every step; a scheduler per group."""
    rank, n = ctx.rank, ctx.world_size
    per = B // n
    mine = slice(rank * per, (rank + 1) * per)
    out = {}
    for stage, how in [(0, "optimizer="), (1, "optimizer="), (2, "optimizer="), (3, "optimizer="),
                       (3, "model_parameters=")]:
        torch.manual_seed(0)
        reference = Odd()
        torch.manual_seed(rank)
        model = Odd()
        config = {"train_micro_batch_size_per_gpu": per, "gradient_clipping": 0, "zero_optimization": {"stage": stage}}
        if how == "optimizer=":
            given = dict(optimizer=torch.optim.SGD(_lr_groups(model), lr=0.3, momentum=0.9))
        else:  # DeepSpeed builds the config's optimizer on the groups: their own values override the block's
            config["optimizer"] = {"type": "SGD", "params": {"lr": 0.3, "momentum": 0.9, "weight_decay": 0.5}}
            given = dict(model_parameters=_lr_groups(model))
        engine, optimizer, _, _ = zerokit.initialize(model=model, config=config, **given)
        ref_opt = torch.optim.SGD(_lr_groups(reference), lr=0.3, momentum=0.9)
        # a per-group schedule: only the second group's lr decays
        sched = torch.optim.lr_scheduler.LambdaLR(optimizer, [lambda s: 1.0, lambda s: 0.5 ** s])
        ref_sched = torch.optim.lr_scheduler.LambdaLR(ref_opt, [lambda s: 1.0, lambda s: 0.5 ** s])
        diffs = engine_against_reference(engine, sched, reference, ref_opt, ref_sched, mine)
        out[f"stage {stage}, {how}"] = {"diffs": diffs, "groups": [
            {k: g[k] for k in ("lr", "weight_decay", "momentum")} for g in optimizer.param_groups]}
    return out


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(D, 2, batch_first=True)
        self.mlp = nn.Linear(D, D)

    def forward(self, x):
        a, _ = self.attn(x, x, x)  # need_weights left at its default, True: torch's explicit path, no SDPA
        return x + self.mlp(torch.tanh(a))


class Blocks(nn.Module):
    """A user's stack of blocks around nn.MultiheadAttention."""

    def __init__(self, n=3):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.blocks = nn.ModuleList(Block() for _ in range(n))
        self.head = nn.Linear(D, V)

    def forward(self, idx):
        x = self.emb(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


# -- zerokit.fully_shard: FSDP2's convention, your own optimizer ----------------------------------------------------
ADAM_STEP = 3.16  # AdamW's largest step per element in units of lr, (1 − β1)/√(1 − β2) (Kingma & Ba §2.1)


def named_groups(model, decay=0.1):
    """Param groups by name, as people write them for AdamW: no decay on biases, norms and embeddings."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [{"params": [p for n, p in named if n.endswith("weight") and "emb" not in n], "weight_decay": decay},
            {"params": [p for n, p in named if not (n.endswith("weight") and "emb" not in n)], "weight_decay": 0.0}]


def _fully_sharded(ctx, make, blocks_of, optimizer, reshard_after_forward=True, threshold=0):
    rank, n = ctx.rank, ctx.world_size
    per = B // n
    mine = slice(rank * per, (rank + 1) * per)
    torch.manual_seed(0)
    reference = make()
    torch.manual_seed(rank)  # ranks start different: each call broadcasts rank 0's
    model = make()
    for block in blocks_of(model):
        assert zerokit.fully_shard(block, reshard_after_forward=reshard_after_forward,
                                   param_persistence_threshold=threshold) is block
    zerokit.fully_shard(model, reshard_after_forward=reshard_after_forward, param_persistence_threshold=threshold)
    build = {"sgd": lambda m: torch.optim.SGD(named_groups(m), lr=0.1, momentum=0.9),
             "adamw": lambda m: torch.optim.AdamW(named_groups(m), lr=1e-3)}[optimizer]
    opt, ref_opt = build(model), build(reference)
    out = {"held": sum(p.numel() for p in model.parameters() if p.requires_grad),
           "whole": sum(p.numel() for p in reference.parameters() if p.requires_grad), "diffs": []}
    for step in range(STEPS):
        x, y = batch(step)
        cut = mine.start + per // 2  # two micro-batches, gradients accumulating between them, as torch's do
        for part in (slice(mine.start, cut), slice(cut, mine.stop)):
            rows = part.stop - part.start
            (loss_of(model, x[part], y[part]) * rows / per).backward()  # together: the mean over this rank's rows
        opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
        loss_of(reference, x, y).backward()
        ref_opt.step()
        full = model.full_state_dict()
        if rank == 0:
            fresh = make()
            fresh.load_state_dict(full, strict=True)
            out["diffs"].append(max_diff(fresh, reference))
    out["names"] = sorted(n for n, _ in model.named_parameters()) == sorted(n for n, _ in reference.named_parameters())
    try:
        zerokit.checkpoint.save(tempfile.mkdtemp(), model)
    except TypeError as e:
        out["checkpoint"] = str(e)
    return out


FULLY_SHARD = {"blocks at 3, SGD": (3, Blocks, lambda m: list(m.blocks), "sgd", True),
               "blocks at 2, AdamW, no reshard": (2, Blocks, lambda m: list(m.blocks), "adamw", False),
               # tied embedding and head, a frozen bias, buffers, MHA
               "odd at 2, SGD": (2, Odd, lambda m: [m.attn], "sgd", True),
               # biases and in_proj_bias (< 20 elements) whole on every rank, stepped whole
               "blocks at 2, SGD, persistence threshold": (2, Blocks, lambda m: list(m.blocks), "sgd", True, 20)}


def _mixed_precision(ctx, make, blocks_of, dtype, reduce_dtype=None, threshold=0):
    """``fully_shard(mp_policy=MixedPrecisionPolicy(…))``, zerokit's and torch's FSDP2, on the same loop: rank 0's
    model, each rank its slice in two accumulating micro-batches, SGD with momentum and groups."""
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from torch.distributed.fsdp import fully_shard as torch_fully_shard

    rank, n = ctx.rank, ctx.world_size
    per = B // n
    mine = slice(rank * per, (rank + 1) * per)
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=reduce_dtype)
    out = {}
    for kind, shard in (("zerokit", lambda m: zerokit.fully_shard(m, mp_policy=policy,
                                                                  param_persistence_threshold=threshold)),
                        ("torch", lambda m: torch_fully_shard(m, mp_policy=policy))):
        torch.manual_seed(0)
        model = make()
        for block in blocks_of(model):
            shard(block)
        shard(model)
        opt = torch.optim.SGD(named_groups(model), lr=0.1, momentum=0.9)
        losses, kept = [], set()
        if kind == "zerokit":
            out["start"] = model.full_state_dict(rank0_only=False)  # on every rank, as torch's rank0_only=False
        for step in range(STEPS):
            x, y = batch(step)
            cut = mine.start + per // 2
            for part in (slice(mine.start, cut), slice(cut, mine.stop)):
                logits = model(x[part])
                kept.add(str(logits.dtype))
                loss = F.cross_entropy(logits.float().flatten(0, 1), y[part].flatten()) * (part.stop - part.start) / per
                loss.backward()
                losses.append(float(loss))
            kept |= {f"{p.dtype} {p.grad.dtype}" for p in model.parameters() if p.grad is not None}
            opt.step()
            opt.zero_grad()
            if step == 0:  # the first step's result, whole
                if kind == "zerokit":
                    first = model.full_state_dict()
                else:
                    first = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in model.state_dict().items()}
        out[kind] = {"losses": losses, "dtypes": sorted(kept), "state": first if rank == 0 else None}
    return out


MIXED = {"odd at 2, bf16": (2, Odd, lambda m: [m.attn], torch.bfloat16),
         "odd at 2, fp16": (2, Odd, lambda m: [m.attn], torch.float16),
         "blocks at 2, bf16, persistence threshold": (2, lambda: Blocks(), lambda m: list(m.blocks), torch.bfloat16,
                                                      None, 20),
         "blocks at 3, bf16 compute, fp32 reduction": (3, lambda: Blocks(), lambda m: list(m.blocks), torch.bfloat16,
                                                       torch.float32)}


# -- zerokit.parallelize_module: torch's convention, nn.MultiheadAttention by heads ---------------------------------
class TPNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(14, 8)
        self.attn = nn.MultiheadAttention(8, 4, batch_first=True)
        self.fc1, self.fc2 = nn.Linear(8, 12), nn.Linear(12, 8)
        self.head = nn.Linear(8, 14)
        self.register_buffer("mask", torch.triu(torch.ones(T, T, dtype=torch.bool), 1), persistent=False)

    def forward(self, idx):
        x = self.emb(idx)
        a, weights = self.attn(x, x, x, attn_mask=self.mask)  # need_weights at its default: True
        x = x + a
        self.last_weights = weights
        return self.head(x + self.fc2(torch.tanh(self.fc1(x))))


def _tensor_parallel(ctx):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    torch.manual_seed(0)
    reference = TPNet()
    torch.manual_seed(ctx.rank)  # rank 0's model is broadcast before sharding
    model = TPNet()
    zerokit.parallelize_module(model, None, {"emb": RowwiseParallel(), "attn": "attention",
                                             "fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    opt, ref_opt = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(reference.parameters(), lr=0.1)
    losses, weights = [], []
    for step in range(STEPS):
        x, y = batch(step)  # the whole batch on every tp rank
        y = y % 14
        pair = []
        for m, o in ((model, opt), (reference, ref_opt)):
            o.zero_grad()
            loss = F.cross_entropy(m(x).flatten(0, 1), y.flatten())
            loss.backward()
            o.step()
            pair.append(float(loss))
        losses.append(pair)
        weights.append(float((model.last_weights - reference.last_weights).abs().max()))
    refused = ""
    try:
        zerokit.parallelize_module(TPNet(), None, {"fc1": ColwiseParallel(use_local_output=False)})
    except ValueError as e:
        refused = str(e)
    return losses, weights, max_diff_named(model, reference, ("head.weight", "head.bias")), refused


def max_diff_named(a, b, names):
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    return max(float((pa[n] - pb[n]).abs().max()) for n in names)


# -- zerokit.pipeline: your own model split into stages, stepped in your own loop ----------------------------------
class Lift(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(D, D)

    def forward(self, x):
        return x + torch.tanh(self.fc(x))


def sequential(lifts=4):
    return nn.Sequential(nn.Embedding(V, D), *[Lift() for _ in range(lifts)], nn.Linear(D, V))


def _pipelined(ctx, schedule, chunks, split_points):
    lifts = 4 if chunks == 1 else 6  # interleaving: every rank's chunks the same number of pieces
    torch.manual_seed(0)
    reference = sequential(lifts)
    torch.manual_seed(0)  # every rank builds the same model; each keeps its stages
    pipe = zerokit.pipeline(sequential(lifts), split_points=split_points, schedule=schedule, micro_batches=2,
                            loss_fn=lambda out, y: F.cross_entropy(out.flatten(0, 1), y.flatten()), chunks=chunks)
    opt = torch.optim.SGD(pipe.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    names, whole = pipe.driver.names, dict(reference.named_parameters())
    out = {"losses": [], "ref": [], "diffs": []}
    for step in range(STEPS):
        x, y = batch(step)
        losses = []
        out["losses"].append(pipe.step(x, target=y, losses=losses))
        out.setdefault("micro", []).append(losses)
        opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
        loss = loss_of(reference, x, y)
        loss.backward()
        ref_opt.step()
        out["ref"].append(float(loss))
        out["diffs"].append(max(float((p - whole[names[id(p)]]).abs().max()) for p in pipe.parameters()))
    return out


PIPELINES = [("1f1b", 1, ["3"]), ("gpipe", 1, None), ("interleaved", 2, ["2", "4", "6"])]


def _pipelines_side_by_side(ctx):
    """dp=2 × pp=2: two pipelines, each on its half of the batch, reduced over dp by zerokit's DDP around the
    stages, or by zerokit.ShardedOptimizer over their parameters; and what is refused."""
    ctx.set_mesh({"dp": 2, "pp": 2})
    dp = ctx.mesh.coord("dp")
    half = slice(dp * B // 2, (dp + 1) * B // 2)
    loss_fn = lambda out, y: F.cross_entropy(out.flatten(0, 1), y.flatten())  # noqa: E731
    out = {}
    for wrapper in ("ddp", "sharded optimizer"):
        torch.manual_seed(0)
        reference = sequential()
        # every stage of the first pipeline from the same seed (torch pipelining's convention), the other
        # pipeline's replicas from others: the wrappers broadcast over dp
        torch.manual_seed(0 if dp == 0 else 1 + ctx.rank)
        pipe = zerokit.pipeline(sequential(), split_points=["3"], schedule="1f1b", micro_batches=3, loss_fn=loss_fn)
        if wrapper == "ddp":
            zerokit.DistributedDataParallel(pipe.module)
            opt = torch.optim.SGD(pipe.parameters(), lr=0.1, momentum=0.9)
        else:
            opt = zerokit.ShardedOptimizer(pipe.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9)
        ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
        names, whole = pipe.driver.names, dict(reference.named_parameters())
        diffs = []
        for step in range(STEPS):
            x, y = batch(step)
            pipe.step(x[half], target=y[half])
            opt.step()
            opt.zero_grad()
            ref_opt.zero_grad()
            loss_of(reference, x, y).backward()
            ref_opt.step()
            diffs.append(max(float((p - whole[names[id(p)]]).abs().max()) for p in pipe.parameters()))
        out[wrapper] = diffs
    for refused, wrap in (("fully_shard", zerokit.fully_shard),
                          ("torch DDP", lambda m: torch.nn.parallel.DistributedDataParallel(
                              m, process_group=ctx.mesh.group("dp")))):
        pipe = zerokit.pipeline(sequential(), split_points=["3"], micro_batches=3, loss_fn=loss_fn)
        kept = wrap(pipe.module)  # noqa: F841 (torch's wrapper must stay alive to be found)
        try:
            pipe.step(*(t[half] for t in batch(0)))
        except ValueError as e:
            out[refused] = str(e)
    return out


def _not_pieces(ctx):
    try:
        zerokit.pipeline(Odd(), loss_fn=F.cross_entropy)
    except ValueError as e:
        return str(e)


def _scheduled(ctx, block):
    torch.manual_seed(0)
    engine, optimizer, _, scheduler = zerokit.initialize(model=Odd(), config={
        "train_micro_batch_size_per_gpu": B // ctx.world_size, "gradient_clipping": 0, "scheduler": block,
        "optimizer": {"type": "SGD", "params": {"lr": 0.5}}, "zero_optimization": {"stage": 1}})
    lrs = [optimizer.param_groups[0]["lr"]]
    per = B // ctx.world_size
    for step in range(6):
        x, y = batch(step)
        engine.backward(loss_of(engine, x[ctx.rank * per:(ctx.rank + 1) * per], y[ctx.rank * per:(ctx.rank + 1) * per]))
        engine.step()
        lrs.append(optimizer.param_groups[0]["lr"])
    return lrs


WARM = {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 0.1, "warmup_num_steps": 4,
                                       "warmup_type": "linear"}}
DECAY = {"type": "WarmupDecayLR", "params": {**WARM["params"], "total_num_steps": 6}}


# -- the launches: one per world size carries the checks (a launch costs more than the checks) ---------------------
def _more(ctx):
    out = {"groups": _groups_given_to_initialize(ctx), "WarmupLR": _scheduled(ctx, WARM),
           "WarmupDecayLR": _scheduled(ctx, DECAY)}
    out["fully_shard"] = {case: _fully_sharded(ctx, *args[1:]) for case, args in FULLY_SHARD.items() if args[0] == 2}
    out["mixed"] = {case: _mixed_precision(ctx, *args[1:]) for case, args in MIXED.items() if args[0] == 2}
    out["tensor parallel"] = _tensor_parallel(ctx)
    # last: zerokit.pipeline lays the ranks out on pp
    out["pipeline"] = {schedule: _pipelined(ctx, schedule, chunks, split) for schedule, chunks, split in PIPELINES}
    out["not pieces"] = _not_pieces(ctx)
    return out


def _three(ctx):
    return {"batch message": _batch_message(ctx),
            "fully_shard": {case: _fully_sharded(ctx, *args[1:]) for case, args in FULLY_SHARD.items() if args[0] == 3},
            "mixed": {case: _mixed_precision(ctx, *args[1:]) for case, args in MIXED.items() if args[0] == 3}}


def _grid(ctx, wrapper):
    ctx.set_mesh({"dp": 2, "tp": 2})
    dp = ctx.mesh.coord("dp")
    torch.manual_seed(0)
    reference = TPNet()
    torch.manual_seed(0)
    model = TPNet()
    zerokit.parallelize_module(model, None, {"attn": "attention", "fc1": "colwise", "fc2": "rowwise"})  # on tp
    if wrapper == "ddp":
        model = zerokit.DistributedDataParallel(model)  # on dp
    else:
        zerokit.fully_shard(model)
    opt, ref_opt = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(reference.parameters(), lr=0.1)
    per = B // 2
    losses = []
    for step in range(STEPS):
        x, y = batch(step)
        y = y % 14
        opt.zero_grad()
        loss = F.cross_entropy(model(x[dp * per:(dp + 1) * per]).flatten(0, 1), y[dp * per:(dp + 1) * per].flatten())
        loss.backward()
        opt.step()
        ref_opt.zero_grad()
        ref = F.cross_entropy(reference(x).flatten(0, 1), y.flatten())
        ref.backward()
        ref_opt.step()
        both = torch.tensor([float(loss)])
        dist.all_reduce(both, group=ctx.mesh.group("dp"))
        losses.append((float(both) / 2, float(ref)))
    return losses


def _measure_fsdp2(ctx):
    from torch.distributed.fsdp import fully_shard as torch_fully_shard

    torch.manual_seed(0)
    model = Blocks()
    for block in model.blocks:
        torch_fully_shard(block)
    torch_fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batch(0)
    per = B // ctx.world_size
    with zerokit.measure(model, opt) as m:
        loss_of(model, x[ctx.rank * per:(ctx.rank + 1) * per], y[ctx.rank * per:(ctx.rank + 1) * per]).backward()
        opt.step()
    return {r["op"]: r["calls"] for r in m.collectives}
