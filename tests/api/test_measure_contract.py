"""``zerokit.measure`` on torch's own wrappers: torch DDP's buckets, the host bytes and the blocks' time; FSDP2's
collectives.

The model, the launches and the helpers: ``api_contracts.py`` (one launch per world size carries the checks
of every file here, ``conftest.py``)."""
import zerokit

from api_contracts import Blocks, Odd, _measure_fsdp2


def test_measure_sees_torch_ddps_buckets_host_bytes_and_the_blocks_time(on_two_ranks):
    collectives, seconds = on_two_ranks[0]["measure torch ddp"]
    trained = sum(p.numel() for p in Odd().parameters() if p.requires_grad)
    assert sum(r["payload_bytes"] for r in collectives if r["op"] == "all_reduce" and r["phase"] == "backward") \
        == 4 * trained  # every trainable parameter's gradient, once, in fp32
    assert seconds > 0
    host, table = on_two_ranks[0]["measure offload"]
    assert host > 0 and "host (measured, MiB)" in table and "block time (measured)" in table


def test_measure_sees_fsdp2s_collectives():
    calls = zerokit.launch(_measure_fsdp2, 2)[0]
    units = 1 + len(Blocks().blocks)  # every block and the root
    # one reduce-scatter per unit in backward; FSDP2's gathers are recorded too (before: "no collectives")
    assert calls.get("reduce_scatter", 0) == units and calls.get("all_gather", 0) > 0, calls
