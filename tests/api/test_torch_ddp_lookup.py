"""The lookup of torch DDP's parameters (zerokit.api.sharded_optimizer._in_torch_ddp) walks every object the garbage
collector tracks; it asks each object's type, so objects whose attribute access warns stay quiet."""
import warnings

import torch.distributed as dist

from zerokit.api.sharded_optimizer import _in_torch_ddp


def test_walking_the_live_objects_reads_no_deprecated_attribute():
    assert dist.reduce_op is not None  # torch's deprecated enum object, alive in every process that imports torch
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = _in_torch_ddp()
    assert not [w for w in caught if "reduce_op" in str(w.message)], [str(w.message) for w in caught]
    assert found == set()  # no torch DDP alive here
