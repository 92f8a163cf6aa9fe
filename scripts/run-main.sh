#!/usr/bin/env bash
# The main job: install, build, then replay the shipped 7-day trace under the default policy and
# print its goodput report, compare policies on the 54-day Llama 3 trace, and finish with a short
# live run: a real 2-node PyTorch DDP job supervised by `goodput run`, one trainer killed with
# SIGKILL mid-run, and the goodput report of what happened. Its event log stays in runs/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh build
echo
./build/goodput replay traces/small-2048gpu-7d.jsonl --policy examples/policies/flash-diagnose.json
echo
./build/goodput compare traces/llama3-405b-54d.jsonl \
  --policy examples/policies/flash-diagnose.json --policy examples/policies/restart-all.json --runs 100
echo
echo "Live: examples/pytorch/job.json on this machine, with examples/pytorch/faults.json injected"
./build/goodput run examples/pytorch/job.json --faults examples/pytorch/faults.json \
  --run-dir "runs/ddp-example-$(date +%Y%m%d-%H%M%S)"
