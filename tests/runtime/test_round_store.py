"""The store of a rendezvous round (zerokit/runtime/torchrun.py ``_round_store``): rank 0 serves one and publishes
its port and round id in the agent's store; another rank may read the previous round's entry first, whose port a
store of something else answers by now (the port taken again). It must not join that store: it checks the round id
there after connecting and reads the entry again."""
import datetime

import pytest
import torch.distributed as dist

from zerokit.runtime import torchrun

TIMEOUT = datetime.timedelta(seconds=30)


def _a_stale_round(monkeypatch):
    """The agent's store whose round entry is the previous round's: it names a port at which another store
    answers now. Returns (agent's store, the store at that port)."""
    agent = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True)
    taken = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    agent.set(torchrun.ROUND_STORE_KEY, f"{taken.port} {'0' * 32}")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(agent.port))
    monkeypatch.setattr(torchrun, "_agent_store", None)
    monkeypatch.setattr(torchrun, "_round_id", "")
    return agent, taken


def test_a_rank_that_reads_the_previous_rounds_entry_joins_this_rounds_store(monkeypatch):
    agent, taken = _a_stale_round(monkeypatch)
    real, rounds = dist.TCPStore, []

    def store(host, port, *args, **kwargs):
        """torch's store; once rank 1 has connected to the stale port, this round's rank 0 publishes its own."""
        made = real(host, port, *args, **kwargs)
        if port == taken.port and not kwargs.get("is_master") and not rounds:
            rounds.append(torchrun._round_store(0, TIMEOUT))
            rounds.append(torchrun._round_id)
        return made

    monkeypatch.setattr(dist, "TCPStore", store)
    joined = torchrun._round_store(1, TIMEOUT)
    own, round_id = rounds
    assert joined.port == own.port != taken.port  # this round's store, not the one at the stale entry's port
    assert torchrun._round_id == round_id
    joined.set("from-rank-1", "x")
    assert own.get("from-rank-1") == b"x"
    assert not taken.check(["from-rank-1"])


def test_a_rank_fails_naming_the_port_when_no_rounds_store_comes(monkeypatch):
    agent, taken = _a_stale_round(monkeypatch)
    with pytest.raises(RuntimeError, match=f"port {taken.port} .* does not hold round 0+ "):
        torchrun._round_store(1, datetime.timedelta(seconds=2))
