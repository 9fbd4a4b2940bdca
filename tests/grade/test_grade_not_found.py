"""`zerokit grade` on a name that names nothing says where it looked and where the exercises are listed."""
import pytest

from zerokit.cli import main


@pytest.mark.parametrize("where, arg, words", [
    ("repository", "99", ["no exercise numbered 99", "--list"]),
    ("elsewhere", "02", ["exercise's number", "no exercises/ folder here", "repository's root", "--list"]),
    ("repository", "missing.ipynb", ["no such file or folder: missing.ipynb", "--list"]),
])
def test_a_name_that_names_nothing_points_to_the_list(where, arg, words, tmp_path, monkeypatch, capsys):
    if where == "elsewhere":
        monkeypatch.chdir(tmp_path)
    assert main(["grade", arg]) == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words), err
