"""Partitioning: which blocks of the model each pipeline stage runs.

Lifecycle: every rank builds the whole model (same seed), tensor-parallel-splits it if
``tp`` > 1, then calls :func:`split` with the schedule's shape. The model is read as
ordered *pieces* whose composition is its forward:

- a model with a ``pipeline_pieces()`` method returns ``(first, blocks, last)``, each a
  list of ``(name, module)``: the embeddings (``first``) go to the first stage and the
  final norm and head (``last``) to the last stage, explicitly; the repeated ``blocks``
  are spread over the stages;
- an ``nn.Sequential`` is all blocks.

``partition`` chooses how many blocks each of the ``p·v`` virtual stages gets:

- ``"blocks"``: counts as equal as they can be; when p does not divide the blocks, the first
  n mod p stages hold one more (zerokit's choice: Megatron refuses such a pp unless the first
  and last stages' counts are given; with interleaving every rank gets the same number and each
  of its ``v`` chunks the same share);
- ``"params"``: contiguous, minimising the largest stage's parameter count, embeddings and head
  included;
- a list of counts, one per stage (torchtitan's split points, as counts);
- ``{"first": k, "last": k}`` (either or both): Megatron's
  ``--decoder-first-pipeline-num-layers``/``--decoder-last-pipeline-num-layers``, the rest shared
  evenly by the stages between, which must divide it (:func:`first_last_counts`; no interleaving,
  as Megatron had it). Llama 3 405B trains 126 layers on 16 stages as ``{"first": 7, "last": 7}``:
  the stages that hold the embedding and the head one layer short.

Each rank keeps its chunks as :class:`Stage` modules (the other pieces are dropped)
and :func:`canonical_names` maps every kept parameter to its name in the whole model,
so full parameters gathered from the stages compare with the single-process reference.
A parameter tied across stages (GPT-2's embedding and head) is kept by both stages;
:func:`tied_parameters` lists it so its gradients can be summed between them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple, Union

import torch.nn as nn

Piece = Tuple[str, nn.Module]


@dataclass
class Pieces:
    first: List[Piece]
    blocks: List[Piece]
    last: List[Piece]


class Stage(nn.Module):
    """One virtual stage: its pieces in order; ``forward`` composes them."""

    def __init__(self, index: int, pieces: List[Piece]):
        super().__init__()
        self.index = index
        self.piece_names = [name for name, _ in pieces]
        self.pieces = nn.ModuleList(module for _, module in pieces)

    def forward(self, x):
        for module in self.pieces:
            x = module(x)
        return x


def pieces_of(model: nn.Module) -> Pieces:
    """The model's ordered pieces (see the module docstring)."""
    if hasattr(model, "pipeline_pieces"):
        first, blocks, last = model.pipeline_pieces()
        return Pieces(list(first), list(blocks), list(last))
    if isinstance(model, nn.Sequential):
        return Pieces([], list(model.named_children()), [])
    raise ValueError(f"pipeline parallelism: a {type(model).__name__} can't be split into stages; give the model a "
                     f"pipeline_pieces() method returning (first, blocks, last) lists of (name, module) in forward "
                     f"order, or use an nn.Sequential")


def _params(pieces: Sequence[Piece]) -> int:
    seen, total = set(), 0
    for _, module in pieces:
        for p in module.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel()
    return total


def _balanced(weights: List[int], first: int, last: int, stages: int) -> List[int]:
    """Contiguous counts (≥ 1 each) minimising the largest stage sum, the ends' weights added to stages 0 and S-1."""
    n = len(weights)
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    inf = float("inf")
    # best[s][i]: the smallest possible maximum over stages 0..s-1 holding blocks 0..i-1
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0
    for s in range(1, stages + 1):
        for i in range(s, n - (stages - s) + 1):
            for j in range(s - 1, i):
                load = prefix[i] - prefix[j] + (first if s == 1 else 0) + (last if s == stages else 0)
                value = max(best[s - 1][j], load)
                if value < best[s][i]:
                    best[s][i], cut[s][i] = value, j
    counts, i = [], n
    for s in range(stages, 0, -1):
        j = cut[s][i]
        counts.append(i - j)
        i = j
    return counts[::-1]


