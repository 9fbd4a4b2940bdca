"""``model.load_full_state_dict(sd, StateDictOptions(broadcast_from_rank0=True))`` where only rank 0's dict is wrong:
every rank raises the same exception with the same message, and none waits for a broadcast that never comes
(``zerokit.api.fully_shard_state._from_first``). After the error the ranks are still in step: a good load works.

One launch of 2 ranks carries every case; its timeout turns a hang into a failure instead of a stuck suite."""
import pytest
import torch
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions

import zerokit

IN, HID, OUT = 7, 11, 5
BROADCAST = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)


def make():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(IN, HID), nn.Tanh(), nn.Linear(HID, OUT))


def _cases(ctx):
    """Each case: rank 0 passes a wrong dict, the others ``{}``; what each rank raised (type, message)."""
    model = make()
    for block in model.children():
        zerokit.fully_shard(block)
    zerokit.fully_shard(model)
    good = make().state_dict()
    wrong = {"not a dict": [good],
             "not a tensor": {**good, "0.weight": good["0.weight"].tolist()},
             "another shape": {**good, "2.weight": torch.zeros(OUT, HID + 1)}}
    out = {}
    for case, sent in wrong.items():
        try:
            model.load_full_state_dict(sent if ctx.rank == 0 else {}, BROADCAST)
            out[case] = None
        except Exception as e:  # noqa: BLE001 - what each rank raised is the result
            out[case] = (type(e).__name__, str(e))
    keys = model.load_full_state_dict(good if ctx.rank == 0 else {}, BROADCAST)
    back = model.full_state_dict()
    out["good load after"] = (not keys.missing_keys and not keys.unexpected_keys
                              and all(torch.equal(back[k], v) for k, v in good.items()))
    return out


@pytest.fixture(scope="module")
def on_two_ranks():
    return zerokit.launch(_cases, 2, timeout_s=120, heartbeat_s=60)


@pytest.mark.parametrize("case, kind, says", [
    ("not a dict", "TypeError", "rank 0's state_dict is a list, not the whole dict"),
    ("not a tensor", "TypeError", "rank 0's state_dict holds '0.weight' as a list, not a tensor"),
    ("another shape", "RuntimeError", "rank 0's state_dict holds '2.weight' of shape (5, 12), the model (5, 11)"),
])
def test_a_wrong_dict_on_rank_0_raises_the_same_error_on_every_rank(on_two_ranks, case, kind, says):
    raised = [r[case] for r in on_two_ranks]
    assert raised[0] is not None and raised[0][0] == kind and says in raised[0][1], raised
    assert raised[0][1].startswith("model.load_full_state_dict (broadcast_from_rank0=True): "), raised
    assert all(r == raised[0] for r in raised), raised  # the same type and message on every rank


def test_after_the_errors_the_ranks_are_in_step(on_two_ranks):
    assert all(r["good load after"] for r in on_two_ranks)
