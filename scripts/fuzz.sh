#!/usr/bin/env bash
# Fuzzes the parsers with libFuzzer (Debian clang) under ASan+UBSan: traces, policy JSON, event-log
# lines, checkpoint files, the live master's agent API, job specs, the history importers (Kubernetes, sacct, PAI 2020, AcmeTrace), and the Ray dashboard's and the
# Kubernetes API's answers (watch frames, pods, nodes, YAML). Seeds come from the shipped traces and policies, a replay's event log
# and a real checkpoint. First replays every saved regression input, then fuzzes each target for
# $1 seconds (default 60). A crash leaves its input in build-fuzz/crashes/<target>/: copy it to
# fuzz/regressions/<target>/ with the fix so it is replayed from then on. Last, the accounting's
# property test runs on many random traces, and the live master under many seeds of `goodput vopr`.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
CXX=clang++ CC=clang cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGOODPUT_FUZZ=ON >/dev/null
cmake --build build-fuzz
corpus=build-fuzz/corpus
mkdir -p "$corpus"/{trace,policy,event,checkpoint,api,backend,http,import}
cp traces/*.jsonl "$corpus/trace/"
cp examples/policies/*.json "$corpus/policy/"
# Job specs, and the Ray dashboard's answers as the fixtures show them (read from shared/, not copied in).
cp examples/pytorch/job.json "$corpus/backend/job.json"
cp examples/pytorch/ps-job.json "$corpus/backend/ps-job.json"
cp examples/unified/*.json "$corpus/backend/"
/usr/bin/python3 -c 'import json, sys, yaml; json.dump(yaml.safe_load(open(sys.argv[1])), sys.stdout)' \
  examples/unified/goodputjob.yaml > "$corpus/backend/goodputjob.json"
if [ -d ../shared/data/ray ]; then cp ../shared/data/ray/*.json "$corpus/backend/"; fi
if [ -d ../shared/data/k8s ]; then cp ../shared/data/k8s/*.json ../shared/data/k8s/*.ndjson ../shared/data/k8s/*.yaml "$corpus/backend/"; fi
# History importers: the first byte picks one ('0' Kubernetes objects and watch streams, '1' sacct,
# '2' PAI 2020 instances, '3' an AcmeTrace job trace, '4' AcmeTrace's cluster summary).
if [ -d ../shared/data/k8s ]; then
  for f in ../shared/data/k8s/*.json ../shared/data/k8s/*.ndjson; do { printf 0; cat "$f"; } > "$corpus/import/k8s-$(basename "$f")"; done
fi
printf '1JobID|State|ExitCode|NNodes|NodeList|Start|End\n7|NODE_FAIL|0:0|2|gpu[01-02]|2026-03-01T00:00:00|2026-03-01T02:00:00\n7.0|FAILED|1:0|1|gpu01|2026-03-01T00:00:00|2026-03-01T01:00:00\n8|OUT_OF_MEMORY|0:125|1|gpu03|2026-03-01T03:00:00|2026-03-01T04:00:00\n' \
  > "$corpus/import/sacct"
printf '2af72,worker,i0,w0,id0,Failed,2081336.0,2083889.0,m1\naf72,worker,i1,w1,id0,Terminated,2081336.0,2083000.5,m2\nb0,ps,i2,w2,id1,Waiting,,,\n' \
  > "$corpus/import/pai2020"
printf '3job_id,user,node_num,gpu_num,cpu_num,mem_per_pod_GB,shared_mem_per_pod,type,state,submit_time,start_time,end_time,fail_time,stop_time,duration,queue,gpu_time\ndlctk,uf794,8,64,960,1000,100.0,Other,FAILED,2023-05-17 11:00:58+00:00,2023-05-17 11:01:08+00:00,2023-05-17 11:01:16+00:00,2023-05-17 11:01:16+00:00,,18,10.0,1152.0\n' \
  > "$corpus/import/acme"
if [ -f ../shared/data/acmetrace/cluster_summary.csv ]; then { printf 4; cat ../shared/data/acmetrace/cluster_summary.csv; } > "$corpus/import/acme-summary"; fi
# Event lines and a checkpoint file, made by the regular build (scripts/build.sh build).
if [ -x build/goodput ]; then
  rm -f "$corpus/events.db"
  build/goodput replay traces/small-2048gpu-7d.jsonl --events "$corpus/events.db" >/dev/null
  build/goodput report "$corpus/events.db" --format events | sort -u -t'"' -k8,8 | head -40 |
    split -l 1 - "$corpus/event/line-"
fi
if [ -f build/python/goodput/checkpoint.py ]; then
  PYTHONPATH=build/python /usr/bin/python3 - "$corpus/checkpoint" <<'PY'
import sys, tempfile, glob, shutil, torch
from goodput.checkpoint import FlashCheckpoint
d = tempfile.mkdtemp()
c = FlashCheckpoint("fuzzseed", storage_dir=d, shm_prefix="/goodput-fuzzseed")
c.save(3, {"w": torch.arange(64, dtype=torch.float32), "step": 3, "name": "seed"})
c.persist(); c.remove_memory()
for f in glob.glob(d + "/*/*.ckpt"): shutil.copy(f, sys.argv[1] + "/seed.ckpt")
PY
fi
# Agent API sessions: register two nodes, heartbeat them through a start, take and finish shards.
tr='{"restart":0,"phase":"training","step":5,"saves":1,"saved_step":5,"storage_steps":[5],"loaded":{"step":0,"tier":"none","ns":1}}'
printf '%s\n' $'/v1/register\t{"name":"a"}' $'/v1/register\t{"name":"b"}' \
  $'/v1/heartbeat\t{"node":0,"trainer":'"$tr"'}' $'/v1/heartbeat\t{"node":1,"trainer":'"$tr"'}' \
  $'/v1/shards/next\t{"node":0,"restart":0}' $'/v1/shards/complete\t{"node":0,"restart":0,"step":5,"shards":[0]}' \
  $'/v1/exit\t{"node":1,"trainer":{"restart":0,"phase":"exited","exit":{"code":1,"signal":0,"reason":"x","age_ms":3}}}' \
  $'/v1/inject\t{"fault":"hang","slot":0}' '/status' '/metrics' > "$corpus/api/session"