def first_last_counts(n: int, stages: int, first=None, last=None, names=("first", "last"),
                      unit: str = "blocks") -> List[int]:
    """Megatron's uneven stages: the first and/or last stage hold ``first``/``last`` of the ``n`` blocks, the others
    share the rest evenly (it must divide; each holds at least one). ``names`` name the two in a ValueError."""
    ends = [(name, value) for name, value in zip(names, (first, last)) if value is not None]
    for name, value in ends:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive whole number")
    if not ends or stages < 2:
        raise ValueError(f"{' and '.join(names)}: uneven first/last stages need at least two stages (there are "
                         f"{stages}) and one of the two counts")
    middle, rest = stages - len(ends), n - sum(value for _, value in ends)
    if middle == 0 and rest == 0:
        return [first, last]
    if middle == 0 or rest < middle or rest % middle:
        given = " and ".join(f"{name}={value}" for name, value in ends)
        raise ValueError(f"{given}: the other {rest} of the {n} {unit} must split evenly over the {middle} other "
                         f"stage(s), at least one each (Megatron's rule)")
    per = rest // middle
    return [first if first is not None else per] + [per] * (stages - 2) + [last if last is not None else per]


def block_counts(pieces: Pieces, ranks: int, chunks: int, partition: Union[str, Sequence[int], dict]) -> List[int]:
    """Blocks per virtual stage (``ranks·chunks`` of them), checked against the model."""
    stages, n = ranks * chunks, len(pieces.blocks)
    if stages > n:
        raise ValueError(f"pipeline parallelism: {stages} stages (pp={ranks} × chunks={chunks}) but the model has "
                         f"only {n} blocks; every stage needs at least one block (lower pp or chunks)")
    if chunks > 1 and (n % ranks or (n // ranks) % chunks):
        raise ValueError(f"chunks={chunks}: the model's {n} blocks must split evenly into pp={ranks} ranks × "
                         f"{chunks} chunks (blocks per rank {n / ranks:g} must be a multiple of chunks)")
    if isinstance(partition, str):
        if partition == "blocks":
            base, extra = divmod(n, stages)
            return [base + (1 if s < extra else 0) for s in range(stages)]
        if partition == "params":
            return _balanced([_params([b]) for b in pieces.blocks], _params(pieces.first), _params(pieces.last),
                             stages)
        raise ValueError(f"partition={partition!r}; allowed: 'blocks', 'params', a list of block counts per stage, "
                         f"or {{'first': k, 'last': k}}")
    if isinstance(partition, dict):
        unknown = sorted(set(partition) - {"first", "last"})
        if unknown or not partition:
            raise ValueError(f"partition={partition!r}: the first and last stages' block counts are keys 'first' "
                             f"and/or 'last' (Megatron's --decoder-first/last-pipeline-num-layers)")
        if chunks > 1:
            raise ValueError(f"partition={partition!r}: uneven first/last stages run without interleaving "
                             f"(chunks={chunks}); give every virtual stage's count as a list instead")
        return first_last_counts(n, stages, partition.get("first"), partition.get("last"),
                                 names=("partition['first']", "partition['last']"))
    counts = list(partition)
    if len(counts) != stages or any(not isinstance(c, int) or isinstance(c, bool) or c < 1 for c in counts) \
            or sum(counts) != n:
        raise ValueError(f"partition={counts!r}: give {stages} positive block counts (one per stage) summing to "
                         f"the model's {n} blocks")
    return counts


def split(model: nn.Module, ranks: int, chunks: int, rank: int,
          partition: Union[str, Sequence[int], dict] = "blocks") -> Dict[int, Stage]:
    """This rank's stages ``{virtual stage: Stage}``: chunk c of rank r is stage c·p + r."""
    pieces = pieces_of(model)
    counts = block_counts(pieces, ranks, chunks, partition)
    stages, start, out = ranks * chunks, 0, {}
    for s, count in enumerate(counts):
        if s % ranks == rank:
            mine = list(pieces.blocks[start:start + count])
            if s == 0:
                mine = pieces.first + mine
            if s == stages - 1:
                mine = mine + pieces.last
            out[s] = Stage(s, mine)
        start += count
    return out


def canonical_names(model: nn.Module) -> Dict[int, str]:
    """id(parameter) -> its name in the whole model (the first name, as ``named_parameters`` gives it)."""
    return {id(p): name for name, p in model.named_parameters()}


def tied_parameters(model: nn.Module, ranks: int, chunks: int,
                    partition: Union[str, Sequence[int], dict] = "blocks") -> Dict[str, List[int]]:
    """Parameters that more than one *rank* holds: canonical name -> the pipeline ranks that hold it."""
    names = canonical_names(model)
    holders: Dict[str, set] = {}
    for r in range(ranks):
        for stage in split(model, ranks, chunks, r, partition).values():
            for p in stage.parameters():
                holders.setdefault(names[id(p)], set()).add(r)
    return {name: sorted(rs) for name, rs in holders.items() if len(rs) > 1}
