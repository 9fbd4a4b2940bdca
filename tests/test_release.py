"""``make release``: the learner's bundle holds the course and not its answers (tools/release.py)."""
from __future__ import annotations

import importlib.util
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _release():
    spec = importlib.util.spec_from_file_location("release", ROOT / "tools" / "release.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _members(path: Path) -> dict:
    with tarfile.open(path) as tar:
        return {m.name: (m, tar.extractfile(m).read()) for m in tar.getmembers()}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    release = _release()
    path = release.write(tmp_path_factory.mktemp("dist"))
    return release, path, _members(path)


def test_the_bundle_holds_the_course_and_none_of_the_answers_or_tests(bundle):
    release, path, members = bundle
    top = f"zerokit-course-{release.version()}"
    assert path.name == f"{top}.tar.gz"
    names = [n.removeprefix(f"{top}/") for n in members]
    assert all(n.startswith(f"{top}/") for n in members)
    for needed in ("notebooks/", "exercises/", "zerokit/"):
        assert any(n.startswith(needed) for n in names), needed
    assert {"README.md", "Makefile", "pyproject.toml", "exercises/02_naive_ddp.ipynb",
            "zerokit/grade/exercises/naive_ddp.py"} <= set(names)  # the grader's references stay: the self-check
    assert not [n for n in names if n.startswith(("solutions/", "tests/", ".ci/", "build/", "dist/", ".venv/"))]
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc") or ".egg-info/" in n]


def test_the_bundle_is_gits_files_as_they_are_in_the_working_tree(bundle):
    release, _, members = bundle
    top = f"zerokit-course-{release.version()}/"
    tracked = [p for p in release.tracked_files() if not p.startswith(("solutions/", "tests/", ".ci/"))]
    assert sorted(n.removeprefix(top) for n in members) == sorted(p for p in tracked if (ROOT / p).is_file())
    member, data = members[top + "README.md"]
    assert data == (ROOT / "README.md").read_bytes() and member.mode == 0o644
    for name, (member, _) in members.items():  # the executable bit is kept, nothing else of the machine's
        executable = (ROOT / name.removeprefix(top)).stat().st_mode & 0o111
        assert member.mode == (0o755 if executable else 0o644) and member.uname == "root", name


def test_the_same_files_give_the_same_bytes(bundle, tmp_path):
    release, path, _ = bundle
    assert release.write(tmp_path).read_bytes() == path.read_bytes()


def _repo(tmp_path: Path, files: dict) -> Path:
    root = tmp_path / "repo"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "add", "."], cwd=root, check=True)
    return root


COURSE = {"pyproject.toml": '[project]\nname = "zerokit"\nversion = "9.9"\n', "README.md": "r", "Makefile": "m",
          "notebooks/01.ipynb": "{}", "exercises/01.ipynb": "{}", "zerokit/__init__.py": "",
          "solutions/01.py": "answer", "tests/test_x.py": "", ".ci/run": ""}


def test_untracked_and_deleted_files_stay_out_and_a_bundle_without_the_course_is_refused(tmp_path, capsys):
    release = _release()
    root = _repo(tmp_path, COURSE)
    (root / "build").mkdir()
    (root / "build" / "junk.txt").write_text("untracked")
    (root / "notes.txt").write_text("untracked")
    (root / "README.md").write_text("edited, not committed")
    names = _members(release.write(tmp_path / "out", root))
    assert sorted(n.split("/", 1)[1] for n in names) == sorted(
        ["pyproject.toml", "README.md", "Makefile", "notebooks/01.ipynb", "exercises/01.ipynb", "zerokit/__init__.py"])
    assert names["zerokit-course-9.9/README.md"][1] == b"edited, not committed"

    (root / "exercises" / "01.ipynb").unlink()  # tracked, gone from the working tree
    with pytest.raises(SystemExit, match=r"lack \['exercises/'\]"):
        release.write(tmp_path / "out", root)

    (tmp_path / "a-file").write_text("")
    (root / "exercises" / "01.ipynb").write_text("{}")
    with pytest.raises(SystemExit, match="--out .* is a file"):
        release.write(tmp_path / "a-file", root)


def test_make_release_runs_the_tool():
    out = subprocess.run(["make", "-n", "release"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "tools/release.py" in out