# A session through a pre-flight node check (the word "check" turns the check on): results, a failed
# link, then an operator's re-check. A round's id is the virtual clock when it starts (100 ms a line).
printf '%s\n' $'/v1/register\t{"name":"a","check_port":7001}' $'/v1/register\t{"name":"b","check_port":7002}' \
  $'/v1/heartbeat\t{"node":0}' $'/v1/heartbeat\t{"node":1}' \
  $'/v1/heartbeat\t{"node":0,"check":{"round":1,"id":200000000,"compute_mflops":900,"compute_ok":true,"link_ok":false,"error":"e"}}' \
  $'/v1/heartbeat\t{"node":1,"check":{"round":1,"id":200000000,"compute_mflops":300,"compute_ok":true,"link_ok":true,"link_mb_per_s":5}}' \
  $'/v1/heartbeat\t{"node":0,"check":{"round":2,"id":600000000,"compute_mflops":900,"compute_ok":false}}' \
  $'/v1/check\t{"slots":[1],"fault":"slow:2","reason":"r"}' $'/v1/heartbeat\t{"node":1}' $'/v1/check\t{"all":true,"now":true}' \
  $'/v1/check\t{"name":5}' '/status' > "$corpus/api/check-session"
# Raw requests as clients send them: a register with the token, a chunked heartbeat, a body that
# claims more than it has, a header over the limit.
printf 'POST /v1/register HTTP/1.1\r\nHost: m\r\nAuthorization: Bearer t\r\nContent-Type: application/json\r\nContent-Length: 14\r\n\r\n{"name":"n0"}\n' \
  > "$corpus/http/register"
printf 'POST /v1/heartbeat HTTP/1.1\r\nHost: m\r\nAuthorization: Bearer t\r\nTransfer-Encoding: chunked\r\n\r\n9\r\n{"node":0\r\n1\r\n}\r\n0\r\n\r\n' \
  > "$corpus/http/chunked"
printf 'POST /v1/inject HTTP/1.1\r\nAuthorization: Bearer t\r\nContent-Length: 99999\r\n\r\n{"fault":"hang"' > "$corpus/http/short-body"
printf 'GET /status HTTP/1.1\r\nX-Big: %s\r\n\r\n' "$(head -c 17000 /dev/zero | tr '\0' a)" > "$corpus/http/big-header"
printf 'GET /metrics HTTP/1.0\r\n\r\n' > "$corpus/http/metrics"
status=0
for t in trace policy event checkpoint api backend http import; do
  mkdir -p "build-fuzz/crashes/$t"
  if compgen -G "fuzz/regressions/$t/*" >/dev/null; then
    echo "fuzz_$t: replaying fuzz/regressions/$t"
    build-fuzz/fuzz_$t fuzz/regressions/$t/* || status=1
  fi
  echo "fuzz_$t: ${seconds}s"
  build-fuzz/fuzz_$t -max_total_time="$seconds" -max_len=65536 -timeout=10 -print_final_stats=1 \
    -artifact_prefix="build-fuzz/crashes/$t/" "$corpus/$t" 2>&1 |
    grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb|==[0-9]+==ERROR|SUMMARY|INFO: Seed)|Done [0-9]+ runs" || true
  if compgen -G "build-fuzz/crashes/$t/*" >/dev/null; then
    echo "fuzz_$t: FOUND CRASHES in build-fuzz/crashes/$t/"
    for c in build-fuzz/crashes/$t/*; do  # the input and its stack, so a CI log is enough to fix it
      echo "--- $c:"; head -c 2000 "$c" | cat -v; echo
      build-fuzz/fuzz_$t "$c" 2>&1 | grep -E "^ +#[0-9]+ .* in |ERROR|SUMMARY|runtime error" | head -30 || true
    done
    status=1
  fi
done
# The accounting's property test (tests/property_test.cpp) on many more random traces than the test
# command runs: about 1,000 traces a second here, so $seconds x 500 traces, from a seed that moves
# with the date so every long campaign covers new ground (the seed is printed to reproduce it).
if [ -x build/tests/goodput_tests ]; then
  seed=$(( $(date +%s) / 86400 * 1000000 ))
  echo "accounting property test: $(( seconds * 500 )) random traces from seed $seed"
  GOODPUT_PROPERTY_TRACES=$(( seconds * 500 )) GOODPUT_PROPERTY_SEED=$seed \
    build/tests/goodput_tests -tc='property:*' || status=1
fi
# The live master under seeded simulation (goodput vopr): about 30 seeds a second here, so $seconds x
# 15 seeds, from a seed that moves with the date (a failure prints the command that reproduces it).
if [ -x build/goodput ]; then
  seed=$(( $(date +%s) / 86400 * 1000000 ))
  build/goodput vopr --seed $seed --seeds $(( seconds * 15 )) --quiet || status=1
fi
exit $status
