#!/usr/bin/env bash
# Installs the Debian packages Goodput builds and tests with. Safe to run again: it only calls
# apt-get when something is missing. Needs root (or sudo).
set -euo pipefail
packages=(g++ cmake ninja-build pkg-config git sqlite3
          libboost1.81-all-dev libsqlite3-dev nlohmann-json3-dev libcli11-dev libeigen3-dev doctest-dev
          libssl-dev openssl ca-certificates libxxhash-dev libyaml-cpp-dev python3-yaml pybind11-dev python3-dev python3-torch python3-numpy python3-kubernetes
          chromium clang gdb)  # gdb: native stacks of a hung trainer
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
sudo=""
if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
