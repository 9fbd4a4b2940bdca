"""The NCCL and CUDA paths, checked on the CPU: what a CUDA run needs that gloo forgives.

Each test pins down one rule a CUDA job relies on, with the device simulated (the
``meta`` device stands for a GPU where a tensor's placement is what matters; the CUDA
calls are recorded where their count or order is what matters):

- a resumed optimizer's ``step`` goes where torch's ``Optimizer.load_state_dict`` puts
  it: on the master's device when the optimizer is fused or capturable, on the host
  otherwise (a fused CUDA AdamW refuses a host ``step``);
- under torchrun each worker computes ``zerokit.train``'s reference on its own GPU, chosen
  by its node's worker count (not the world's, which spans nodes);
- a loop of the user's own under a bare torchrun gets one context per process group (one
  mesh, one set of groups), timed with CUDA events, and ``zerokit.measure`` reads the
  caching allocator of its device;
- an MoE forward reads the device back on the host only where it must (the split sizes of
  the uneven all-to-all, once; each local expert's slice), and its expert ids travel as
  int32, exact past 256 experts where a 16-bit float is not;
- a checkpoint saved by a job with another GPU count restores the GPUs both have, saying
  so; exercise 01's ring cannot deadlock under NCCL's ordering (its traffic replayed by
  :mod:`zerokit.runtime.p2p_replay`), and exercise 03's buckets live on the parameters' device.
"""
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

import zerokit
from zerokit.checkpoint.layout import FullState, apply_full


# -- resume: where the loaded optimizer states go ------------------------------------------------
def _meta_strategy(fused: bool):
    """A DDP-layout strategy whose parameters live on the ``meta`` device (a GPU's stand-in)."""
    model = nn.Linear(3, 2).to("meta")
    params = list(model.parameters())
    inner = SimpleNamespace(state={}, param_groups=[{"params": params, "fused": fused, "capturable": False}])
    optimizer = SimpleNamespace(tensors=params, masters=params, optimizer=inner, pieces=None)
    return SimpleNamespace(model=model, rank=0, world=1, stage=0, optimizer=optimizer)


def _full_state(model) -> FullState:
    full = FullState()
    for name, p in model.named_parameters():
        full.params[name] = torch.ones(p.numel())
        full.shapes[name] = list(p.shape)
        full.states[name] = {"step": torch.tensor(3.0), "exp_avg": torch.ones(p.numel())}
    return full


@pytest.mark.parametrize("fused", [True, False])
def test_a_resumed_step_goes_where_torchs_load_state_dict_puts_it(fused):
    strategy = _meta_strategy(fused)
    apply_full(strategy, _full_state(strategy.model))
    for master in strategy.optimizer.masters:
        state = strategy.optimizer.optimizer.state[master]
        assert state["exp_avg"].device == master.device
        assert state["step"].device == (master.device if fused else torch.device("cpu")), fused
        assert state["step"].dtype == torch.float32


def _sharded_resume(ctx):
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    opt = zerokit.ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=0.1, fused=True)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    opt.consolidate_state_dict(to=0)
    saved = opt.state_dict()
    inner = opt.strategies[0].optimizer  # its masters moved to the meta device: a GPU's stand-in
    inner.masters[:] = [torch.empty_like(m, device="meta") for m in inner.masters]
    inner.optimizer.param_groups[0]["params"] = list(inner.masters)
    opt.load_state_dict(saved)
    return [(str(inner.optimizer.state[m]["step"].device), str(inner.optimizer.state[m]["exp_avg"].device))
            for m in inner.masters]


def test_sharded_optimizers_load_puts_a_fused_step_on_the_masters_device():
    assert set(zerokit.launch(_sharded_resume, 1)[0]) == {("meta", "meta")}


