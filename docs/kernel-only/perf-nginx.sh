#!/bin/bash
# perf-nginx.sh TRACER|none RATE SECS OUT (as root, from the repository root): the set-up of
# ab-tracers.sh, untraced or with TRACER attached (--sample-hz 0), and `perf record -g` at
# 4999 Hz on nginx's worker thread for SECS-2 seconds of the load, into OUT.
set -u
T=$1; RATE=$2; WIN=$3; OUT=$4
. "$(dirname "$0")/nginx-setup.sh" pf
TP=""
if [ "$T" != none ]; then
$T record --pid $NGX --duration $((WIN+30)) --sample-hz 0 --out $D/session >$D/t.log 2>&1 &
TP=$!
for k in $(seq 1 100); do grep -q "program ids" $D/t.log 2>/dev/null && break; sleep 0.1; done
sleep 0.5
fi
W=$(pgrep -P $NGX)
taskset -c 1 $B/loadgen --url http://127.0.0.1:9301 --direct --rate $RATE --duration $WIN --warmup 0 --connections 128 --quiet --out $D/l.json >/dev/null 2>&1 &
LG=$!
sleep 1
perf record -q -g -F 4999 -t $W -o $OUT -- sleep $((WIN-2)) >/dev/null 2>&1
wait $LG
[ -n "$TP" ] && { kill -INT $TP; wait $TP; }
kill $NGX $MOCK; wait 2>/dev/null
