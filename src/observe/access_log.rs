//! The access log: one line per request, written off the request path.
//!
//! A request formats its line ([`Line`], text or JSON) and hands it to a bounded channel
//! without waiting; one writer thread appends lines to the file (or standard output) through
//! a buffer, flushed at least every [`FLUSH_EVERY`]. When the channel is full (a slow disk, a
//! stalled pipe) the line is dropped and counted, so the log never slows proxying.
//!
//! What is logged never holds a secret: the API key appears only as its fingerprint, the
//! `Authorization` header is never read, the path loses its query string, and client-chosen
//! fields (path, user agent, request id) have any copy of the caller's API key or a JWT
//! replaced ([`scrub`]).
//!
//! Phase: the end of every request (`logging`), and the writer thread.

use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;

use crate::config::AccessLogFormat;

/// The writer flushes its buffer at least this often.
pub const FLUSH_EVERY: Duration = Duration::from_millis(200);
/// The writer's buffer.
const BUFFER_BYTES: usize = 64 * 1024;
/// Paths longer than this are cut.
const MAX_PATH: usize = 2048;

/// The sending side, shared by every request.
pub struct AccessLog {
    tx: SyncSender<String>,
    pub(super) dropped: AtomicU64,
    pub(super) written: Arc<AtomicU64>,
}

impl AccessLog {
    /// Open `path` for appending (standard output when `None`) and start the writer thread,
    /// with room for `buffer` lines in flight.
    pub fn start(path: Option<&Path>, buffer: usize) -> io::Result<AccessLog> {
        let file = match path {
            Some(p) => std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)?,
            None => {
                use std::os::fd::AsFd;
                File::from(io::stdout().as_fd().try_clone_to_owned()?)
            }
        };
        let (tx, rx) = mpsc::sync_channel(buffer);
        let written = Arc::new(AtomicU64::new(0));
        let count = written.clone();
        std::thread::Builder::new()
            .name("tollgate access log".into())
            .spawn(move || write_lines(rx, file, &count))?;
        Ok(AccessLog {
            tx,
            dropped: AtomicU64::new(0),
            written,
        })
    }

    /// Queue one line (with its newline) without waiting; dropped and counted when full.
    pub fn send(&self, line: String) {
        match self.tx.try_send(line) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// The writer thread: append lines through a buffer, flushing at least every [`FLUSH_EVERY`].
fn write_lines(rx: Receiver<String>, file: File, written: &AtomicU64) {
    let mut out = io::BufWriter::with_capacity(BUFFER_BYTES, file);
    let mut last_flush = Instant::now();
    let mut warned = false;
    loop {
        let wait = FLUSH_EVERY.saturating_sub(last_flush.elapsed());
        let result = match rx.recv_timeout(wait) {
            Ok(line) => {
                let r = out.write_all(line.as_bytes());
                if r.is_ok() {
                    written.fetch_add(1, Ordering::Relaxed);
                }
                r
            }
            Err(RecvTimeoutError::Timeout) => Ok(()),
            Err(RecvTimeoutError::Disconnected) => {
                let _ = out.flush();
                return;
            }
        };
        let result = if last_flush.elapsed() >= FLUSH_EVERY {
            last_flush = Instant::now();
            result.and_then(|()| out.flush())
        } else {
            result
        };
        if let Err(e) = result {
            if !std::mem::replace(&mut warned, true) {
                tracing::warn!("cannot write the access log: {e}");
            }
        }
    }
}

/// One request's line. Strings are already scrubbed.
#[derive(Debug, Serialize)]
pub struct Line<'a> {
    /// When the request started, RFC 3339 with milliseconds, UTC.
    pub time: String,
    pub request_id: &'a str,
    pub client_ip: Option<std::net::IpAddr>,
    /// `fp:<fingerprint>` of the API key, or `user:<claim>` of a JWT user.
    pub caller: Option<&'a str>,
    pub method: &'a str,
    pub path: &'a str,
    pub route: Option<&'a str>,
    /// 0: the request ended without a response.
    pub status: u16,
    /// The decisive limit.
    pub limit: Option<&'a str>,
    /// `allow`, `deny` or `shed`.
    pub outcome: Option<&'a str>,
    /// The failure policy that answered while the store could not.
    pub degraded: Option<&'a str>,
    pub class: Option<&'a str>,
    pub upstream: Option<std::net::SocketAddr>,
    pub upstream_ms: Option<f64>,
    pub duration_ms: f64,
    pub bytes_in: usize,
    pub bytes_out: usize,
    pub user_agent: Option<&'a str>,
}

