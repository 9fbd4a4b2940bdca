"""A checkpoint on disk: the directory, its shard files, the manifest, the checksums, and the atomic rename.

Layout of a checkpoint directory ``D``::

    D/manifest.json                      rank 0: format, world size, stage, strategy, unit layout, sha256 per file
    D/shard-00000-of-00002.pt            rank r's shard (torch.save of tensors, numbers, strings only)

Lifecycle of a save (:mod:`.save`): the ranks write into ``.D.tmp-<token>`` next to ``D``;
when every rank has finished (a barrier), rank 0 hashes the files, writes the manifest,
and renames the temporary directory to ``D`` (a previous ``D`` is first renamed aside to
``.D.old-<token>`` and removed after). A crash before that rename leaves ``D`` as it was;
only the hidden temporary directory remains, removed by the next save of ``D``.

Lifecycle of a load: :func:`read_manifest` (the directory and the manifest exist and are
zerokit's), :func:`read_shard` (the file's sha256 equals the manifest's, then
``torch.load(weights_only=True)``: a checkpoint never executes code).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import torch

FORMAT = "zerokit-checkpoint"
VERSION = 2
MANIFEST = "manifest.json"


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded: missing, corrupted, or made for another model."""


def shard_name(rank: int, world: int) -> str:
    return f"shard-{rank:05d}-of-{world:05d}.pt"


def temporary(final: Path, token: str) -> Path:
    return final.parent / f".{final.name}.tmp-{token}"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_file(path: Path, payload) -> None:
    """torch.save ``payload`` to ``path`` and flush it to the disk."""
    with open(path, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())


def remove_stale(final: Path) -> None:
    """Temporary and set-aside directories of ``final`` left by a crashed save."""
    for stale in final.parent.glob(f".{final.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)


def commit(tmp: Path, final: Path, manifest: dict) -> None:
    """Rank 0, every shard written: hash them, write the manifest, rename ``tmp`` to ``final``."""
    manifest["files"] = {name: sha256(tmp / name) for name in sorted(manifest["files"])}
    with open(tmp / MANIFEST, "w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(tmp)
    old = None
    if final.exists():
        old = final.parent / f".{final.name}.old-{tmp.name.rsplit('-', 1)[-1]}"
        os.rename(final, old)
    os.rename(tmp, final)
    _fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def read_manifest(directory) -> dict:
    final = Path(directory)
    if not final.is_dir():
        aside = sorted(final.parent.glob(f".{final.name}.old-*")) if final.parent.is_dir() else []
        hint = f"; a previous checkpoint was set aside as {aside[-1]} by a save that crashed" if aside else ""
        raise CheckpointError(f"checkpoint directory {str(final)!r} does not exist{hint}")
    path = final / MANIFEST
    if not path.is_file():
        raise CheckpointError(f"{str(path)!r} is missing: {str(final)!r} is not a complete zerokit checkpoint")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{str(path)!r} is not valid JSON ({e}): the manifest is corrupted") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{str(path)!r} is not a zerokit checkpoint manifest (format {FORMAT!r} expected)")
    if manifest.get("version") != VERSION:
        raise CheckpointError(f"{str(path)!r} has version {manifest.get('version')!r}; this zerokit reads "
                              f"version {VERSION}")
    expected = {shard_name(r, manifest["world_size"]) for r in range(manifest["world_size"])}
    if set(manifest.get("files", {})) != expected:
        raise CheckpointError(f"{str(path)!r} lists files {sorted(manifest.get('files', {}))}, expected "
                              f"{sorted(expected)} for world size {manifest['world_size']}")
    return manifest


def read_shard(directory, manifest: dict, rank: int) -> dict:
    """Rank ``rank``'s shard file, its checksum verified, loaded with ``weights_only=True``."""
    name = shard_name(rank, manifest["world_size"])
    path = Path(directory) / name
    if not path.is_file():
        raise CheckpointError(f"{str(path)!r} is missing from the checkpoint")
    found = sha256(path)
    if found != manifest["files"][name]:
        raise CheckpointError(f"{str(path)!r} is corrupted: its sha256 is {found[:16]}…, the manifest says "
                              f"{manifest['files'][name][:16]}…")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # an unpickling error: something that is not plain tensors and numbers
        raise CheckpointError(f"{str(path)!r} cannot be loaded with weights_only=True: {e}") from None
