"""``zerokit.parallelize_module``: torch's styles and ``nn.MultiheadAttention`` by heads, and your tensor-parallel
model under a DP wrapper on a dp × tp mesh.

The model, the launches and the helpers: ``api_contracts.py`` (one launch per world size carries the checks
of every file here, ``conftest.py``)."""

import pytest

import zerokit

from api_contracts import _grid


def test_parallelize_module_takes_torchs_styles_and_multihead_attention_by_heads(more_on_two_ranks):
    ranks = [r["tensor parallel"] for r in more_on_two_ranks]
    for losses, weights, head_diff, refused in ranks:
        assert all(abs(ours - theirs) < 1e-6 for ours, theirs in losses), losses
        assert max(weights) < 1e-6, weights  # the heads' averaged attention weights, as torch returns them
        assert head_diff < 1e-6, head_diff  # a replicated parameter after every step's update
        assert "use_local_output" in refused
    assert ranks[0][0] == ranks[1][0]  # every tp rank computes the same loss


@pytest.mark.parametrize("wrapper", ["ddp", "fully_shard"])
def test_your_tensor_parallel_model_under_a_dp_wrapper_on_a_dp_by_tp_mesh(wrapper):
    for rank in zerokit.launch(_grid, 4, wrapper):
        assert all(abs(ours - theirs) < 1e-6 for ours, theirs in rank), rank
