#!/usr/bin/env bash
# Install zerokit with torch's CPU build: the one install step of `make`, the Dockerfile and Binder.
#
#   tools/install.sh [--venv DIR] [--extras LIST] [--python PY]
#
#   --venv DIR     create DIR as a virtual environment (if it is not one yet) and install into it;
#                  without it, install into PY's own environment (a container image's, Binder's)
#   --extras LIST  the package's extras, comma-separated: `notebooks` is the learner's install (the course in
#                  JupyterLab), `test,notebooks,peers,site` the developer's (`make test`: pytest, the browser tests,
#                  DeepSpeed, the site's Sphinx). Default: notebooks
#   --python PY    the interpreter that creates the venv, or whose environment is installed into (default python3)
#   --torch-index-args   print the pip arguments that point at torch's CPU index (none when it cannot be reached)
#                  and stop
#   -- SPEC...     more requirements installed beside the package (pins: deepspeed==0.19.8)
#
# torch is pinned (2.13.0). From the default index, `pip install torch` on Linux resolves to the CUDA build and its
# nvidia and triton packages (about 3 GB); torch's CPU index (ZEROKIT_TORCH_INDEX, by default
# https://download.pytorch.org/whl/cpu) serves the CPU build (about 180 MiB), whose version 2.13.0+cpu pip prefers
# over the index's 2.13.0. The index is asked for only when it answers within 3 s: where it cannot be reached (an
# offline mirror, a wheel folder in PIP_FIND_LINKS), pip installs from what it has, with no retries to wait out.
# ZEROKIT_TORCH_INDEX= (empty) never asks it. macOS's wheels on the default index are CPU builds already.
set -euo pipefail

venv="" extras="notebooks" python="${PYTHON:-python3}" only_index=0
while [ $# -gt 0 ]; do
  case "$1" in
    --venv) venv="${2:?--venv needs a directory}"; shift 2 ;;
    --extras) extras="${2?--extras needs a list (e.g. notebooks)}"; shift 2 ;;
    --python) python="${2:?--python needs an interpreter}"; shift 2 ;;
    --torch-index-args) only_index=1; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "tools/install.sh: unknown argument '$1' (allowed: --venv DIR, --extras LIST, --python PY)" >&2; exit 2 ;;
  esac
done
for extra in ${extras//,/ }; do
  case "$extra" in
    notebooks|test|peers|site) ;;
    *) echo "tools/install.sh: unknown extra '$extra' in --extras (allowed: notebooks, test, peers, site)" >&2; exit 2 ;;
  esac
done

root="$(cd "$(dirname "$0")/.." && pwd)"
if [ -n "$venv" ] && [ "$only_index" -eq 0 ]; then
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  python="$venv/bin/python"
fi

TORCH="torch==2.13.0"
index_args=()
torch_index="${ZEROKIT_TORCH_INDEX-https://download.pytorch.org/whl/cpu}"
if [ -n "$torch_index" ] && [ "$(uname -s)" = "Linux" ]; then
  if "$python" - "$torch_index" <<'PROBE'
import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=3).close()
except Exception as e:
    print(f"torch's CPU index {sys.argv[1]} cannot be reached ({type(e).__name__}): installing torch from the "
          "configured indexes and wheel folders", file=sys.stderr)
    sys.exit(1)
PROBE
  then
    index_args=(--extra-index-url "$torch_index")
  fi
fi
if [ "$only_index" -eq 1 ]; then
  echo "${index_args[@]}"
  exit 0
fi

"$python" -m pip install -q --upgrade pip
"$python" -m pip install -q "${index_args[@]}" "$TORCH"
spec="$root"
[ -n "$extras" ] && spec="$root[$extras]"
# torch stays the one just installed: the pin is repeated so that no extra can move it
"$python" -m pip install -q "${index_args[@]}" -e "$spec" "$TORCH" "$@"
"$python" - <<'EOF'
import torch
build = "CUDA " + torch.version.cuda if torch.version.cuda else "CPU"
print(f"torch {torch.__version__} ({build} build) installed")
EOF
