#!/bin/bash
# Id-less joins, measured: one proxy in front of mock-upstream, loadgen without x-request-id
# (bodies the same in their first 600 bytes), the tracer attached; then join-check.py.
#   docs/kernel-only/join-matrix.sh PROXY CONNECTIONS RATE DELAY [ids|hey]
# PROXY: nginx | haproxy | caddy | apache; DELAY: mock-upstream's --delay-ms (5, or 1-20);
# `ids` keeps loadgen's ids and writes --raw-events/--raw-data for join-rules.py; `hey` loads
# with hey instead (-c CONNECTIONS, RATE/CONNECTIONS each, 6 s, no id, the issue's measurement)
# and prints the tracer's counts and the tail's shares instead of the check.
# Runs as root from the repository, with release binaries built (cargo build --release).
set -eu
P=$1; C=$2; R=$3; DELAY=$4; IDS=${5:-}
B=$PWD/target/release
D=$(mktemp -d /tmp/join-$P-XXXX); chmod 755 "$D"
UP=127.0.0.1:$((20000 + RANDOM % 10000)); PORT=$((30000 + RANDOM % 10000))
"$B/mock-upstream" --listen $UP --delay-ms "$DELAY" --log-requests "$D/mock.csv" > "$D/mock.log" 2>&1 &
MOCK=$!
case $P in
nginx)
  printf 'worker_processes 1; pid %s/nginx.pid; error_log %s/error.log;\nevents { worker_connections 1024; }\nhttp { access_log %s/access.log; client_body_temp_path %s/b; proxy_temp_path %s/p;\n fastcgi_temp_path %s/f; uwsgi_temp_path %s/u; scgi_temp_path %s/s;\n upstream up { server %s; keepalive 32; }\n server { listen 127.0.0.1:%s; location / { proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection ""; } } }\n' \
    "$D" "$D" "$D" "$D" "$D" "$D" "$D" "$D" $UP $PORT > "$D/nginx.conf"
  nginx -p "$D" -c "$D/nginx.conf" -g 'daemon off;' & PX=$! ;;
haproxy)
  printf 'defaults\n  mode http\n  timeout connect 5s\n  timeout client 30s\n  timeout server 30s\nfrontend fe\n  bind 127.0.0.1:%s\n  default_backend be\nbackend be\n  server s1 %s\n' $PORT $UP > "$D/h.cfg"
  haproxy -f "$D/h.cfg" -db & PX=$! ;;
caddy)
  HOME=$D XDG_DATA_HOME=$D/data XDG_CONFIG_HOME=$D/config caddy reverse-proxy --from :$PORT --to $UP > "$D/caddy.log" 2>&1 & PX=$! ;;
apache)
  M=/usr/lib/apache2/modules
  printf 'ServerRoot %s\nServerName 127.0.0.1\nListen 127.0.0.1:%s\nPidFile %s/apache2.pid\nDefaultRuntimeDir %s\nMutex pthread default\nErrorLog %s/error.log\nDocumentRoot %s\nUser www-data\nGroup www-data\nLoadModule mpm_event_module %s/mod_mpm_event.so\nLoadModule authz_core_module %s/mod_authz_core.so\nLoadModule proxy_module %s/mod_proxy.so\nLoadModule proxy_http_module %s/mod_proxy_http.so\nStartServers 2\nServerLimit 2\nThreadsPerChild 16\nMaxRequestWorkers 32\nKeepAlive On\nMaxKeepAliveRequests 0\nProxyPass / http://%s/\n' \
    "$D" $PORT "$D" "$D" "$D" "$D" $M $M $M $M $UP > "$D/apache2.conf"
  apache2 -f "$D/apache2.conf" -DFOREGROUND & PX=$! ;;
esac
sleep 1.5
RAW=(); ANON=(--no-request-id)
if [ "$IDS" = ids ]; then ANON=(); fi
if [ -n "$IDS" ]; then RAW=(--raw-events "$D/raw-events" --raw-data "$D/raw-data"); fi
"$B/tracer" record --pid $PX --duration 9 --out "$D/session" --no-calibrate --sample-hz 0 "${RAW[@]}" > "$D/tracer.log" 2>&1 &
TR=$!
sleep 4
if [ "$IDS" = hey ]; then
  hey -c "$C" -q $((R / C)) -z 4s -m POST -d '{"a":1}' http://127.0.0.1:$PORT/echo > "$D/hey.log" 2>&1
else
  "$B/loadgen" --url http://127.0.0.1:$PORT --direct --rate "$R" --connections "$C" --duration 3 \
    --warmup 0 --body-pad 600 "${ANON[@]}" --requests-out "$D/client.csv" --quiet > "$D/loadgen.log" 2>&1
fi
wait $TR || true
kill $PX $MOCK 2>/dev/null; wait 2>/dev/null || true
echo "$P c=$C $R req/s delay $DELAY ms ($D):"
grep -h "client requests" "$D/tracer.log" | sed 's/^tracer: kernel-only //'
if [ "$IDS" = hey ]; then
  grep -h "Status code distribution" -A3 "$D/hey.log" | tr -s ' \n' ' '; echo
  python3 "$(dirname "$0")/join-check.py" --tail "$D/session"
elif [ "$IDS" = ids ]; then
  python3 "$(dirname "$0")/join-rules.py" "$D/raw-events" "$D/raw-data"
else
  python3 "$(dirname "$0")/join-check.py" "$D/client.csv" "$D/mock.csv" "$D/session"
fi
