"""CPU offload (ZeRO-Offload, arXiv 2101.06840): model states that rest on the host instead of the device.

One module per idea: :mod:`.transfers` (every device↔host copy, counted in a transfer
ledger), :mod:`.host_optimizer` (fp32 master, Adam's states and the step on the host),
:mod:`.param_offload` (ZeRO-3 parameter shards resting on the host, fetched per gather),
:mod:`.zero_hooks` (the ``offload`` option of ``zero1``/``zero2``/``zero3`` and the few
hooks those strategies call).

On a CPU-only machine the "device" is a separately accounted pool of the same RAM: the
copies are real copies into distinct buffers, so the ledgers show the bytes each side
holds and the bytes and copies that cross, exactly; they cannot show PCIe time.
"""
from __future__ import annotations

from .transfers import DIRECTIONS, TransferLedger, ledger  # noqa: F401

OFFLOADS = ("none", "optimizer", "params")