# -- zerokit.train under torchrun: the reference's device ----------------------------------------
def _torchrun_env(monkeypatch, rank, local_rank, world, local_world):
    for name, value in {"TORCHELASTIC_RUN_ID": "x", "GROUP_RANK": str(rank // local_world), "RANK": str(rank),
                        "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world),
                        "LOCAL_WORLD_SIZE": str(local_world)}.items():
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize("backend", [None, "nccl"])
def test_under_torchrun_each_worker_computes_the_reference_on_its_own_gpu(monkeypatch, backend):
    from zerokit.train import reference_device

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    _torchrun_env(monkeypatch, rank=3, local_rank=1, world=4, local_world=2)  # two nodes of two GPUs
    assert reference_device(backend, 4) == torch.device("cuda", 1)
    _torchrun_env(monkeypatch, rank=1, local_rank=1, world=2, local_world=2)  # one node: not every worker on cuda:0
    assert reference_device(backend, 2) == torch.device("cuda", 1)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert reference_device(None, 2) == torch.device("cpu")


# -- a user's own loop under a bare torchrun: one context, the device's clock, the allocator read --------
class _FakeEvent:
    """A CUDA event's stand-in (:mod:`zerokit.runtime.clock` replays a GPU's timeline with it)."""

    def record(self):
        self.t = 0.0

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return 0.0


def _bare_torchrun_loop(ctx):
    from zerokit.runtime import clock, context

    clock._event_factory = _FakeEvent
    context.backend_device = lambda backend: torch.device("cuda", 0)  # NCCL's device, as a GPU rank sees it
    torch.cuda.memory_allocated = lambda device=None: 12345
    context.set_current(None)  # no launch: only the process group the user made, as under a bare torchrun
    first = zerokit.runtime.context.current()
    same = first is zerokit.runtime.context.current() and first.mesh is zerokit.runtime.context.current().mesh
    on_device = clock.on_device()
    model = nn.Linear(3, 2)
    with zerokit.measure(model) as m:
        model(torch.randn(4, 3)).sum().backward()
    return same, on_device, str(m.ledger.device), m.ledger.allocator_gap_max  # its tensors are on the host: gap = all


def test_a_bare_torchrun_loop_keeps_one_context_times_on_the_device_and_reads_the_allocator():
    same, on_device, device, allocated = zerokit.launch(_bare_torchrun_loop, 1)[0]
    assert same, "current() built a new context (mesh, process groups) per call"
    assert on_device, "the adopted context did not install the device's clock (CUDA events)"
    assert device == "cuda:0" and allocated == 12345


# -- MoE: host syncs per forward, and the expert ids' dtype --------------------------------------------
_SYNCS = ("tolist", "item", "cpu", "__int__", "__bool__", "__float__", "nonzero")


def _count_syncs(counts: dict):
    """Count the calls that read a device tensor back on the host (on CUDA each waits for the stream): the
    conversions, nonzero and boolean-mask indexing (both size their output from the data), bincount (its
    maximum)."""
    def counted(name, real):
        def call(self, *args, **kwargs):
            counts[name] = counts.get(name, 0) + 1
            return real(self, *args, **kwargs)
        return call

    for name in _SYNCS:
        setattr(torch.Tensor, name, counted(name, getattr(torch.Tensor, name)))
    real_getitem, real_bincount = torch.Tensor.__getitem__, torch.bincount

    def getitem(self, index):
        if torch.is_tensor(index) and index.dtype == torch.bool:
            counts["mask"] = counts.get("mask", 0) + 1
        return real_getitem(self, index)

    def bincount(*args, **kwargs):
        counts["bincount"] = counts.get("bincount", 0) + 1
        return real_bincount(*args, **kwargs)

    torch.Tensor.__getitem__, torch.bincount = getitem, bincount


def _moe_forward(ctx, experts, hot, dtype):
    from zerokit.expert_parallel import MoEMLP

    torch.manual_seed(0)
    whole = MoEMLP(8, experts, top_k=1).to(dtype)
    layer = MoEMLP(8, experts, top_k=1).to(dtype)
    layer.load_state_dict(whole.state_dict())
    for m in (whole, layer):
        with torch.no_grad():  # every token to expert ``hot``
            m.router.weight.zero_()
            m.router.weight[hot].fill_(1.0)
    layer.shard(None)
    x = torch.rand(2, 5, 8, generator=torch.Generator().manual_seed(ctx.rank)).to(dtype) + 1
    counts: dict = {}
    _count_syncs(counts)
    with torch.no_grad():
        ours = layer(x)
    syncs = dict(counts)
    theirs = whole(x)
    return syncs, float((ours.float() - theirs.float()).abs().max())


def test_an_moe_forward_reads_the_split_sizes_once_and_each_local_slice():
    for syncs, _ in zerokit.launch(_moe_forward, 2, 4, 2, torch.float32):
        assert syncs == {"tolist": 2}, syncs  # the all-to-all's split sizes (send and receive), the local slices


def test_expert_ids_past_256_travel_exactly():
    for _, diff in zerokit.launch(_moe_forward, 2, 512, 301, torch.bfloat16):  # 301 is no bf16 number
        assert diff == 0.0


# -- a checkpoint's CUDA RNG states on a machine with another GPU count --------------------------------
@pytest.mark.parametrize("saved, here", [(3, 1), (1, 2)])
def test_cuda_rng_states_restore_per_visible_gpu_when_the_count_differs(monkeypatch, saved, here):
    from zerokit.checkpoint.load import _restore_rng

    restored = []

    def set_rng_state(state, device="cuda"):
        index = device if isinstance(device, int) else torch.device(device).index or 0
        if index >= here:
            raise RuntimeError(f"invalid device ordinal {index}")
        restored.append(index)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: here)
    monkeypatch.setattr(torch.cuda, "set_rng_state", set_rng_state)
    monkeypatch.setattr(torch.cuda.random, "set_rng_state", set_rng_state)
    state = {"cpu": torch.get_rng_state(), "cuda": [torch.zeros(16, dtype=torch.uint8)] * saved}
    with pytest.warns(UserWarning, match=f"RNG states of {saved} GPU"):
        _restore_rng(state)
    assert restored == list(range(min(saved, here)))


# -- the exercises' solutions on NCCL: the ring's order, the buckets' device --------------------------------
SOLUTIONS = Path(__file__).resolve().parents[2] / "solutions"


def _solution(name: str):
    spec = importlib.util.spec_from_file_location(f"solution_{name}", SOLUTIONS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ring_traffic(ctx):
    from zerokit.runtime.p2p_replay import recording

    tensor = torch.arange(10.0) + ctx.rank
    with recording() as posted:
        _solution("01_ring_allreduce").ring_all_reduce(tensor)
    return posted, tensor


@pytest.mark.parametrize("world", [2, 3])
def test_the_ring_solution_cannot_deadlock_under_nccls_ordering(world):
    from zerokit.runtime.p2p_replay import replay

    results = zerokit.launch(_ring_traffic, world)
    expected = sum(torch.arange(10.0) + r for r in range(world))
    assert all(torch.equal(tensor, expected) for _, tensor in results)
    assert replay({rank: posted for rank, (posted, _) in enumerate(results)}) == 4 * world * (world - 1)


def test_the_bucketed_solution_allocates_its_buckets_on_the_parameters_device(monkeypatch):
    solution = _solution("03_bucketed_ddp")
    monkeypatch.setattr(solution.dist, "get_world_size", lambda group=None: 1)
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2)).to("meta")  # the meta device: a GPU's stand-in
    ddp = solution.BucketedDDP(model, bucket_numel=10)
    assert {str(b.device) for b in ddp.buffers} == {"meta"}
