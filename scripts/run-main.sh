#!/usr/bin/env bash
# The main job: install, build, then replay the shipped 7-day trace under the default policy and
# print its goodput report, followed by the policy comparison on the 54-day Llama 3 trace.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh build
echo
./build/goodput replay traces/small-2048gpu-7d.jsonl --policy examples/policies/flash-diagnose.json
echo
./build/goodput compare traces/llama3-405b-54d.jsonl \
  --policy examples/policies/flash-diagnose.json --policy examples/policies/restart-all.json --runs 100
