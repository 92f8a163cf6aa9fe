#!/usr/bin/env bash
# The test command: install, build, run every test; then the same suite again under
# AddressSanitizer + UndefinedBehaviorSanitizer (GOODPUT_SANITIZE=0 skips that second pass);
# then a short fuzzing run of every parser.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh build
ctest --test-dir build --output-on-failure -j2
if [ "${GOODPUT_SANITIZE:-1}" != 0 ]; then
  # The Python extension is left out here: loading an ASan library into /usr/bin/python3 needs LD_PRELOAD games.
  BUILD_TYPE=Debug scripts/build.sh build-asan -DGOODPUT_SANITIZE=ON -DGOODPUT_PYTHON=OFF
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 GOODPUT_VOPR_SEEDS=40 \
    ctest --test-dir build-asan --output-on-failure -j2
fi
# A short libFuzzer run of every parser (GOODPUT_FUZZ_SECONDS=0 skips it; scripts/fuzz.sh 3600 for long runs).
if [ "${GOODPUT_FUZZ_SECONDS:-20}" != 0 ]; then
  scripts/fuzz.sh "${GOODPUT_FUZZ_SECONDS:-20}"
fi
