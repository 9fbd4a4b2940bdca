"""Write the learner's bundle: the course without its answers, ``dist/zerokit-course-<version>.tar.gz``.

Lifecycle (``make release``):

1. the files are git's: ``git ls-files`` lists what the repository tracks, read from the working tree as it
   is now (so nothing untracked — no ``.venv``, ``build/``, ``dist/``, executed copies or learners' work —
   can slip in; a tracked file deleted in the working tree is left out and named);
2. :data:`LEFT_OUT` is dropped: ``solutions/`` (the answers), ``tests/`` (the project's tests: they grade the
   solutions and hold planted wrong answers) and ``.ci/`` (the project's CI, which runs those tests);
   ``zerokit/grade/`` stays whole — the grader's references are what a learner's ``zerokit grade`` and
   ``zerokit.grade(globals(), EXERCISE)`` hold their work against;
3. the rest goes into one gzipped tar under ``zerokit-course-<version>/``, ``<version>`` being
   ``pyproject.toml``'s; the archive is the same bytes for the same files (sorted members, owner root,
   modes 644 or 755, every time stamp that of the last commit);
4. the bundle is checked before it is written: it holds notebooks/, exercises/, zerokit/, README.md and the
   Makefile, and nothing under a left-out folder.

    python tools/release.py                 # dist/zerokit-course-0.1.0.tar.gz
    python tools/release.py --out /tmp/x    # into another folder

Only the standard library: it runs before any install (``make release`` uses the system's Python).
"""
from __future__ import annotations

import argparse
import gzip
import io
import re
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: top-level folders left out of the learner's bundle, and why
LEFT_OUT = {
    "solutions/": "the answers",
    "tests/": "the project's tests (they grade the solutions and plant wrong answers)",
    ".ci/": "the project's CI, which runs tests/",
}
#: what a learner's bundle must hold
REQUIRED = ("notebooks/", "exercises/", "zerokit/", "README.md", "Makefile")


def version(root: Path = ROOT) -> str:
    """``[project] version`` of ``pyproject.toml``."""
    text = (root / "pyproject.toml").read_text()
    project = re.search(r"(?ms)^\[project\]\s*$(.*?)(?=^\[|\Z)", text)
    found = project and re.search(r'(?m)^version\s*=\s*"([^"]+)"\s*$', project.group(1))
    if not found:
        raise SystemExit("release: pyproject.toml has no [project] version = \"...\"")
    return found.group(1)


def tracked_files(root: Path = ROOT) -> list:
    """Every path git tracks, relative to ``root``, sorted."""
    out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    return sorted(p for p in out.decode().split("\0") if p)


def left_out(path: str) -> bool:
    return any(path.startswith(prefix) for prefix in LEFT_OUT)


def bundle_files(root: Path = ROOT) -> tuple:
    """``(files in the bundle, tracked files missing from the working tree)``."""
    keep, missing = [], []
    for path in tracked_files(root):
        if left_out(path):
            continue
        (keep if (root / path).is_file() else missing).append(path)
    return keep, missing


def check(files: list) -> None:
    """Refuse a bundle without what a learner needs, or with anything left out."""
    absent = [r for r in REQUIRED if not any(f == r or (r.endswith("/") and f.startswith(r)) for f in files)]
    leaked = [f for f in files if left_out(f)]
    if absent or leaked:
        raise SystemExit(f"release: the bundle would lack {absent} and hold {leaked[:5]}")


def commit_time(root: Path = ROOT) -> int:
    out = subprocess.run(["git", "log", "-1", "--format=%ct"], cwd=root, capture_output=True, text=True)
    return int(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else 0


def write(out_dir: Path, root: Path = ROOT) -> Path:
    """Write the bundle into ``out_dir``; return its path."""
    files, missing = bundle_files(root)
    check(files)
    for path in missing:
        print(f"release: {path} is tracked but not in the working tree: left out", file=sys.stderr)
    name = f"zerokit-course-{version(root)}"
    mtime = commit_time(root)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in files:
            data = (root / path).read_bytes()
            info = tarfile.TarInfo(f"{name}/{path}")
            info.size, info.mtime, info.uid, info.gid, info.uname, info.gname = len(data), mtime, 0, 0, "root", "root"
            info.mode = 0o755 if (root / path).stat().st_mode & 0o111 else 0o644
            tar.addfile(info, io.BytesIO(data))
    if out_dir.exists() and not out_dir.is_dir():
        raise SystemExit(f"release: --out {out_dir} is a file; give a folder (it is made if missing)")
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{name}.tar.gz"
    with open(target, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=mtime) as gz:
        gz.write(buffer.getvalue())
    return target


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="the folder to write into (default dist/)")
    args = parser.parse_args(argv)
    target = write(args.out)
    with tarfile.open(target) as tar:
        count = len(tar.getmembers())
    print(f"{target}: {count} files, {target.stat().st_size / 2**20:.1f} MiB "
          f"(left out: {', '.join(LEFT_OUT)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
