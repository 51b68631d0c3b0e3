//! `tollgate health`: one `GET` of a gateway's `/healthz` (or any plain-HTTP URL), exit 0 on
//! `200` and 1 otherwise. It is what the container image's `HEALTHCHECK` runs, so the image
//! needs no curl: HTTP/1.1 by hand over a [`TcpStream`], every step bounded by one deadline.
//!
//! Phase: its own short-lived process; never part of a running gateway.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Why a probe got no status.
#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    #[error("{0:?} is not an http:// URL with a host")]
    Url(String),
    #[error("cannot resolve {0}: {1}")]
    Resolve(String, std::io::Error),
    #[error("cannot connect to {0}: {1}")]
    Connect(String, std::io::Error),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("not an HTTP response: {0:?}")]
    Response(String),
}

/// The base URL (`http://ip:port`) of an admin listener bound to `admin`. A wildcard address
/// (`0.0.0.0`, `[::]`) is asked on the loopback address of its family.
pub fn admin_url(admin: SocketAddr) -> String {
    let ip = match admin.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    format!("http://{}", SocketAddr::new(ip, admin.port()))
}

/// The `/healthz` URL of an admin listener bound to `admin`.
pub fn healthz_url(admin: SocketAddr) -> String {
    format!("{}/healthz", admin_url(admin))
}

/// `GET url` and return the response's status code, within `timeout` in all.
pub fn probe(url: &str, timeout: Duration) -> Result<u16, HealthError> {
    let deadline = Instant::now() + timeout;
    let left = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or(HealthError::Timeout(timeout))
    };
    let uri: http::Uri = url.parse().map_err(|_| HealthError::Url(url.into()))?;
    let (Some("http"), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
        return Err(HealthError::Url(url.into()));
    };
    let target = format!(
        "{}:{}",
        authority.host(),
        authority.port_u16().unwrap_or(80)
    );
    let addrs: Vec<SocketAddr> = target
        .to_socket_addrs()
        .map_err(|e| HealthError::Resolve(target.clone(), e))?
        .collect();
    let mut last = None;
    let mut conn = None;
    for a in &addrs {
        match TcpStream::connect_timeout(a, left()?) {
            Ok(c) => {
                conn = Some(c);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let Some(mut conn) = conn else {
        let e = last.unwrap_or_else(|| std::io::ErrorKind::NotFound.into());
        return Err(HealthError::Connect(target, e));
    };
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    conn.set_write_timeout(Some(left()?))?;
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: {authority}\r\nUser-Agent: tollgate-health\r\nConnection: close\r\n\r\n"
    )?;
    let mut head = Vec::new();
    let mut buf = [0u8; 512];
    while !head.windows(2).any(|w| w == b"\r\n") && head.len() < 4096 {
        conn.set_read_timeout(Some(left()?))?;
        match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                return Err(HealthError::Timeout(timeout))
            }
            Err(e) => return Err(e.into()),
        }
    }
    status_of(&head)
}

/// The status code of a response that starts with `head`.
fn status_of(head: &[u8]) -> Result<u16, HealthError> {
    let text = String::from_utf8_lossy(head);
    let line = text.lines().next().unwrap_or_default();
    let mut parts = line.split(' ');
    match (parts.next(), parts.next().map(str::parse::<u16>)) {
        (Some(v), Some(Ok(code))) if v.starts_with("HTTP/1.") => Ok(code),
        _ => Err(HealthError::Response(line.chars().take(80).collect())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_admin_addresses_are_asked_on_loopback() {
        let url = |s: &str| healthz_url(s.parse().unwrap());
        assert_eq!(url("0.0.0.0:9901"), "http://127.0.0.1:9901/healthz");
        assert_eq!(url("[::]:9901"), "http://[::1]:9901/healthz");
        assert_eq!(url("10.1.2.3:9901"), "http://10.1.2.3:9901/healthz");
    }

    #[test]
    fn status_line() {
        assert_eq!(status_of(b"HTTP/1.1 200 OK\r\n").unwrap(), 200);
        assert_eq!(
            status_of(b"HTTP/1.0 503 Service Unavailable\r\n").unwrap(),
            503
        );
        assert!(status_of(b"SSH-2.0-OpenSSH\r\n").is_err());
        assert!(status_of(b"").is_err());
    }

    #[test]
    fn only_plain_http_urls() {
        for bad in ["https://127.0.0.1/healthz", "127.0.0.1:9901", "http:///x"] {
            assert!(
                matches!(probe(bad, Duration::from_secs(1)), Err(HealthError::Url(_))),
                "{bad}"
            );
        }
    }
}
