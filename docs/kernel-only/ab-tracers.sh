#!/bin/bash
# ab-tracers.sh RATE WINDOW_S ROUNDS ARM... (as root, from the repository root, after
# `cargo build --release -p tracer -p loadgen -p gateway`): nginx (one worker, CPU 0) before
# mock-upstream (CPU 1, 0 ms), loadgen on CPU 1 at RATE req/s open loop over 128 keep-alive
# connections. Each round runs every ARM once, in rotating order, WINDOW_S seconds each.
# An ARM is "none" (untraced) or a tracer binary, optionally with flags: "DIR/tracer:--flag".
# Copy each tracer binary to its own directory first: the directory names the arm. One line a
# window: arm, client p50 and p99 (us, from the scheduled send), 2xx, nginx CPU (master and
# worker, /proc) per request, CPU 0's busy share, the tracer's CPU seconds (it runs unpinned).
set -u
RATE=$1; WIN=$2; ROUNDS=$3; shift 3; ARMS=("$@")
. "$(dirname "$0")/nginx-setup.sh" run
cpu() { local t=0; for p in $(pgrep -P $NGX) $NGX; do t=$((t + $(cut -d')' -f2- /proc/$p/stat | awk '{print $12+$13}'))); done; echo $t; }
busy0() { awk '/^cpu0 /{print $2+$3+$4+$7+$8, $2+$3+$4+$5+$6+$7+$8}' /proc/stat; }
taskset -c 1 $B/loadgen --url http://127.0.0.1:9301 --direct --rate $RATE --duration 3 --warmup 0 --connections 128 --quiet >/dev/null 2>&1
for r in $(seq 1 $ROUNDS); do
  n=${#ARMS[@]}
  for i in $(seq 0 $((n-1))); do
    arm=${ARMS[$(( (i + r) % n ))]}
    TP=""
    if [ "$arm" != none ]; then
      bin=${arm%%:*}; flags=""; [ "$bin" != "$arm" ] && flags=${arm#*:}
      $bin record --pid $NGX $flags --duration $((WIN+30)) --sample-hz 0 --out $D/s.$r.$i >$D/t.$r.$i.log 2>&1 &
      TP=$!
      for k in $(seq 1 100); do grep -q "program ids" $D/t.$r.$i.log 2>/dev/null && break; sleep 0.1; done
      sleep 0.5
    fi
    c0=$(cpu); read b0 t0 < <(busy0)
    taskset -c 1 $B/loadgen --url http://127.0.0.1:9301 --direct --rate $RATE --duration $WIN --warmup 0 --connections 128 --quiet --out $D/l.$r.$i.json >/dev/null 2>&1
    c1=$(cpu); read b1 t1 < <(busy0)
    tc="-"
    if [ -n "$TP" ]; then
      tc=$(cut -d')' -f2- /proc/$TP/stat | awk '{printf "%.2f", ($12+$13)/100}')
      kill -INT $TP; wait $TP
    fi
    python3 - "$arm" $D/l.$r.$i.json $c0 $c1 $b0 $b1 $t0 $t1 "$tc" <<'PY'
import json,sys
arm,f,c0,c1,b0,b1,t0,t1,tc=sys.argv[1:]
j=json.load(open(f))
def find(d,keys):
    for k in keys:
        if k in d: return d[k]
    return None
lat=j.get('latency_us') or j.get('latency') or {}
ok=j.get('ok') or j.get('status',{}).get('ok') or 0
p50=find(lat,['p50','p50_us']); p99=find(lat,['p99','p99_us'])
cpu_us=(int(c1)-int(c0))*1e4/max(ok,1)
busy=(float(b1)-float(b0))/max(float(t1)-float(t0),1)
name=arm if arm=='none' else arm.split('/')[-2]+(':'+arm.split(':',1)[1] if ':' in arm else '')
print(f"{name:>24} p50 {p50} p99 {p99} ok {ok} cpu/req {cpu_us:.1f}us busy0 {busy:.2f} tracer {tc}")
PY
  done
done
kill $NGX $MOCK; wait 2>/dev/null
