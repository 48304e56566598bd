#!/bin/bash
# cost.sh LABEL: 400 req/s for 20 s against nginx, worker CPU before/after
W=$(pgrep -f 'nginx: worker'); B=/tmp/kor-target/release
read -r _ _ _ _ _ _ _ _ _ _ _ _ _ u0 s0 _ < <(cut -d')' -f2- /proc/$W/stat | sed 's/^ /x x /')
ss0=$(cut -d' ' -f1 /proc/$W/schedstat)
out=$(taskset -c 0 nice -n 19 $B/loadgen --url http://127.0.0.1:8081 --direct --rate ${RATE:-400} --duration ${DUR:-20} --warmup 0 --connections 8 --quiet 2>&1)
read -r _ _ _ _ _ _ _ _ _ _ _ _ _ u1 s1 _ < <(cut -d')' -f2- /proc/$W/stat | sed 's/^ /x x /')
ss1=$(cut -d' ' -f1 /proc/$W/schedstat)
n=$(echo "$out" | grep -o 'ok [0-9]*' | awk '{print $2}')
p=$(echo "$out" | awk "/p50 /{getline; print \"p50=\"\$1\" p99=\"\$3}")
echo "$1: ok=$n utime+stime=$(( (u1-u0)+(s1-s0) )) ticks -> $(( ((u1-u0)+(s1-s0))*10000000/n )) ns/req (u=$((u1-u0)) s=$((s1-s0))); schedstat $(( (ss1-ss0)/n )) ns/req; client $p"
