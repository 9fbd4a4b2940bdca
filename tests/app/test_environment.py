"""The environment in the room: the install script, the learner's install, `make lab`, the container recipes.

The install itself runs in CI twice on a fresh clone (``make``'s developer install, then ``.ci/run``'s learner
install in a fresh venv); these tests hold what each command is made of, and start JupyterLab the way ``make lab``
does to see where it is rooted and what it asks.
"""
from __future__ import annotations

import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "tools" / "install.sh"
LAB = ROOT / "tools" / "lab.sh"


def _run(*args, env=None, timeout=60):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=ROOT)


@pytest.mark.parametrize("args, named", [(["--extras", "notebooks,bogus"], "bogus"), (["--colour"], "--colour"),
                                         (["--venv"], "--venv")])
def test_the_install_script_refuses_what_it_does_not_know(args, named):
    done = _run(INSTALL, *args)
    assert done.returncode != 0 and named in done.stderr, done.stderr


def test_an_unreachable_cpu_index_is_not_asked():
    """Where torch's CPU index cannot be reached (as offline), pip gets no index to retry: torch comes from what
    the machine's pip has."""
    with socket.socket() as s:  # a port nothing listens on: refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = _run(INSTALL, "--torch-index-args", env={"ZEROKIT_TORCH_INDEX": f"http://127.0.0.1:{port}/whl/cpu"})
    assert done.returncode == 0 and done.stdout.strip() == "", done
    assert "cannot be reached" in done.stderr
    assert _run(INSTALL, "--torch-index-args", env={"ZEROKIT_TORCH_INDEX": ""}).stdout.strip() == ""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the CPU index is asked for on Linux only")
def test_a_reachable_cpu_index_is_the_extra_index(tmp_path):
    """Where it answers, torch's CPU index is an extra index: pip prefers its 2.13.0+cpu over the default index's
    2.13.0 (the CUDA build and its 16 nvidia packages on Linux)."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "index.html").write_text("<html></html>")
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        done = _run(INSTALL, "--torch-index-args", env={"ZEROKIT_TORCH_INDEX": url})
    finally:
        server.shutdown()
    assert done.stdout.split() == ["--extra-index-url", url], done


def _make_dry(target: str) -> str:
    done = subprocess.run(["make", "-n", "-B", target], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_learner_install_is_the_notebooks_extra_only():
    course = _make_dry("course")
    assert "tools/install.sh --venv .venv --extras notebooks" in course
    assert not re.search(r"test|peers|deepspeed|playwright", course), course
    developer = _make_dry("install")
    assert "--extras test,notebooks,peers" in developer and "torch==2.13.0" not in developer  # pinned in the script
    assert "torch==2.13.0" in INSTALL.read_text()


def test_the_container_recipes_run_the_same_install():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "tools/install.sh --venv" in dockerfile and "--extras notebooks" in dockerfile
    users = re.findall(r"^USER (\S+)", dockerfile, flags=re.M)
    assert users and users[-1] not in ("root", "0"), "the course runs as a user of its own"
    post_build = (ROOT / "binder" / "postBuild")
    assert os.access(post_build, os.X_OK) and "tools/install.sh" in post_build.read_text()
    assert "--extras notebooks" in post_build.read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "tools/install.sh --venv" in ci and "--extras notebooks" in ci


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="tools/lab.sh is a bash script")
def test_make_lab_serves_the_repository_root_without_asking(tmp_path):
    """`make lab`'s JupyterLab: rooted at the repository (a lesson's ../exercises/ link opens), opened at
    notebooks/, its news prompt off, and started as root where the user is root (a container)."""
    pytest.importorskip("jupyterlab")
    port, token = _free_port(), "zerokit-lab-test"
    env = {"PYTHON": sys.executable, "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
           "JUPYTER_DATA_DIR": str(tmp_path / "data"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
           "JUPYTER_PLATFORM_DIRS": "1"}
    log = open(tmp_path / "lab.log", "w")
    server = subprocess.Popen([str(LAB), f"--port={port}", "--no-browser", f"--IdentityProvider.token={token}"],
                              cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env},
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, f"JupyterLab exited:\n{(tmp_path / 'lab.log').read_text()[-3000:]}"
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                assert time.monotonic() < deadline, "JupyterLab did not listen within 120 s"
                time.sleep(0.3)
        auth = {"Authorization": f"token {token}"}

        def get(path):
            with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=auth),
                                        timeout=30) as r:
                return r.read().decode()

        listing = json.loads(get("/api/contents/exercises?content=1"))
        assert listing["type"] == "directory"
        assert {c["name"] for c in listing["content"]} >= {p.name for p in (ROOT / "exercises").glob("*.ipynb")}
        assert json.loads(get("/api/contents/notebooks/00_first_ranks.ipynb?content=0"))["type"] == "notebook"
        page = get("/lab")
        config = json.loads(re.search(r'id="jupyter-config-data"[^>]*>(.*?)</script>', page, re.S).group(1))
        assert config["news"] == {"disabled": True}
        with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/", headers=auth),
                                    timeout=30) as r:
            assert r.url.endswith("/lab/tree/notebooks"), r.url
    finally:
        try:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=10)
        log.close()


def _sum_of_ranks(ctx):
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(t)
    return t.item()


def test_off_linux_the_ranks_are_spawned_and_run(monkeypatch):
    """macOS runs the course with gloo as Linux does, with the ranks spawned (fork is used on Linux only): the
    launcher's choice there, and a spawned launch, run here."""
    import zerokit
    from zerokit.runtime import launch as launch_module

    monkeypatch.setattr(launch_module.sys, "platform", "darwin")
    assert launch_module._choose_start_method(None, "gloo") == "spawn"
    monkeypatch.undo()
    assert zerokit.launch(_sum_of_ranks, 2, start_method="spawn") == [3.0, 3.0]
