"""``zerokit.apply_checkpointing`` on a user's model with ``nn.MultiheadAttention``: torch's gradients, one
recomputed forward per block.

The model, the launches and the helpers: ``api_contracts.py`` (one launch per world size carries the checks
of every file here, ``conftest.py``)."""

import pytest
import torch

import zerokit

from api_contracts import Blocks, batch, loss_of


@pytest.mark.parametrize("policy", ["every", "selective"])
def test_activation_checkpointing_on_a_users_model_with_multihead_attention(policy):
    torch.manual_seed(0)
    plain = Blocks()
    torch.manual_seed(0)
    model = Blocks()
    handle = zerokit.apply_checkpointing(model, policy)
    x, y = batch(0)
    loss_of(plain, x, y).backward()
    loss_of(model, x, y).backward()
    assert max(float((p.grad - q.grad).abs().max()) for p, q in zip(model.parameters(), plain.parameters())) < 1e-6
    assert handle.recomputed_forwards == 3  # one per block (selective: each block's nn.MultiheadAttention)
    zerokit.remove_checkpointing(model)
