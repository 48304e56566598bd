#!/bin/bash
# cost2.sh LABEL PID PORT: 400 req/s x 10 s, process CPU (all threads) from /proc/PID/stat
P=$2; B=/tmp/kor-target/release
t() { cut -d')' -f2- /proc/$P/stat | awk '{print $12+$13}'; }
a=$(t); out=$(taskset -c 0 nice -n 19 $B/loadgen --url http://127.0.0.1:$3 --direct --rate 400 --duration 10 --warmup 0 --connections 8 --quiet 2>&1); b=$(t)
n=$(echo "$out" | grep -o 'ok [0-9]*' | awk '{print $2}')
echo "$1: ok=$n ticks=$((b-a)) -> $(( (b-a)*10000000/n )) ns/req load=$(cut -d' ' -f1 /proc/loadavg)"
