//! `server`: what is read once at start ([`ServerSettings`]: listeners, threads, connection
//! limits, shutdown, readiness) and what every request reads from its snapshot and a reload
//! changes ([`HttpSettings`]: keep-alive, head, URI and body size limits, path normalization).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::errors::{words, Errors};
use super::{defaults, raw, Overrides};

/// `server`, as read at start: a reload that changes it is logged and applied on restart.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerSettings {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub threads: usize,
    /// Tokio's work-stealing runtime shared by the threads (`true`), or a single-threaded
    /// runtime per thread, each connection on one of them (`false`). Default: work-stealing
    /// with more than one thread; with one there is nothing to steal from, and the
    /// single-threaded runtime cost 2-14% less CPU per request
    /// (`loadtest/log/2026-11-24-no-work-stealing.md`).
    pub work_stealing: bool,
    /// In-flight requests get this long to finish on shutdown.
    pub grace_period: Duration,
    /// After SIGTERM or SIGINT, the proxy keeps serving this long with `Connection: close`.
    pub drain_period: Duration,
    /// The whole head of every request must arrive within this.
    pub header_timeout: Duration,
    /// Connections the proxy listener holds at most; `None`: 90% of the open-file limit.
    pub max_connections: Option<usize>,
    /// Idle upstream connections kept for reuse, per worker thread (Pingora's pool is one,
    /// sized this times `threads`), over all upstreams. A response whose connection finds the
    /// pool full closes it, and a later request opens a new one, so the pool must hold as many
    /// as there are requests in flight at a peak: with 300 in flight, Pingora's default of 128
    /// made each request cost 1.5x the CPU (`loadtest/log/2026-11-25-peer-options-floor.md`).
    /// Only connections a peak
    /// needed are ever open; each closes after the upstream's `idle`.
    pub upstream_keepalive_pool: usize,
    /// Where a `--upgrade` process takes the listening sockets over; `None`: one per proxy port
    /// in a private directory (`crate::upgrade`: `$XDG_RUNTIME_DIR/tollgate`, `/run/tollgate`
    /// as root, else `tollgate-<uid>` in the temp directory, mode 0700).
    pub upgrade_sock: Option<PathBuf>,
    /// Forward HTTP/1 header names, both ways, with the case they arrived in (`true`), or
    /// (`false`, the default, as Envoy and HAProxy do) in their titled form for the common
    /// ones (`Content-Type`, `Date`, `Host`, ...) and in lowercase for the rest. Names are
    /// case-insensitive (RFC 9110, section 5.1), and HTTP/2 has only lowercase ones. Keeping
    /// the case costs a second map per head: 6-7% more instructions per proxied request
    /// (`loadtest/log/2026-11-26-four-framework-cuts.md`). For clients or upstreams that
    /// wrongly depend on case.
    pub preserve_header_case: bool,
    /// `/readyz` answers 503 while the store is unreachable (`true`), or (`false`, the
    /// default) only while the gateway cannot serve: it is draining. Every limit has an
    /// `on_error` policy that answers while the store is down, so a store outage taking every
    /// gateway out of the balancer's rotation at once would turn it into a total outage; the
    /// store's state stays in `/readyz`'s body, in the metrics and in the alerts. For a fleet
    /// where a gateway without its store should get no traffic (another fleet with a healthy
    /// store takes it).
    pub ready_requires_store: bool,
}

words! {
    /// `server.path_normalization`.
    pub enum PathNormalization ("a path normalization mode") {
        /// Route on the normal form and forward it.
        Normalize = "normalize",
        /// Answer 400 to a path that is not already normal.
        Reject = "reject",
    }
}

words! {
    /// `server.escaped_slashes`: what to do with `%2F` and `%5C` in a path.
    pub enum EscapedSlashes ("an escaped-slash mode") {
        Keep = "keep",
        Reject = "reject",
    }
}

/// The per-request part of `server`, applied by a reload.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpSettings {
    /// An idle keep-alive connection is closed after this (set after every request head).
    pub keepalive_timeout: Duration,
    /// Request line and headers, in bytes: more is answered `431`.
    pub max_request_header_bytes: usize,
    /// The request target, in bytes: more is answered `414`.
    pub max_uri_bytes: usize,
    /// Request bodies, in bytes (`None`: unlimited); routes may set their own.
    pub max_body_bytes: Option<u64>,
    pub path_normalization: PathNormalization,
    pub escaped_slashes: EscapedSlashes,
}

fn socket_addr(errs: &mut Errors, path: &str, s: &str) -> SocketAddr {
    s.parse().unwrap_or_else(|_| {
        errs.at(path, format!("{s:?} is not an address (ip:port)"));
        SocketAddr::from(([0, 0, 0, 0], 0))
    })
}

