#!/bin/bash
# ab.sh MODE...: for each mode (base|count|capture) run cost.sh, with bpftrace attached for count/capture
W=$(pgrep -f 'nginx: worker')
for m in "$@"; do
  busy=$(pgrep -f '/tmp/ci1/' | wc -l)
  if [ $m != base ]; then
    BPFTRACE_STRLEN=200 taskset -c 0 bpftrace cost-$m.bt $W > bt-$m.out 2>/dev/null & bp=$!
    for i in $(seq 50); do grep -q Attaching bt-$m.out && break; sleep 0.2; done
  fi
  RATE=${RATE:-400} DUR=${DUR:-10} ./cost.sh "$m ci1procs=$busy load=$(cut -d' ' -f1 /proc/loadavg)"
  if [ $m != base ]; then
    bt=$(cut -d')' -f2- /proc/$bp/stat | awk '{print $12+$13}')
    kill -INT $bp; wait $bp; echo "   bpftrace cpu ticks $bt, out lines $(wc -l < bt-$m.out)"
  fi
done
