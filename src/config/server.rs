//! `server`: the listeners, worker threads and shutdown grace. Read once at start.

use std::net::SocketAddr;
use std::time::Duration;

use super::errors::Errors;
use super::{defaults, raw, Overrides};

/// `server`: read at start; a reload that changes it is logged and applied on restart.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerSettings {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub threads: usize,
    pub grace_period: Duration,
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

pub(super) fn validate(errs: &mut Errors, r: raw::Server, o: &Overrides) -> ServerSettings {
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
    let grace_period = r
        .grace_period
        .and_then(|g| errs.duration("server.grace_period", &g))
        .unwrap_or(defaults::GRACE_PERIOD);
    ServerSettings {
        listen: socket_addr(errs, listen_path, listen),
        admin_listen: socket_addr(errs, admin_path, admin),
        threads,
        grace_period,
    }
}