/// The setting from the command line when given there, else from the file, else the default;
/// with the path an error names.
fn chosen<'a>(
    flag: &'a Option<String>,
    flag_path: &'static str,
    file: &'a Option<String>,
    file_path: &'static str,
    default: &'a str,
) -> (&'a str, &'static str) {
    match (flag, file) {
        (Some(f), _) => (f, flag_path),
        (None, Some(v)) => (v, file_path),
        (None, None) => (default, file_path),
    }
}

fn duration_or(errs: &mut Errors, path: &str, v: &Option<String>, default: Duration) -> Duration {
    v.as_deref()
        .and_then(|s| errs.duration(path, s))
        .unwrap_or(default)
}

pub(super) fn validate(
    errs: &mut Errors,
    r: raw::Server,
    o: &Overrides,
) -> (ServerSettings, HttpSettings) {
    let (listen, listen_path) = chosen(
        &o.listen,
        "--listen",
        &r.listen,
        "server.listen",
        defaults::LISTEN,
    );
    let (admin, admin_path) = chosen(
        &o.admin_listen,
        "--admin-listen",
        &r.admin_listen,
        "server.admin_listen",
        defaults::ADMIN_LISTEN,
    );
    let threads = match r.threads {
        Some(n) => errs.at_least_one("server.threads", n, 1),
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let work_stealing = r.work_stealing.unwrap_or(threads > 1);
    let grace_period = duration_or(
        errs,
        "server.grace_period",
        &r.grace_period,
        defaults::GRACE_PERIOD,
    );
    let drain_period = duration_or(
        errs,
        "server.drain_period",
        &r.drain_period,
        defaults::DRAIN_PERIOD,
    );
    let header_timeout = duration_or(
        errs,
        "server.header_timeout",
        &r.header_timeout,
        defaults::HEADER_TIMEOUT,
    );
    if header_timeout.is_zero() {
        errs.at("server.header_timeout", "must be greater than zero");
    }
    let max_connections = r
        .max_connections
        .map(|n| errs.at_least_one("server.max_connections", n, 1));
    let upstream_keepalive_pool = match r.upstream_keepalive_pool {
        Some(n) => errs.at_least_one("server.upstream_keepalive_pool", n, 1),
        None => defaults::UPSTREAM_KEEPALIVE_POOL,
    };
    let upgrade_sock = r.upgrade_sock.as_deref().map(PathBuf::from);
    if upgrade_sock.as_ref().is_some_and(|p| !p.is_absolute()) {
        errs.at("server.upgrade_sock", "must be an absolute path");
    }
    let http = http_settings(errs, &r);
    let server = ServerSettings {
        listen: socket_addr(errs, listen_path, listen),
        admin_listen: socket_addr(errs, admin_path, admin),
        threads,
        work_stealing,
        grace_period,
        drain_period,
        header_timeout,
        max_connections,
        upstream_keepalive_pool,
        upgrade_sock,
        preserve_header_case: r
            .preserve_header_case
            .unwrap_or(defaults::PRESERVE_HEADER_CASE),
        ready_requires_store: r
            .ready_requires_store
            .unwrap_or(defaults::READY_REQUIRES_STORE),
    };
    (server, http)
}

fn http_settings(errs: &mut Errors, r: &raw::Server) -> HttpSettings {
    let keepalive_timeout = duration_or(
        errs,
        "server.keepalive_timeout",
        &r.keepalive_timeout,
        defaults::KEEPALIVE_TIMEOUT,
    );
    let max_request_header_bytes =
        r.max_request_header_bytes
            .map_or(defaults::MAX_REQUEST_HEADER_BYTES, |n| {
                errs.at_least_one(
                    "server.max_request_header_bytes",
                    n,
                    defaults::MAX_REQUEST_HEADER_BYTES,
                )
            });
    let max_uri_bytes = r.max_uri_bytes.map_or(defaults::MAX_URI_BYTES, |n| {
        errs.at_least_one("server.max_uri_bytes", n, defaults::MAX_URI_BYTES)
    });
    let max_body_bytes = r.max_body_bytes;
    let path_normalization = r
        .path_normalization
        .as_deref()
        .and_then(|s| errs.word("server.path_normalization", s))
        .unwrap_or(defaults::PATH_NORMALIZATION);
    let escaped_slashes = r
        .escaped_slashes
        .as_deref()
        .and_then(|s| errs.word("server.escaped_slashes", s))
        .unwrap_or(defaults::ESCAPED_SLASHES);
    HttpSettings {
        keepalive_timeout,
        max_request_header_bytes,
        max_uri_bytes,
        max_body_bytes,
        path_normalization,
        escaped_slashes,
    }
}
