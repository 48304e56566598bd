#!/bin/bash
# apache-capture.sh TRACER RATE SECS (as root, from the repository root, after
# `cargo build --release -p tracer -p loadgen -p gateway`): mock-upstream (CPU 1, 0 ms) on
# 127.0.0.1:9310 and Debian's apache2 before it on 9311, configured as testproc::proxy does
# (event MPM, two children, mod_proxy_http), its files in a new directory under
# /dev/shm/ab; one traced window of loadgen at RATE req/s with --bpf-stats and --raw-data.
# Prints breakdown.json's kernel_only counts, sys_exit_writev's runs and ns a run, and how
# many upstream writevs (writev DATA records starting "POST ") hold their whole header block.
set -u
T=$1; RATE=$2; WIN=$3
B=${BIN:-target/release}; M=/usr/lib/apache2/modules
mkdir -p /dev/shm/ab; D=$(mktemp -d /dev/shm/ab/apache.XXXX)
taskset -c 1 $B/mock-upstream --listen 127.0.0.1:9310 --delay-ms 0 >/dev/null 2>&1 &
MOCK=$!
cat > $D/apache2.conf <<CONF
ServerRoot $D
ServerName 127.0.0.1
Listen 127.0.0.1:9311
PidFile $D/apache2.pid
DefaultRuntimeDir $D
Mutex pthread default
ErrorLog $D/error.log
DocumentRoot $D
User www-data
Group www-data
LoadModule mpm_event_module $M/mod_mpm_event.so
LoadModule authz_core_module $M/mod_authz_core.so
LoadModule proxy_module $M/mod_proxy.so
LoadModule proxy_http_module $M/mod_proxy_http.so
StartServers 2
ServerLimit 2
ThreadsPerChild 16
MaxRequestWorkers 32
MinSpareThreads 16
MaxSpareThreads 32
ProxyPass / http://127.0.0.1:9310/
CONF
taskset -c 0 apache2 -f $D/apache2.conf -DFOREGROUND >/dev/null 2>&1 &
AP=$!
for k in $(seq 1 100); do ss -ltn | grep -q 127.0.0.1:9311 && break; sleep 0.1; done
$T record --pid $AP --duration $((WIN+30)) --sample-hz 0 --bpf-stats --out $D/session --raw-data $D/raw.data >$D/t.log 2>&1 &
TP=$!
for k in $(seq 1 100); do grep -q "program ids" $D/t.log 2>/dev/null && break; sleep 0.1; done
sleep 0.5
taskset -c 1 $B/loadgen --url http://127.0.0.1:9311 --direct --rate $RATE --duration $WIN --warmup 0 --connections 32 --quiet >/dev/null 2>&1
sleep 0.5
kill -INT $TP; wait $TP
python3 - $D <<'PY'
import json,struct,sys
d=sys.argv[1]
b=json.load(open(d+'/session/breakdown.json'))
k=b['kernel_only']
print('client_requests', k['client_requests'], 'upstream_requests', k['upstream_requests'], 'unsupported', k['unsupported'])
for p in b['cost']['bpf']['programs']:
    if p['name']=='sys_exit_writev':
        print(f"sys_exit_writev runs {p['run_count']} ns/run {p['run_time_ns']/max(p['run_count'],1):.0f}")
raw=open(d+'/raw.data','rb').read()
ups=whole=0
for i in range(0,len(raw),560):  # abi::DataEvent: Event (40 bytes), tgid, captured, bytes
    sub=struct.unpack_from('<H',raw,i+14)[0]; cap=struct.unpack_from('<I',raw,i+44)[0]
    data=raw[i+48:i+48+cap]
    if sub==6 and data.startswith(b'POST '):  # abi::syscall::WRITEV
        ups+=1; whole+=b'\r\n\r\n' in data
print('upstream writevs', ups, 'holding their whole header block', whole)
PY
kill $AP $MOCK; wait 2>/dev/null
