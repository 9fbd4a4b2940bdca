#!/bin/sh
# The full benchmark: every `zerokit bench` suite with its defaults, one after the other, each
# suite's output (tables, ratios, load average, noise) in OUT/SUITE.txt, the JSON of those that
# write one in OUT/SUITE.json, the pictures in benchmarks/ (scaling.png, model-size.png,
# link-bandwidth.png). Run it alone on a quiet machine: the timings are only as good as the
# machine is idle. 18.8 minutes on 2 cores (2026-12-03).
#
#   sh benchmarks/run_all.sh [OUT]        # OUT defaults to out/bench
set -e
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
out=${1:-out/bench}
mkdir -p "$out"
start=$(date +%s)
for suite in ddp zero offload pipeline scaling sizes link cp_ep; do
    case $suite in
        pipeline|scaling) json="" ;;
        *) json="--json $out/$suite.json" ;;
    esac
    t0=$(date +%s)
    # shellcheck disable=SC2086
    $python -m zerokit.cli bench $suite --quiet $json > "$out/$suite.txt"
    echo "$suite: $(( $(date +%s) - t0 )) s" | tee -a "$out/times.txt"
done
echo "all suites: $(( $(date +%s) - start )) s" | tee -a "$out/times.txt"
