# Sourced by cpu.sh and instructions.sh. Defines free_port, a temporary directory $dir removed
# on exit, an array pids of processes killed on exit (add to it), and starts the upstream:
# NGINX answering `return 200` on 127.0.0.1:$up, pinned to core 1.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
dir=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT

up=$(free_port)
mkdir -p "$dir/logs"
cat > "$dir/upstream.conf" <<CONF
worker_processes 1; daemon off; pid $dir/up.pid; error_log $dir/logs/up.err;
events { worker_connections 4096; }
http { access_log off;
  server { listen 127.0.0.1:$up; keepalive_requests 1000000; location / { return 200 "ok"; } } }
CONF
taskset -c 1 nginx -p "$dir" -c "$dir/upstream.conf" & pids+=($!)
