"""zerokit.checkpoint: save at step k, resume in a fresh run (same or another world size and stage), and the
losses and parameters at step 2k equal those of a run never interrupted; atomic saves; checksums; weights_only."""
import json
import os

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import zerokit
from zerokit import checkpoint
from zerokit.checkpoint import CheckpointError

VOCAB, WIDTH, HIDDEN, SEQ, BATCH = 13, 7, 11, 5, 6  # BATCH splits over 2 and 3 ranks
K = 3  # save after step K, train to 2K


class Odd(nn.Module):
    """Odd sizes (padding at N = 2 and 3), a frozen weight, tied embedding and head, a buffer."""

    def __init__(self, hidden=HIDDEN):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.fc1 = nn.Linear(WIDTH, hidden)
        self.fc2 = nn.Linear(hidden, WIDTH)
        self.side = nn.Linear(WIDTH, WIDTH)
        self.side.weight.requires_grad_(False)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, idx):
        x = self.emb(idx) * self.scale
        return self.head(self.fc2(torch.tanh(self.fc1(x))) + self.side(x))


def batch(step):
    g = torch.Generator().manual_seed(step)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=g), torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)


def make_engine(ctx, stage, optimizer="adamw", bf16=False, hidden=HIDDEN, zero=(), accumulation=1):
    torch.manual_seed(100)
    model = Odd(hidden)
    params = {"adamw": {"lr": 0.01, "weight_decay": 0.1}, "sgd": {"lr": 0.3, "momentum": 0.9}}[optimizer]
    config = {"train_micro_batch_size_per_gpu": BATCH // ctx.world_size // accumulation,
              "gradient_accumulation_steps": accumulation,
              "optimizer": {"type": "AdamW" if optimizer == "adamw" else "SGD", "params": params},
              "zero_optimization": {"stage": stage, "reduce_bucket_size": 40, **dict(zero)}, "bf16": {"enabled": bf16}}
    engine, _, _, _ = zerokit.initialize(model=model, config=config)
    return engine


def _train(ctx, stage, optimizer="adamw", bf16=False, save_to=None, load_from=None, end=2 * K, zero=(),
           accumulation=1):
    engine = make_engine(ctx, stage, optimizer, bf16, zero=zero, accumulation=accumulation)
    start = 0
    if load_from is not None:
        meta = checkpoint.load(load_from, engine)
        start = meta["data_position"]
        assert meta["step"] == engine.global_steps == start
        rng = torch.get_rng_state()  # this rank's generator, as the uninterrupted run left it at step K
    per, micro, losses = BATCH // ctx.world_size, BATCH // ctx.world_size // accumulation, {}
    for s in range(start, end):
        x, y = batch(s)
        x, y = x[ctx.rank * per:(ctx.rank + 1) * per], y[ctx.rank * per:(ctx.rank + 1) * per]
        total = torch.zeros(())
        for m in range(accumulation):
            xm, ym = x[m * micro:(m + 1) * micro], y[m * micro:(m + 1) * micro]
            loss = F.cross_entropy(engine(xm).float().flatten(0, 1), ym.flatten())
            engine.backward(loss)
            engine.step()
            total += loss.detach().float() / accumulation
        dist.all_reduce(total)
        losses[s] = float(total) / ctx.world_size
        if save_to is not None and s + 1 == K:
            checkpoint.save(save_to, engine, data_position=s + 1)
            rng = torch.get_rng_state()
    state = engine.full_state_dict()
    return losses, ({n: t.float() for n, t in state.items()} if state is not None else None), rng


def _compare(reference, resumed, tol):
    ref_losses, ref_params = reference[:2]
    losses, params = resumed[:2]
    assert sorted(losses) == list(range(K, 2 * K))
    for s in losses:
        assert abs(losses[s] - ref_losses[s]) <= tol, (s, losses[s], ref_losses[s])
    for name, t in ref_params.items():
        assert float((params[name] - t).abs().max()) <= tol, name


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """An uninterrupted zero1 run at N = 2 (fp32, AdamW) that saved at step K."""
    directory = tmp_path_factory.mktemp("ck") / "step3"
    reference = zerokit.launch(_train, 2, 1, save_to=str(directory))[0]
    return directory, reference


