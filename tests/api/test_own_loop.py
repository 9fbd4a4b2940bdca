"""zerokit in a user's own loop: the torch-style wrappers and ``zerokit.initialize`` on a model that is not
zerokit's (odd sizes, a frozen weight, a frozen bias, tied weights, a buffer), each rank on its slice of the
batch, compared after every step with a plain copy trained on the whole batch."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import zerokit

VOCAB, WIDTH, HIDDEN, SEQ, BATCH = 13, 7, 11, 5, 6


class Odd(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.fc1 = nn.Linear(WIDTH, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, WIDTH)
        self.fc2.bias.requires_grad_(False)               # a frozen bias
        self.side = nn.Linear(WIDTH, WIDTH)
        self.side.weight.requires_grad_(False)            # a frozen weight
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.emb.weight                # tied
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, idx):
        x = self.emb(idx) * self.scale
        x = self.fc2(torch.tanh(self.fc1(x))) + self.side(x)
        return self.head(x)


def batch(step):
    g = torch.Generator().manual_seed(step)
    x = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return x, torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)


def loss_fn(logits, y):
    return F.cross_entropy(logits.flatten(0, 1), y.flatten())


def build(seed):
    torch.manual_seed(seed)
    return Odd()


def max_diff(a: nn.Module, b: nn.Module) -> float:
    return max(float((p.detach().float() - q.detach().float()).abs().max())
               for p, q in zip(a.parameters(), b.parameters()))


def _run(ctx, kind, optimizer, steps=3):
    rank, n = ctx.rank, ctx.world_size
    # ranks start different: construction broadcasts rank 0's model — except for ShardedOptimizer, which (like
    # torch's ZeroRedundancyOptimizer) sees only the parameters it steps, not the frozen ones or the buffers
    model, reference = build(100 + (rank if kind != "sharded" else 0)), build(100)
    opt_cls, kwargs = {"sgd": (torch.optim.SGD, {"lr": 0.3}), "adamw": (torch.optim.AdamW, {"lr": 0.01})}[optimizer]
    ref_opt = opt_cls([p for p in reference.parameters() if p.requires_grad], **kwargs)
    if kind == "ddp":
        wrapped = zerokit.DistributedDataParallel(model, bucket_mb=0.0001)
        opt = opt_cls([p for p in wrapped.parameters() if p.requires_grad], **kwargs)
        forward, backward, step = wrapped, (lambda loss: loss.backward()), opt.step
        zero = lambda: opt.zero_grad()  # noqa: E731
    elif kind == "sharded":
        opt = zerokit.ShardedOptimizer([p for p in model.parameters() if p.requires_grad], opt_cls, **kwargs)
        forward, backward, step, zero = model, (lambda loss: loss.backward()), opt.step, opt.zero_grad
    else:  # a DeepSpeed config at stage 0-3
        stage = int(kind[-1])
        config = {"train_micro_batch_size_per_gpu": BATCH // n, "gradient_accumulation_steps": 1,
                  "optimizer": {"type": "SGD" if optimizer == "sgd" else "AdamW", "params": kwargs},
                  "zero_optimization": {"stage": stage, "reduce_bucket_size": 50}}
        engine, _, _, _ = zerokit.initialize(model=model, model_parameters=[p for p in model.parameters()
                                                                            if p.requires_grad], config=config)
        forward, backward, step, zero = engine, engine.backward, engine.step, engine.zero_grad
    diffs = [max_diff(model, reference) if kind != "stage3" else 0.0]
    for s in range(steps):
        x, y = batch(s)
        per = BATCH // n
        zero()
        backward(loss_fn(forward(x[rank * per:(rank + 1) * per]), y[rank * per:(rank + 1) * per]))
        step()
        ref_opt.zero_grad()
        loss_fn(reference(x), y).backward()
        if kind.startswith("stage"):  # the config has no gradient_clipping: DeepSpeed (and initialize) clip at 1.0
            torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
        ref_opt.step()
        if kind == "stage3":
            with engine.gathered():
                diffs.append(max_diff(model, reference))
        else:
            diffs.append(max_diff(model, reference))
    return diffs


KINDS = ["ddp", "sharded", "stage0", "stage1", "stage2", "stage3"]


# every wrapper with SGD and AdamW at N=2, and with SGD at the odd N=3 (padding)
@pytest.mark.parametrize("kind,optimizer,world_size", [(k, o, 2) for k in KINDS for o in ("sgd", "adamw")]
                         + [(k, "sgd", 3) for k in KINDS])
def test_own_loop_matches_a_plain_copy_after_every_step(kind, optimizer, world_size):
    per_rank = zerokit.launch(_run, world_size, kind, optimizer)
    for rank, diffs in enumerate(per_rank):
        assert max(diffs) <= 1e-6, (kind, optimizer, rank, diffs)


def _bad(ctx, what):
    model = build(0)
    if what == "twice":
        zerokit.DistributedDataParallel(model)
        zerokit.DistributedDataParallel(model)
    if what == "pipeline":
        zerokit.initialize(model=model, config={"pipeline": {"stages": 2, "partition_method": "parameters"},
                                                "zero_optimization": {"stage": 1}})
    if what == "unknown":
        zerokit.initialize(model=model, config={"zero_optimization": {"stage": 1}, "wall_clock_breakdown": True})
    if what == "batch":
        zerokit.initialize(model=model, config={"train_batch_size": 10, "train_micro_batch_size_per_gpu": 2,
                                                "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 0}})


@pytest.mark.parametrize("what,match", [
    ("twice", "already wrapped"),
    ("pipeline", "PipelineModule"),
    ("unknown", "wall_clock_breakdown"),
    ("batch", "train_batch_size=10"),
])
def test_bad_own_loop_input_names_the_argument(what, match):
    with pytest.raises(zerokit.RankFailed, match=match):
        zerokit.launch(_bad, 2, what)


def test_wrapping_without_a_process_group_says_how_to_start_one():
    with pytest.raises(RuntimeError, match="zerokit.launch"):
        zerokit.DistributedDataParallel(build(0))
    with pytest.raises(RuntimeError, match="torchrun"):
        zerokit.initialize(model=build(0), config={"zero_optimization": {"stage": 1}})


def _measured(ctx):
    model = build(0)
    engine, _, _, _ = zerokit.initialize(model=model, config={"zero_optimization": {"stage": 2},
                                                              "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})
    x, y = batch(0)
    with zerokit.measure(engine) as m:
        engine.backward(loss_fn(engine(x[:3]), y[:3]))
        engine.step()
    return m.memory, m.collectives, m.table()


def test_measure_reads_the_ledgers_around_a_block():
    memory, collectives, table = zerokit.launch(_measured, 2)[0]
    ops = {(r["phase"], r["op"]) for r in collectives}
    assert ("backward", "reduce_scatter") in ops and ("step", "all_gather") in ops
    assert memory["params"] > 0 and memory["optimizer"] > 0
    assert "payload B (measured)" in table


#: the seed's ZeRO block (shared/seed), with the optimizer a DeepSpeed config needs
SEED_ZERO = {"stage": 3, "allgather_partitions": True, "allgather_bucket_size": 5e8, "reduce_scatter": True,
             "overlap_comm": True, "contiguous_gradients": True}


def _seed_snippet(ctx, library, clipping=0):
    """The seed's loop; ``clipping`` None: the config has no gradient_clipping key (DeepSpeed's default applies)."""
    import os
    import warnings

    work = zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=2, batch_size=8)
    model = work.build_model()
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
              "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "zero_optimization": dict(SEED_ZERO)}
    if clipping is not None:
        config["gradient_clipping"] = clipping
    if library == "deepspeed":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        for key, value in (("RANK", ctx.rank), ("WORLD_SIZE", ctx.world_size), ("LOCAL_RANK", ctx.rank)):
            os.environ.setdefault(key, str(value))
        import deepspeed
        import torch.distributed as dist

        deepspeed.init_distributed(dist_backend=dist.get_backend(), auto_mpi_discovery=False)
        config.update(zero_allow_untested_optimizer=True, steps_per_print=10 ** 9)
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    else:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            engine, _, _, _ = zerokit.initialize(model=model, model_parameters=model.parameters(), config=config)
        assert any("allgather_bucket_size" in str(w.message) for w in caught)
    losses = []
    for step in range(3):
        x, y = work.batch(step)
        x, y = x[ctx.rank * 4:(ctx.rank + 1) * 4], y[ctx.rank * 4:(ctx.rank + 1) * 4]
        total = 0.0
        for micro in range(2):
            loss = work.loss(engine(x[micro * 2:(micro + 1) * 2]), y[micro * 2:(micro + 1) * 2])
            engine.backward(loss)
            engine.step()
            total += float(loss) / 2
        losses.append(total)
    return losses


def test_the_seeds_snippet_runs_with_zerokit_and_matches_deepspeed_and_the_reference():
    ours = zerokit.launch(_seed_snippet, 2, "zerokit")
    reference = zerokit.train(zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=2, batch_size=8),
                              "single", world_size=1, steps=3, optimizer="sgd", lr=0.1, reference=False)
    mean = [sum(r[i] for r in ours) / 2 for i in range(3)]
    assert mean == pytest.approx(reference.results[0].losses, abs=1e-5)
    pytest.importorskip("deepspeed")
    theirs = zerokit.launch(_seed_snippet, 2, "deepspeed")
    for a, b in zip(ours, theirs):
        assert a == pytest.approx(b, abs=1e-5)


def test_without_a_gradient_clipping_key_zerokit_clips_at_deepspeeds_default_as_deepspeed_does():
    pytest.importorskip("deepspeed")
    ours, unclipped = zerokit.launch(_seed_snippet, 2, "zerokit", None), zerokit.launch(_seed_snippet, 2, "zerokit")
    theirs = zerokit.launch(_seed_snippet, 2, "deepspeed", None)
    assert abs(ours[0][-1] - unclipped[0][-1]) > 1e-4  # the default matters here: 10× the tolerance below
    for a, b in zip(ours, theirs):
        assert a == pytest.approx(b, abs=1e-5)


def _ledgers(ctx, stage):
    work = zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=2, batch_size=8)
    model = work.build_model()
    engine, _, _, _ = zerokit.initialize(model=model, config={  # zerokit.train does not clip: neither does this
        "train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "gradient_clipping": 0,
        "zero_optimization": {"stage": stage}})
    engine.zero_grad_after_step = False  # zerokit.train reads its ledgers after the step, before zero_grad
    for step in range(2):
        x, y = work.batch(step)
        engine.zero_grad()
        with zerokit.measure(engine) as m:
            engine.backward(work.loss(engine(x[ctx.rank * 4:(ctx.rank + 1) * 4]), y[ctx.rank * 4:(ctx.rank + 1) * 4]))
            engine.step()
    payload = sum(r["payload_bytes"] for r in m.collectives)
    return {k: m.memory[k] for k in ("params", "grads", "optimizer")}, payload


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_own_loop_ledgers_equal_zerokit_trains(stage):
    work = zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=2, batch_size=8)
    states, payload = zerokit.launch(_ledgers, 2, stage)[0]
    trained = zerokit.train(work, ["ddp", "zero1", "zero2", "zero3"][stage], world_size=2, steps=2, reference=False)
    rank0 = trained.results[0].ranks[0]
    assert states == rank0.model_state_bytes
    assert payload == rank0.comm_payload_bytes_per_step


def _phases(ctx):
    model = zerokit.DistributedDataParallel(build(0))
    x, y = batch(0)
    with zerokit.measure(model) as m:
        loss_fn(model(x[:3]), y[:3]).backward()  # the user's own backward, outside any zerokit phase
    return {(r["phase"], r["op"]) for r in m.collectives}


def test_collectives_fired_by_a_users_own_backward_are_filed_under_backward():
    assert zerokit.launch(_phases, 2)[0] == {("backward", "all_reduce")}


# A user's own torchrun script. After destroy_process_group no gloo thread may be left: one that outlives it runs
# into interpreter exit, where releasing a finished collective's tensor needs the GIL, and the finalizing interpreter
# ends that thread with pthread_exit, which aborts the process ("terminate called without an active exception",
# once in a fresh-clone run). Two things kept every group alive past destroy_process_group: zerokit's mesh (its
# DeviceMesh's group registry), reachable from the engine's strategy, which no del or gc frees (the post-accumulate-
# grad hooks on the parameters form a cycle torch's gc cannot collect), and torch.distributed.nn.functional, whose
# default arguments are the world group when it is first imported after init_process_group (torch.optim's first
# optimizer imports it, here inside zerokit.initialize). zerokit.runtime holds groups weakly and imports that module
# when zerokit is imported: so the script imports zerokit first and keeps its engine and model to the end.
_UNDER_TORCHRUN = '''
import os, torch, torch.distributed as dist, torch.nn.functional as F
import zerokit

dist.init_process_group("gloo")                   # no zerokit.launch
torch.manual_seed(int(os.environ["RANK"]))         # ranks start different
model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
engine, _, _, _ = zerokit.initialize(model=model, config={"zero_optimization": {"stage": 2},
                                                          "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})
x, y = torch.randn(4, 5, generator=torch.Generator().manual_seed(1)), torch.tensor([0, 1, 2, 0])
engine.backward(F.cross_entropy(engine(x), y)); engine.step()
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
everyone = [torch.empty_like(flat) for _ in range(2)]
dist.all_gather(everyone, flat)
if dist.get_rank() == 0:                           # both ranks' parameters, compared on one (one printer)
    print("EQUAL", bool((everyone[0] == everyone[1]).all()), flush=True)
dist.barrier()
dist.destroy_process_group()                       # engine and model still alive: nothing holds a group
if os.environ["RANK"] == "0" and os.path.isdir("/proc/self/task"):  # the threads left (Linux), main thread aside
    names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
    print("GLOO THREADS", sorted(n for n in names if "gloo" in n), flush=True)
'''


def test_initialize_under_torchrun(tmp_path):
    import os
    import subprocess
    import sys

    script = tmp_path / "own_loop.py"
    script.write_text(_UNDER_TORCHRUN)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT", "TORCHELASTIC_RUN_ID", "GROUP_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    # --standalone: torchrun's agent binds a free port itself (one picked here and released could be taken first)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(script)], env=env, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "EQUAL True" in done.stdout, done.stdout
    if sys.platform.startswith("linux"):  # destroy_process_group joined every gloo thread (see _UNDER_TORCHRUN)
        assert "GLOO THREADS []" in done.stdout, done.stdout
