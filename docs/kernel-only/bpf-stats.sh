#!/bin/bash
# bpf-stats.sh TRACER RATE SECS (as root, from the repository root; EXTRA=flags for the
# tracer): the set-up of ab-tracers.sh, one traced window with --bpf-stats; prints each
# program's runs and run time per request (names cut to 15 characters by the kernel). Each run
# also pays the statistics' two clock reads, which in this VM weigh on the small programs.
set -u
T=$1; RATE=$2; WIN=$3
. "$(dirname "$0")/nginx-setup.sh" st
$T record --pid $NGX --duration $((WIN+30)) --sample-hz 0 --bpf-stats ${EXTRA:-} --out $D/session >$D/t.log 2>&1 &
TP=$!
for k in $(seq 1 100); do grep -q "program ids" $D/t.log 2>/dev/null && break; sleep 0.1; done
sleep 0.5
taskset -c 1 $B/loadgen --url http://127.0.0.1:9301 --direct --rate $RATE --duration $WIN --warmup 0 --connections 128 --quiet --out $D/l.json >/dev/null 2>&1
sleep 0.5
kill -INT $TP; wait $TP
python3 - $D <<'PY'
import json,sys
d=sys.argv[1]
b=json.load(open(d+'/session/breakdown.json'))
n=json.load(open(d+'/l.json'))['ok']
progs=b['cost']['bpf']['programs']
tot=0
for p in sorted(progs,key=lambda p:-p['run_time_ns']):
    if p['run_count']==0: continue
    tot+=p['run_time_ns']
    print(f"{p['name']:<28} runs/req {p['run_count']/n:6.2f}  ns/run {p['run_time_ns']/max(p['run_count'],1):7.0f}  ns/req {p['run_time_ns']/n:7.0f}")
print('total ns/req', round(tot/n), 'requests', n)
PY
kill $NGX $MOCK; wait 2>/dev/null