@pytest.mark.parametrize("world,stage", [(2, 1), (3, 1), (3, 3), (2, 0), (3, 2)])
def test_resume_equals_the_uninterrupted_run_across_world_size_and_stage(saved, world, stage):
    directory, reference = saved
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["world_size"] == 2 and manifest["stage"] == 1 and manifest["step"] == K
    assert sorted(manifest["files"]) == ["shard-00000-of-00002.pt", "shard-00001-of-00002.pt"]
    resumed = zerokit.launch(_train, world, stage, load_from=str(directory))[0]
    _compare(reference, resumed, 1e-6)


@pytest.mark.parametrize("source,target,optimizer,bf16,tol", [
    ((3, 3), (2, 2), "adamw", False, 1e-6),   # zero3 at 3 ranks -> zero2 at 2
    ((2, 0), (3, 3), "sgd", False, 1e-6),     # ddp with SGD momentum -> zero3 at 3
    ((2, 2), (2, 2), "adamw", True, 0.0),     # bf16-mixed, the same layout: bit for bit
    ((2, 1), (2, 3), "adamw", True, 2e-2),    # bf16-mixed zero1 -> zero3 (bf16 reductions differ in order)
])
def test_resume_other_sources_optimizers_and_precisions(tmp_path, source, target, optimizer, bf16, tol):
    directory = tmp_path / "ck"
    reference = zerokit.launch(_train, source[0], source[1], optimizer, bf16, save_to=str(directory))[0]
    resumed = zerokit.launch(_train, target[0], target[1], optimizer, bf16, load_from=str(directory))[0]
    _compare(reference, resumed, tol)


@pytest.mark.parametrize("source,target,zero,accumulation", [
    # zero3 with persistent (whole, unsharded) small parameters and the optimizer on the host -> zero1 at 3 ranks
    ((2, 3), (3, 1), {"stage3_param_persistence_threshold": 20, "offload_optimizer": {"device": "cpu"}}, 1),
    ((2, 2), (2, 3), {}, 3),  # three micro-batches per step (the step count and the boundary survive)
])
def test_resume_persistent_offloaded_and_accumulated(tmp_path, source, target, zero, accumulation):
    directory = tmp_path / "ck"
    reference = zerokit.launch(_train, source[0], source[1], save_to=str(directory), zero=tuple(zero.items()),
                               accumulation=accumulation)
    resumed = zerokit.launch(_train, target[0], target[1], load_from=str(directory), accumulation=accumulation)
    _compare(reference[0], resumed[0], 1e-6)
    if source[0] == target[0]:  # every rank's RNG is back where it was at step K
        assert all(torch.equal(a[2], b[2]) for a, b in zip(reference, resumed))


def test_export_full_state_dict_is_the_model_at_step_k(saved, tmp_path):
    directory, reference = saved
    state, optimizer_states = checkpoint.export_full_state_dict(directory, optimizer_states=True)
    model = Odd()
    model.load_state_dict(state)  # a plain state dict: every parameter and buffer, shaped
    assert set(optimizer_states) == {n for n, p in model.named_parameters() if p.requires_grad}
    adam = optimizer_states["fc1.weight"]
    assert adam["exp_avg"].shape == model.fc1.weight.shape and float(adam["step"]) == K


def _save_twice(ctx, directory, fail):
    engine = make_engine(ctx, 2)
    x, y = batch(0)
    for step in (1, 2):
        engine.backward(F.cross_entropy(engine(x).flatten(0, 1), y.flatten()))
        engine.step()
        if step == 2 and fail == "manifest" and ctx.rank == 0:
            checkpoint.files.commit = lambda *a: (_ for _ in ()).throw(OSError("disk full"))
        if step == 2 and fail == "shard" and ctx.rank == 1:
            checkpoint.files.write_file = lambda *a: (_ for _ in ()).throw(OSError("disk full"))
        checkpoint.save(directory, engine, data_position=step)


@pytest.mark.parametrize("fail", ["manifest", "shard"])
def test_a_save_that_fails_midway_leaves_the_previous_checkpoint(tmp_path, fail):
    directory = tmp_path / "latest"
    with pytest.raises(zerokit.RankFailed, match="disk full"):
        zerokit.launch(_save_twice, 2, str(directory), fail, timeout_s=60)
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == ["latest"]
    assert json.loads((directory / "manifest.json").read_text())["step"] == 1
    assert checkpoint.export_full_state_dict(directory)  # loads, checksums hold
    # the next save replaces it whole and sweeps the crashed save's temporary directory
    zerokit.launch(_save_twice, 2, str(directory), "none")
    assert json.loads((directory / "manifest.json").read_text())["step"] == 2
    assert [p.name for p in tmp_path.iterdir()] == ["latest"]


