# Sourced by ab-tracers.sh, bpf-stats.sh and perf-nginx.sh with a name for the run directory:
# starts mock-upstream (CPU 1, 0 ms) on 127.0.0.1:9300 and nginx (one worker, CPU 0) before it
# on 127.0.0.1:9301, with its files in a new directory under /dev/shm/ab. Sets B (the release
# binaries), D (that directory), MOCK and NGX (the pids).
B=${BIN:-target/release}
mkdir -p /dev/shm/ab; D=$(mktemp -d /dev/shm/ab/$1.XXXX)
taskset -c 1 $B/mock-upstream --listen 127.0.0.1:9300 --delay-ms 0 >/dev/null 2>&1 &
MOCK=$!
cat > $D/nginx.conf <<CONF
worker_processes 1;
pid $D/nginx.pid;
error_log $D/error.log;
events { worker_connections 1024; }
http {
  access_log $D/access.log;
  client_body_temp_path $D/body; proxy_temp_path $D/proxy; fastcgi_temp_path $D/f; uwsgi_temp_path $D/u; scgi_temp_path $D/s;
  upstream up { server 127.0.0.1:9300; keepalive 32; }
  server { listen 127.0.0.1:9301; location / { proxy_pass http://up; proxy_http_version 1.1; proxy_set_header Connection ""; } }
}
CONF
taskset -c 0 nginx -p $D -c $D/nginx.conf -g 'daemon off;' >/dev/null 2>&1 &
NGX=$!
sleep 1
