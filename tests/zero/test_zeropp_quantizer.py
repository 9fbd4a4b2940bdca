"""ZeRO++'s quantizer next to DeepSpeed's: its kernels' refusal on the CPU, read from DeepSpeed itself."""
import os
import subprocess
import sys

import pytest
import torch

from zerokit.strategies import get

# --- DeepSpeed's quantizer on the CPU --------------------------------------------------------------

_LOAD_QUANTIZER = """
from deepspeed.ops.op_builder import QuantizerBuilder
try:
    QuantizerBuilder().load()
except Exception as e:
    print("RAISED", type(e).__name__, e, sep="|")
else:
    print("LOADED")
"""


def _load_deepspeed_quantizer_on_the_cpu_accelerator() -> str:
    """What DeepSpeed's own ``QuantizerBuilder().load()`` does under ``DS_ACCELERATOR=cpu``, in a fresh process
    (the accelerator is chosen once per process, at DeepSpeed's first import)."""
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    done = subprocess.run([sys.executable, "-c", _LOAD_QUANTIZER], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_deepspeed_quantizer_kernels_refuse_the_cpu_and_the_peer_names_their_reason():
    """DeepSpeed's qwZ and qgZ load ``QuantizerBuilder`` (CUDA kernels); on the CPU accelerator the load raises,
    and ``deepspeed-zeropp`` refuses both options quoting what DeepSpeed raised."""
    pytest.importorskip("deepspeed")
    from zerokit.peers.deepspeed import NO_CPU_QUANTIZER

    outcome = _load_deepspeed_quantizer_on_the_cpu_accelerator()
    assert outcome.startswith("RAISED|"), f"DeepSpeed's quantizer loaded on the CPU accelerator: {outcome}"
    _, kind, message = outcome.split("|", 2)
    assert kind == "ValueError" and message, outcome
    assert message in NO_CPU_QUANTIZER, (message, NO_CPU_QUANTIZER)
    if torch.cuda.is_available():
        return  # on a GPU the peer runs DeepSpeed's CUDA kernels: nothing to refuse
    for key in ("zero_quantized_weights", "zero_quantized_gradients"):
        with pytest.raises(ValueError, match=key) as refused:
            get("deepspeed-zeropp").resolve_options({key: True})
        assert message in str(refused.value)
