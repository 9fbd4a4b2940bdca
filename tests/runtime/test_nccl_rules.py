"""What changes on NCCL, checked on the CPU: the device a user's own group puts collectives on, the emulated
link's refusal, and the hang report's wording (NCCL returns at enqueue)."""
import sys

import pytest

import torch
import torch.distributed as dist

import zerokit
from zerokit.runtime import context, hang, link, replicas


@pytest.fixture
def users_nccl_group(monkeypatch):
    """A process this test pretends is rank 1 of 2 in an NCCL group the user made (torchrun, LOCAL_RANK=1)."""
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(context, "_current", None)


def test_a_users_nccl_group_puts_the_context_on_the_ranks_gpu(users_nccl_group, monkeypatch):
    ctx = context.current()
    assert (ctx.rank, ctx.world_size, ctx.backend, ctx.device) == (1, 2, "nccl", torch.device("cuda", 1))
    built = {}
    monkeypatch.setattr("zerokit.runtime.mesh.Mesh.build",
                        classmethod(lambda cls, rank, world, device_type="cpu", parallel=None:
                                    built.setdefault("device_type", device_type)))
    ctx.mesh
    assert built["device_type"] == "cuda"


def test_a_rank_left_on_gpu_0_is_told_to_call_set_device(users_nccl_group, monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    with pytest.raises(RuntimeError, match=r"torch\.cuda\.set_device\(1\)"):
        context.current()


def test_the_replica_check_gathers_on_the_backends_device_not_the_models(users_nccl_group, monkeypatch):
    seen = []

    class Gathered(Exception):
        pass

    def all_gather(output, input, group=None, tag=""):
        seen.extend([output.device, input.device])
        raise Gathered

    monkeypatch.setattr(replicas, "backend_device", lambda backend: torch.device("meta"))
    monkeypatch.setattr(replicas.comm, "all_gather", all_gather)
    with pytest.raises(Gathered):
        replicas.check_replicas(torch.nn.Linear(2, 2))  # a model on the CPU, a group on NCCL
    assert seen == [torch.device("meta")] * 2


def test_an_emulated_link_is_refused_on_nccl_with_the_reason():
    with pytest.raises(ValueError, match=r"link='10gbe' cannot be emulated on backend 'nccl': .*CUDA stream"):
        link.check_backend(link.resolve("10gbe"), "nccl")
    link.check_backend(link.resolve("10gbe"), "gloo")
    link.check_backend(None, "nccl")


def test_train_refuses_a_link_on_nccl_before_any_rank_starts(monkeypatch):
    monkeypatch.setattr(sys.modules["zerokit.train"], "choose_backend", lambda backend, world_size: "nccl")
    started = []
    monkeypatch.setattr(sys.modules["zerokit.train"], "launch", lambda *a, **k: started.append(1))
    with pytest.raises(ValueError, match="cannot be emulated on backend 'nccl'"):
        zerokit.train(zerokit.tiny_gpt(n_layer=1), "ddp", world_size=2, steps=1, reference=False, link="10gbe")
    assert not started


def test_set_link_in_a_users_nccl_group_is_refused(users_nccl_group):
    with pytest.raises(ValueError, match="cannot be emulated on backend 'nccl'"):
        link.set_link("pcie")
    assert link.clock() is None


def test_the_hang_report_says_last_enqueued_on_nccl():
    left = hang.decode(hang.encode("out", 14, "all_reduce", "backward", "1024 float32 on dp, step 3"))
    waiting = hang.decode(hang.encode("in", 9, "all_gather", "forward", ""))
    assert hang.summarise({0: left, 1: waiting}) == (
        "rank 0 is not in a collective (last left all_reduce #14 of backward (1024 float32 on dp, step 3)); "
        "rank 1 is in all_gather #9 of forward")
    on_nccl = hang.summarise({0: left, 1: waiting}, "nccl")
    assert "rank 0 is past the last collective it enqueued, all_reduce #14 of backward" in on_nccl
    assert "rank 1 is past the last collective it enqueued, all_gather #9 of forward" in on_nccl
    assert "not in a collective" not in on_nccl and "queued on the GPU" in on_nccl


def test_the_reference_runs_on_the_ranks_kind_of_device(monkeypatch):
    from zerokit.train import reference_device

    monkeypatch.setattr(sys.modules["zerokit.train"], "choose_backend", lambda backend, world_size: "nccl")
    assert reference_device(None, 2) == torch.device("cuda", 0)
    monkeypatch.setattr(sys.modules["zerokit.train"], "choose_backend", lambda backend, world_size: "gloo")
    assert reference_device(None, 2) == torch.device("cpu")


def test_the_host_step_takes_the_ranks_share_of_the_cores_on_a_gpu_machine(monkeypatch):
    from zerokit.offload.host_optimizer import host_threads

    monkeypatch.setattr("os.cpu_count", lambda: 16)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert host_threads(torch.device("cuda", 1)) == 8
    assert host_threads(torch.device("cpu")) is None
