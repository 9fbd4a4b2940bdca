"""What crosses from a submission's process to the grader's: plain data, read back without running any code.

Lifecycle: in the submission's process (:mod:`.isolate`), the measurements of every scenario
(:func:`outcome`) and the plain values the checks read from the namespace (:func:`facts`) are
made plain (:func:`plain`: numbers, strings, bytes, tensors, dtypes, and lists, tuples and dicts
of them; anything else becomes a stand-in carrying its ``repr``) and written with ``torch.save``
(:func:`encode`). In the grader's process :func:`decode` reads them with
``torch.load(weights_only=True)`` — torch's own unpickler for untrusted files, which builds
tensors and those containers and refuses everything else — and puts the stand-ins back
(:class:`Opaque`, ``...``). A pickle can run any code while it is read; one written where a
submission's code ran is read only this way. :func:`namespace` gives the judges the values in place
of the namespace, :func:`scenario_outcome` the measurements or the :class:`~.core.ScenarioError`.
"""
from __future__ import annotations

import io
import numbers
from typing import Any, Dict, Iterable

import torch

from .core import ScenarioError

#: marker keys of the stand-ins (a dict holding one of them is read back as the stand-in)
_OPAQUE, _ELLIPSIS = "__zerokit_opaque__", "__zerokit_ellipsis__"
#: deeper than this, a value is a stand-in
_DEPTH = 64
_REPR_CHARS = 200


class Opaque:
    """A value that was not plain data where it was made: only its ``repr`` came across."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text

    def __eq__(self, other) -> bool:
        return isinstance(other, Opaque) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)


def _stand_in(value) -> dict:
    try:
        text = repr(value)
    except Exception as e:  # noqa: BLE001 - a learner's __repr__ that raises
        text = f"<{type(value).__name__} whose repr raised {type(e).__name__}>"
    return {_OPAQUE: text[:_REPR_CHARS]}


def plain(value, depth: int = 0):
    """``value`` as plain data (see the module's docstring); a stand-in where it is not."""
    if depth > _DEPTH:
        return _stand_in(value)
    if value is None or type(value) in (bool, int, float, str, bytes):
        return value
    if value is Ellipsis:
        return {_ELLIPSIS: True}
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, torch.Tensor):
        if type(value) not in (torch.Tensor, torch.nn.Parameter) or value.layout != torch.strided:
            return _stand_in(value)
        return value.detach().cpu()
    if isinstance(value, (torch.dtype, torch.Size)):
        return value
    if isinstance(value, dict):
        return {plain(k, depth + 1): plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v, depth + 1) for v in value]
    if isinstance(value, tuple):
        return tuple(plain(v, depth + 1) for v in value)
    return _stand_in(value)


def _restored(value):
    if isinstance(value, dict):
        if len(value) == 1 and _OPAQUE in value:
            return Opaque(str(value[_OPAQUE]))
        if len(value) == 1 and _ELLIPSIS in value:
            return ...
        return {_restored(k): _restored(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_restored(v) for v in value]
    if isinstance(value, tuple) and type(value) is tuple:
        return tuple(_restored(v) for v in value)
    return value


def encode(value) -> bytes:
    """``value`` made plain and written as ``torch.save`` writes it."""
    buffer = io.BytesIO()
    torch.save(plain(value), buffer)
    return buffer.getvalue()


def decode(data: bytes):
    """What :func:`encode` wrote, read with torch's weights-only unpickler; raises on anything else."""
    return _restored(torch.load(io.BytesIO(data), map_location="cpu", weights_only=True))


def outcome(value) -> dict:
    """A scenario's measurements, or its :class:`~.core.ScenarioError`, as the wire carries it."""
    if isinstance(value, ScenarioError):
        return {"error": {"kind": value.kind, "message": value.message, "rank": value.rank}}
    return {"value": value}


def scenario_outcome(sent) -> Any:
    """The measurements or the :class:`~.core.ScenarioError` that :func:`outcome` sent."""
    if isinstance(sent, dict) and isinstance(sent.get("error"), dict):
        error = sent["error"]
        rank = error.get("rank")
        return ScenarioError(str(error.get("kind")), str(error.get("message")),
                             rank if isinstance(rank, int) else None)
    if isinstance(sent, dict) and "value" in sent:
        return sent["value"]
    return ScenarioError("error", "the run's measurements came back in no form the grader reads")


def facts(ns: dict, needs: Iterable[str], answers: Iterable[str]) -> Dict[str, Any]:
    """What the judges may read of a namespace: whether each needed name is defined (a stand-in), and the plain
    value of each answer."""
    out: Dict[str, Any] = {name: {_OPAQUE: f"<{name}>"} for name in needs if name in ns}
    out.update({name: plain(ns[name]) for name in answers if name in ns})
    return out


def namespace(sent) -> dict:
    """The judges' namespace in the grader's process: the names :func:`facts` sent, with their values."""
    return dict(sent) if isinstance(sent, dict) else {}