def test_corruption_missing_directory_and_weights_only(saved, tmp_path):
    directory, _ = saved
    with pytest.raises(CheckpointError, match="does not exist"):
        checkpoint.export_full_state_dict(tmp_path / "nowhere")
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in directory.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    shard = copy / "shard-00001-of-00002.pt"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="shard-00001-of-00002.pt.*corrupted"):
        checkpoint.export_full_state_dict(copy)
    # a file that would run code when unpickled: the checksum matches, weights_only refuses it
    torch.save({"segments": {}, "payload": os.system}, shard)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["files"][shard.name] = checkpoint.files.sha256(shard)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="weights_only"):
        checkpoint.export_full_state_dict(copy)
    (copy / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match="manifest.json.*missing"):
        checkpoint.export_full_state_dict(copy)


def _load_elsewhere(ctx, directory):
    messages = []
    for engine in (make_engine(ctx, 1, hidden=HIDDEN + 1), make_engine(ctx, 3, optimizer="sgd")):
        with pytest.raises(CheckpointError) as info:
            checkpoint.load(directory, engine)
        messages.append(str(info.value))
    return messages


def test_a_checkpoint_of_another_model_or_optimizer_names_what_differs(saved):
    directory, _ = saved
    shape, optimizer = zerokit.launch(_load_elsewhere, 2, str(directory))[0]
    assert "'fc1.weight' has shape (11, 7) there, (12, 7) in the model" in shape, shape
    assert "AdamW" in optimizer and "SGD" in optimizer, optimizer


def _misuse(ctx, directory):
    messages = []
    engine = make_engine(ctx, 1, accumulation=2)
    x, y = batch(0)
    engine.backward(F.cross_entropy(engine(x[:1]).flatten(0, 1), y[:1].flatten()))
    for call in (lambda: checkpoint.save(directory, engine),                      # mid-accumulation
                 lambda: checkpoint.save(directory, engine.strategy, step=0, data_position=object()),
                 lambda: checkpoint.save(directory, zerokit.DistributedDataParallel(Odd())),
                 lambda: checkpoint.load(directory, 42)):
        with pytest.raises((ValueError, TypeError)) as info:
            call()
        messages.append(str(info.value))
    return messages


def test_misuse_says_what_to_do(tmp_path):
    messages = zerokit.launch(_misuse, 2, str(tmp_path / "ck"))[0]
    for message, expected in zip(messages, ["micro-batches", "JSON-serializable", "your own torch optimizer",
                                            "Engine or strategy"]):
        assert expected in message, message
    assert not (tmp_path / "ck").exists()


def test_the_checkpoint_barrier_waits_for_the_device_where_collectives_return_at_enqueue(monkeypatch):
    """On NCCL an all-reduce returns to the host once enqueued: the barrier must then wait for the device, or a
    rank writes its shard before rank 0 made the directory. Played on the CPU with a CUDA device in the context
    and the collective recorded, not run: the barrier's all-reduce is followed by a synchronize of that device."""
    import importlib
    from types import SimpleNamespace

    save = importlib.import_module("zerokit.checkpoint.save")  # the module (the package exports its function)
    calls = []
    monkeypatch.setattr(save.comm, "all_reduce", lambda t, **kw: calls.append(("all_reduce", kw.get("tag"))))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(("synchronize", str(device))))
    empty = torch.empty(0)
    monkeypatch.setattr(torch, "zeros", lambda *a, **kw: empty)  # no CUDA in this build: the tensor is a stand-in
    cuda = SimpleNamespace(ctx=SimpleNamespace(rank=1, world_size=2, device=torch.device("cuda", 1)))
    save.barrier(cuda)
    assert calls == [("all_reduce", "checkpoint barrier"), ("synchronize", "cuda:1")]
    calls.clear()
    cpu = SimpleNamespace(ctx=SimpleNamespace(rank=1, world_size=2, device=torch.device("cpu")))
    save.barrier(cpu)  # gloo's all-reduce returns when it completes: nothing more to wait for
    assert calls == [("all_reduce", "checkpoint barrier")]
