#!/usr/bin/env bash
# Builds the container image of backends/kubernetes/deploy/Dockerfile and smoke-tests it: the CLI,
# a flash-checkpoint round trip of a PyTorch state dict through the installed Python client, and a
# short live job (two nodes, real DDP trainers, one SIGKILLed and restored) run as the image's user.
#
#   scripts/image.sh [TAG]            (default localhost/goodput-trainer:dev)
#
# With Docker or Podman installed, `docker build -f backends/kubernetes/deploy/Dockerfile .` is the
# same build. This script uses buildah (a Debian package) with chroot isolation, so it runs on a bare
# machine, inside a container or as a CI step without a daemon. Where no registry is reachable (only
# a Debian mirror), the debian:bookworm base is made with debootstrap. Not part of scripts/test.sh:
# it downloads and compiles for ~10 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${1:-localhost/goodput-trainer:dev}
export BUILDAH_ISOLATION=chroot
if ! command -v buildah >/dev/null; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq buildah debootstrap
fi
if ! buildah inspect --type image docker.io/library/debian:bookworm >/dev/null 2>&1 &&
   ! buildah pull -q docker.io/library/debian:bookworm >/dev/null 2>&1; then
  echo "image: no registry reachable; making debian:bookworm with debootstrap" >&2
  root=$(mktemp -d)
  debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian >/dev/null
  base=$(buildah from scratch)
  cp -a "$root/." "$(buildah mount "$base")/"
  buildah umount "$base" >/dev/null
  buildah commit -q "$base" docker.io/library/debian:bookworm >/dev/null
  buildah rm "$base" >/dev/null
  rm -rf "$root"
fi
buildah bud --isolation chroot --network host -f backends/kubernetes/deploy/Dockerfile -t "$tag" .

# Smoke test, in a working container of the image, as its user (1000).
c=$(buildah from "$tag")
trap 'buildah rm "$c" >/dev/null' EXIT
buildah run "$c" -- goodput --help >/dev/null
buildah run "$c" -- python3 - <<'PY'
import tempfile, torch
from goodput.checkpoint import FlashCheckpoint
c = FlashCheckpoint("image-smoke", storage_dir=tempfile.mkdtemp(), shm_prefix="/goodput-image-smoke")
model = torch.nn.Linear(8, 8)
c.save(7, {"model": model.state_dict(), "step": 7})
c.persist()
c.remove_memory()
step, back = c.load()
assert step == 7 and all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), back["model"].values()))
print("image: flash checkpoint round trip through storage:", c.last_load["tier"])
PY
work=$(mktemp -d)
cat >"$work/job.json" <<'EOF'
{"job": "image-smoke", "nodes": 2,
 "command": ["python3", "/tmp/work/train_ddp.py", "--step-seconds", "0.02", "--hidden", "32"],
 "env": {"OMP_NUM_THREADS": "1"}, "total_steps": 60, "step_time": "20ms",
 "policy": {"checkpoint": {"policy": "flash", "every_steps": 20, "persist_every": 1}},
 "heartbeat_interval": "250ms", "heartbeat_timeout": "5s", "hang_timeout": "30s"}
EOF
echo '[{"fault": "kill-process", "slot": 1, "at_step": 30}]' >"$work/faults.json"
buildah run --user 0 "$c" -- sh -c 'mkdir -p /tmp/work && chmod 777 /tmp/work'
buildah copy --chown 1000:1000 "$c" examples/pytorch/train_ddp.py "$work/job.json" "$work/faults.json" /tmp/work/ >/dev/null
rm -rf "$work"
out=$(buildah run "$c" -- sh -c 'cd /tmp/work && goodput run job.json --faults faults.json --run-dir run 2>&1')
echo "$out" | tail -5
echo "$out" | grep -q "ended: completed" || { echo "image: the live job did not complete" >&2; exit 1; }
echo "$out" | grep -q "failures             1: software_error 1" || { echo "image: the killed trainer was not seen" >&2; exit 1; }
echo "image: $tag works (CLI, Python client, a live job with a killed trainer restored)"
