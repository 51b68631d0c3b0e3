#!/usr/bin/env python3
"""Where a proxy's CPU cycles per request go, by phase: the report of loadtest/profile.sh.

Reads `perf script -F period,ip,sym` of a `perf record -e cycles --call-graph dwarf` run on
stdin. argv: the label, the requests served while perf recorded, the CPU µs per request
measured from /proc for the same row, and optionally N: the N leaf functions with the most
cycles in each phase, listed under the table.

Each sample's cycles go to one phase: that of the innermost frame on its stack that names one
(leaf first). A stack that names none is the runtime's own work when tokio's or mio's code is
in it (epoll, parking, scheduling), else "other". Kernel cycles are the samples whose leaf is
in the kernel; "loopback delivery" is the part of them spent delivering the proxy's own writes
to its peers' sockets (softirq receive), which loopback runs on the sender's CPU. Prints one
markdown table, cycles and µs per request.
"""

import re
import sys

# tollgate's own functions and methods, and drops of its types; not Pingora's functions
# monomorphized over tollgate's types (`HttpProxy<tollgate::proxy::Gateway>::...`), and not
# the global allocator's shim (`tollgate::alloc`, in every allocation's stack): an allocation
# belongs to the phase that asked for it, as it does in bare Pingora, whose shim has another
# name.
TOLLGATE = r"^(<|core::ptr::drop_in_place<)?tollgate::(?!alloc::)"
# Innermost match wins, so a phase is the most specific code that names it. The patterns are
# tollgate's and the redis crate's, then Pingora's own function names as `perf` demangles them.
PHASES = [
    ("tollgate: connection table (head and idle deadlines)", TOLLGATE + r"conn::"),
    ("tollgate: metrics and access log", TOLLGATE + r"observe::|^<?prometheus::"),
    # The redis crate's calls and its connection task (which the runtime polls on its own).
    ("tollgate: the Redis client (redis crate)", r"^<?(redis|combine)::"),
    ("tollgate: admission (limits, store)", TOLLGATE + r"(admission|store|limit)::"),
    ("tollgate: rate-limit headers", TOLLGATE + r"headers::"),
    ("tollgate: filters (identity, route, head checks, forwarding)", TOLLGATE),
    ("request head read and parsed", r"v1::server::HttpSession::read_request"),
    (
        "upstream connection from the pool (getpeername)",
        r"reused_stream|ConnectionPool<.*>::get|get_http_session|TransportConnector::get_stream"
        r"|test_reusable_stream|connect::connect",
    ),
    (
        "upstream request prepared and written",
        r"write_request_header|sanitize_h1_upstream_request|as_owned_parts|upstream_request_filter",
    ),
    (
        "upstream response read and parsed",
        r"client::HttpSession::read_resp|client::HttpSession::read_response|validate_response"
        r"|client::HttpSession::read_body|parse_response",
    ),
    (
        "downstream response prepared and written",
        r"write_response_header|prepare_response_header|write_response_tasks|write_body"
        r"|response_duplex|server::HttpSession::finish|BodyWriter",
    ),
    (
        "upstream connection back to the pool",
        r"release_http_session|release_stream|ConnectionPool<.*>::put|idle_poll",
    ),
    ("request finished (logging hook, session end)", r"HttpProxy<.*>::finish|Session::finish|::logging"),
    (
        "request state machine: the per-request future, boxed, polled, dropped; keep-alive loop",
        r"process_new|ServerApp|run_endpoint|handle_event|proxy_to_upstream"
        r"|HttpProxy<.*>::process_request",
    ),
]
# Samples with none of the phases above in their stack: the runtime's own work between
# requests (epoll, parking, scheduling tasks), which no request's code called.
RUNTIME = "runtime: epoll, parking, task scheduling"
RUNTIME_PATTERN = re.compile(r"^<?(tokio|mio)::|epoll_wait|^std::sys::")
COMPILED = [(name, re.compile(p)) for name, p in PHASES]
DELIVERY = re.compile(r"^(net_rx_action|__napi_poll|process_backlog|__netif_receive_skb)")


def samples(lines):
    """Yield (period, [(ip, sym), ...] leaf first) per sample."""
    period, frames = None, []
    for line in lines:
        line = line.rstrip("\n")
        if not line.strip():
            if period is not None:
                yield period, frames
            period, frames = None, []
        elif period is None:
            period = int(line.split()[0])
        else:
            ip, _, sym = line.strip().partition(" ")
            frames.append((int(ip, 16), sym))
    if period is not None:
        yield period, frames


def main():
    label, reqs, cpu_us = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    detail = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    user, kernel, delivery, leaves = {}, {}, {}, {}
    total = 0
    for period, frames in samples(sys.stdin):
        total += period
        in_kernel = bool(frames) and frames[0][0] >= 0xFFFF800000000000
        phase = next(
            (name for _, sym in frames for name, p in COMPILED if p.search(sym)),
            None,
        )
        if phase is None:
            runtime = any(RUNTIME_PATTERN.search(sym) for _, sym in frames)
            phase = RUNTIME if runtime else "other"
        if frames:
            by_leaf = leaves.setdefault(phase, {})
            leaf = "[kernel] " + frames[0][1] if in_kernel else frames[0][1]
            by_leaf[leaf] = by_leaf.get(leaf, 0) + period
        if in_kernel:
            kernel[phase] = kernel.get(phase, 0) + period
            if any(DELIVERY.match(sym) for _, sym in frames):
                delivery[phase] = delivery.get(phase, 0) + period
        else:
            user[phase] = user.get(phase, 0) + period
    if not total:
        sys.exit(f"{label}: no samples")
    order = [name for name, _ in PHASES] + [RUNTIME, "other"]
    print(
        f"**{label}**: {total / reqs:,.0f} cycles per request sampled; "
        f"{cpu_us:.1f} µs CPU per request from /proc"
    )
    print()
    print("| phase | user cycles/req | kernel cycles/req | of which loopback delivery | total µs/req | share |")
    print("|---|---|---|---|---|---|")
    for name in order:
        u, k, d = user.get(name, 0), kernel.get(name, 0), delivery.get(name, 0)
        if u + k == 0:
            continue
        print(
            f"| {name} | {u / reqs:,.0f} | {k / reqs:,.0f} | {d / reqs:,.0f} | "
            f"{(u + k) / total * cpu_us:.2f} | {100 * (u + k) / total:.1f}% |"
        )
    u, k, d = sum(user.values()), sum(kernel.values()), sum(delivery.values())
    print(f"| **all** | {u / reqs:,.0f} | {k / reqs:,.0f} | {d / reqs:,.0f} | {cpu_us:.2f} | 100% |")

    if detail:
        print()
        print(f"The {detail} leaf functions with the most cycles in each phase (cycles per request):")
        for name in order:
            top = sorted(leaves.get(name, {}).items(), key=lambda kv: -kv[1])[:detail]
            if top:
                listed = "; ".join(f"`{sym[:90]}` {n / reqs:,.0f}" for sym, n in top)
                print(f"- {name}: {listed}")


if __name__ == "__main__":
    main()
