"""``zerokit.DistributedDataParallel`` on torch's contract: wrapping twice is refused with the reason.

The model, the launches and the helpers: ``api_contracts.py`` (one launch per world size carries the checks
of every file here, ``conftest.py``)."""


def test_double_wrapping_is_refused_with_the_reason(on_two_ranks):
    refused = on_two_ranks[0]["refused"]
    assert set(refused) == {"DDP(DDP(m))", "DDP(torch DDP(m))", "initialize(DDP(m))"}
    assert all("reduce them again" in message for message in refused.values()), refused