impl Line<'_> {
    /// The line in `format`, with its newline.
    pub fn format(&self, format: AccessLogFormat) -> String {
        match format {
            AccessLogFormat::Json => {
                let mut s = serde_json::to_string(self).expect("serializable");
                s.push('\n');
                s
            }
            AccessLogFormat::Text => self.text(),
        }
    }

    /// logfmt: `key=value` pairs, values quoted when they need it, `-` for none.
    fn text(&self) -> String {
        let mut s = String::with_capacity(320);
        let opt = |v: Option<&str>| v.unwrap_or("-").to_string();
        let _ = write!(s, "time={} request_id=", self.time);
        quoted(&mut s, self.request_id);
        let _ = write!(
            s,
            " client_ip={} caller=",
            self.client_ip.map_or("-".into(), |i| i.to_string())
        );
        quoted(&mut s, &opt(self.caller));
        let _ = write!(s, " method={} path=", self.method);
        quoted(&mut s, self.path);
        let _ = write!(
            s,
            " route={} status={} limit={} outcome={} degraded={} class={} upstream={} upstream_ms={} duration_ms={:.3} bytes_in={} bytes_out={} user_agent=",
            opt(self.route),
            self.status,
            opt(self.limit),
            opt(self.outcome),
            opt(self.degraded),
            opt(self.class),
            self.upstream.map_or("-".into(), |u| u.to_string()),
            self.upstream_ms.map_or("-".into(), |u| format!("{u:.3}")),
            self.duration_ms,
            self.bytes_in,
            self.bytes_out,
        );
        quoted(&mut s, self.user_agent.unwrap_or("-"));
        s.push('\n');
        s
    }
}

/// Append `v`, in double quotes with `"` and `\` escaped when it has a space, a quote, `=`
/// or a control character; control characters become `?`.
fn quoted(s: &mut String, v: &str) {
    let plain = !v.is_empty()
        && v.chars()
            .all(|c| c.is_ascii_graphic() && c != '"' && c != '=' && c != '\\');
    if plain {
        s.push_str(v);
        return;
    }
    s.push('"');
    for c in v.chars() {
        match c {
            '"' | '\\' => {
                s.push('\\');
                s.push(c);
            }
            c if c.is_control() => s.push('?'),
            c => s.push(c),
        }
    }
    s.push('"');
}

/// RFC 3339 with milliseconds, UTC.
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// The path without its query string, with `//` collapsed and `.` and `..` segments resolved,
/// cut at [`MAX_PATH`] bytes.
pub fn normalize_path(path: &str) -> String {
    let path = path.split(['?', '#']).next().unwrap_or("");
    let mut segments: Vec<&str> = Vec::new();
    for seg in path.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    let mut out = String::with_capacity(path.len().min(MAX_PATH) + 1);
    for s in segments {
        out.push('/');
        out.push_str(s);
    }
    if out.is_empty() || (path.ends_with('/') && !out.ends_with('/')) {
        out.push('/');
    }
    if out.len() > MAX_PATH {
        let mut cut = MAX_PATH;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
    }
    out
}

/// Secrets shorter than this are not searched for (they would match ordinary text).
const MIN_SECRET: usize = 6;

/// `v` with every copy of a secret (the caller's API key, its bearer token) replaced by what
/// stands for it, and anything shaped like a JWT (`eyJ…` with two dots) by `[jwt]`.
pub fn scrub(v: &str, secrets: &[(&str, &str)]) -> String {
    let mut out = v.to_string();
    for (secret, replacement) in secrets.iter().filter(|(s, _)| s.len() >= MIN_SECRET) {
        if out.contains(secret) {
            out = out.replace(secret, replacement);
        }
    }
    while let Some((start, end)) = find_jwt(&out) {
        out.replace_range(start..end, "[jwt]");
    }
    out
}

/// The byte range of the first JWT-shaped run: `eyJ` followed by base64url characters with
/// exactly two dots inside.
fn find_jwt(s: &str) -> Option<(usize, usize)> {
    let is_b64 = |c: u8| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'.';
    let b = s.as_bytes();
    let mut from = 0;
    while let Some(i) = s[from..].find("eyJ").map(|i| i + from) {
        let end = b[i..]
            .iter()
            .position(|&c| !is_b64(c))
            .map_or(b.len(), |n| i + n);
        let dots = b[i..end].iter().filter(|&&c| c == b'.').count();
        if dots >= 2 {
            return Some((i, end));
        }
        from = i + 3;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_lose_their_query_and_dot_segments() {
        assert_eq!(normalize_path("/a//b/./c/../d?api_key=secret"), "/a/b/d");
        assert_eq!(normalize_path("/"), "/");
        assert_eq!(normalize_path("/x/"), "/x/");
        assert_eq!(normalize_path("/../../etc"), "/etc");
        assert_eq!(normalize_path("?k=v"), "/");
    }

    #[test]
    fn secrets_and_jwts_are_scrubbed() {
        let jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhIn0.c2ln";
        assert_eq!(scrub(&format!("agent {jwt} x"), &[]), "agent [jwt] x");
        let key = [("sk_live_123", "fp:1")];
        assert_eq!(scrub("curl key=sk_live_123", &key), "curl key=fp:1");
        assert_eq!(scrub("eyJ only", &[]), "eyJ only");
    }

    #[test]
    fn text_lines_quote_what_needs_it() {
        let mut s = String::new();
        quoted(&mut s, "a b\"c");
        assert_eq!(s, "\"a b\\\"c\"");
    }
}
