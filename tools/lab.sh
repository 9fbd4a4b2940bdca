#!/usr/bin/env bash
# The course in JupyterLab, as `make lab` opens it:
# - served from the repository's root, the file browser opened at notebooks/: a lesson's links to ../exercises/
#   and ../solutions/ open inside Lab;
# - on 127.0.0.1 only; as root too (a container's user): --allow-root is added when the user is root;
# - JupyterLab's news prompt and its update check off (LabApp.news_url=None): the course asks nothing at start.
# Any other argument goes to JupyterLab (e.g. --port=8899 --no-browser).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
allow=()
[ "$(id -u)" -eq 0 ] && allow=(--allow-root)
exec "$python" -m jupyterlab --ip 127.0.0.1 --ServerApp.root_dir="$root" --LabApp.default_url=/lab/tree/notebooks \
  --LabApp.news_url=None --LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate "${allow[@]}" "$@"
