"""The offload copies' stream order, checked on the CPU with a recording side stream.

On CUDA, :mod:`zerokit.offload.streams` orders a side stream of device↔host copies with the
compute stream. A missing wait is a race a CPU run never shows, so these tests put a
recorder in the place of :func:`zerokit.offload.streams.side_stream` inside a rank and
check the rules on what it saw, for ZeRO-2 ``offload_optimizer`` and ZeRO-3 ``offload_param``
with a persistence threshold (so that persistent parameters on the device sit next to
shards resting on the host), bf16, two micro-batches per step:

- the side stream is made for the rank's device, never for a tensor's;
- every host buffer a copy touches was allocated by the stream (pinned on CUDA);
- before a copy touches a device tensor, the side stream waited for the compute stream
  and that tensor was kept alive for it (since the compute stream last waited on the side);
- after a copy to the device, the compute stream waits for the side stream (naming that
  tensor) before the side stream takes more work from the compute stream.
"""
import pytest
import torch

import zerokit


class RecordingStream:
    """Stands in for :class:`zerokit.offload.streams.SideStream` on the CPU: does the copies, logs every call."""

    def __init__(self, device, log):
        self.device, self.log = device, log
        log.append(("stream", str(device)))

    def host_buffer(self, shape, dtype):
        t = torch.empty(shape, dtype=dtype)
        self.log.append(("pinned", t.untyped_storage().data_ptr()))
        return t

    def after_compute(self, tensors=()):
        self.log.append(("after_compute", {t.untyped_storage().data_ptr() for t in tensors}))

    def copy(self, dst, src, direction):
        device_side, host_side = (src, dst) if direction == "d2h" else (dst, src)
        self.log.append(("copy", direction, device_side.untyped_storage().data_ptr(),
                         host_side.untyped_storage().data_ptr()))
        dst.copy_(src)

    def before_compute(self, tensors=()):
        self.log.append(("before_compute", {t.untyped_storage().data_ptr() for t in tensors}))

    def synchronize(self):
        self.log.append(("synchronize",))


def _offload_steps(ctx, config):
    from zerokit.offload import streams

    log = []
    streams.side_stream = lambda device: RecordingStream(device, log)
    work = zerokit.tiny_gpt(vocab=64, seq_len=16, d_model=32, n_layer=2, n_head=2, batch_size=4)
    model = work.build_model()
    engine, _, _, _ = zerokit.initialize(model=model, config=config)
    for step in range(2):
        for micro in range(2):
            x, y = work.batch(2 * step + micro)
            engine.backward(work.loss(engine(x), y))
            engine.step()
    return str(ctx.device), log


CONFIGS = {
    "zero2 offload_optimizer": {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}},
    "zero3 offload_param + persistence": {"zero_optimization": {
        "stage": 3, "offload_param": {"device": "cpu"}, "stage3_param_persistence_threshold": 100}},
}


@pytest.fixture(scope="module")
def logs():
    out = {}
    for name, zero in CONFIGS.items():
        config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "bf16": {"enabled": True},
                  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, **zero}
        out[name] = zerokit.launch(_offload_steps, 1, config)[0]
    return out


@pytest.mark.parametrize("name", list(CONFIGS))
def test_offload_copies_follow_the_stream_rules(logs, name):
    device, log = logs[name]
    streams = [entry[1] for entry in log if entry[0] == "stream"]
    assert streams and all(s == device for s in streams), (streams, device)
    pinned = {entry[1] for entry in log if entry[0] == "pinned"}
    copies = [entry for entry in log if entry[0] == "copy"]
    assert {"d2h", "h2d"} <= {c[1] for c in copies}
    waited: set = set()  # device tensors the side stream waited for since the compute stream last waited on it
    owed: set = set()  # device tensors copied in whose before_compute has not come yet
    for entry in log:
        kind = entry[0]
        if kind == "after_compute":
            assert not owed, f"the side stream took more work before the compute stream waited for {owed}"
            waited |= entry[1]
        elif kind == "before_compute":
            owed -= entry[1]
            waited.clear()
        elif kind == "copy":
            _, direction, device_side, host_side = entry
            assert device_side in waited, f"{direction} copy touched a device tensor the side stream never waited for"
            assert host_side in pinned, f"{direction} copy through a host buffer that is not pinned"
            if direction == "h2d":
                owed.add(device_side)
    assert not owed, f"the compute stream never waited for the copies into {owed}"
