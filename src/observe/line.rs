//! One request's access-log line: its fields ([`Line`]), put together from the request's
//! [`Record`] and session, and written as logfmt text or JSON straight into the log's buffer,
//! without allocating unless a field has something to scrub.
//!
//! What is logged never holds a secret: the API key appears only as its fingerprint, the
//! `Authorization` header is never read into the line, the path loses its query string, and
//! client-chosen fields (path, user agent, request id) have any copy of the caller's API key
//! or bearer token replaced, and anything shaped like a JWT too ([`scrub`]).
//!
//! Phase: the end of a request, only while the access log is on.

use std::borrow::Cow;
use std::fmt;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use pingora_proxy::Session;
use serde::{Serialize, Serializer};

use super::{api_key, Observer, Record, Verdict, REQUEST_ID};
use crate::config::{AccessLogFormat, Config, RouteId};
use crate::fingerprint::{fingerprint, Fingerprint};

/// Paths longer than this are cut.
const MAX_PATH: usize = 2048;
/// Secrets shorter than this are not searched for (they would match ordinary text).
const MIN_SECRET: usize = 6;

/// Serialize through `Display`, without an intermediate string.
fn display<T: fmt::Display, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

/// When a request started: RFC 3339, UTC, milliseconds.
#[derive(Debug, Clone, Copy)]
pub struct Time(pub SystemTime);

impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        humantime::format_rfc3339_millis(self.0).fmt(f)
    }
}

/// A request's id: the client's, or one made from the instance and a counter.
#[derive(Debug, Clone)]
pub enum RequestId<'a> {
    Client(Cow<'a, str>),
    Made { instance: u64, n: u64 },
}

impl fmt::Display for RequestId<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestId::Client(id) => f.write_str(id),
            RequestId::Made { instance, n } => write!(f, "{instance:016x}-{n:x}"),
        }
    }
}

/// Who called, as logs and `/top` name callers.
#[derive(Debug, Clone)]
pub enum CallerName<'a> {
    Key(Fingerprint),
    User(Cow<'a, str>),
}

impl fmt::Display for CallerName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallerName::Key(fp) => fp.fmt(f),
            CallerName::User(u) => write!(f, "user:{u}"),
        }
    }
}

impl Serialize for CallerName<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// One request's line. Client-chosen strings are already scrubbed.
#[derive(Debug, Serialize)]
pub struct Line<'a> {
    #[serde(serialize_with = "display")]
    pub time: Time,
    #[serde(serialize_with = "display")]
    pub request_id: RequestId<'a>,
    pub client_ip: Option<IpAddr>,
    pub caller: Option<CallerName<'a>>,
    pub method: &'a str,
    pub path: Cow<'a, str>,
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
    pub upstream: Option<SocketAddr>,
    pub upstream_ms: Option<f64>,
    pub duration_ms: f64,
    pub bytes_in: usize,
    pub bytes_out: usize,
    pub user_agent: Option<Cow<'a, str>>,
}

impl Line<'_> {
    /// Append the line in `format`, with its newline, to `out`.
    pub fn write(&self, format: AccessLogFormat, out: &mut Vec<u8>) {
        match format {
            AccessLogFormat::Json => {
                serde_json::to_writer(&mut *out, self).expect("serializable");
                out.push(b'\n');
            }
            AccessLogFormat::Text => self.text(out).expect("writing to memory"),
        }
    }

    /// logfmt: `key=value` pairs, values quoted when they need it, `-` for none.
    fn text(&self, o: &mut Vec<u8>) -> std::io::Result<()> {
        fn opt<T: fmt::Display>(o: &mut Vec<u8>, key: &str, v: Option<T>) -> std::io::Result<()> {
            match v {
                Some(v) => write!(o, " {key}={v}"),
                None => write!(o, " {key}=-"),
            }
        }
        write!(o, "time={} request_id=", self.time)?;
        match &self.request_id {
            RequestId::Client(id) => quoted(o, id),
            made => write!(o, "{made}")?,
        }
        opt(o, "client_ip", self.client_ip)?;
        o.extend_from_slice(b" caller=");
        match &self.caller {
            Some(CallerName::User(u)) if !plain(u) => quoted(o, &format!("user:{u}")),
            Some(c) => write!(o, "{c}")?,
            None => o.push(b'-'),
        }
        write!(o, " method={} path=", self.method)?;
        quoted(o, &self.path);
        opt(o, "route", self.route)?;
        write!(o, " status={}", self.status)?;
        opt(o, "limit", self.limit)?;
        opt(o, "outcome", self.outcome)?;
        opt(o, "degraded", self.degraded)?;
        opt(o, "class", self.class)?;
        opt(o, "upstream", self.upstream)?;
        opt(o, "upstream_ms", self.upstream_ms.map(Ms))?;
        write!(
            o,
            " duration_ms={} bytes_in={} bytes_out={} user_agent=",
            Ms(self.duration_ms),
            self.bytes_in,
            self.bytes_out
        )?;
        quoted(o, self.user_agent.as_deref().unwrap_or("-"));
        o.push(b'\n');
        Ok(())
    }
}

/// Milliseconds with three decimals.
struct Ms(f64);

impl fmt::Display for Ms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.3}", self.0)
    }
}

/// Whether a logfmt value needs no quotes.
fn plain(v: &str) -> bool {
    !v.is_empty()
        && v.bytes()
            .all(|c| c.is_ascii_graphic() && c != b'"' && c != b'=' && c != b'\\')
}

/// Append `v`, in double quotes with `"` and `\` escaped when it has a space, a quote, `=`
/// or a control character; control characters become `?`.
fn quoted(o: &mut Vec<u8>, v: &str) {
    if plain(v) {
        o.extend_from_slice(v.as_bytes());
        return;
    }
    o.push(b'"');
    let mut buf = [0u8; 4];
    for c in v.chars() {
        match c {
            '"' | '\\' => o.extend_from_slice(&[b'\\', c as u8]),
            c if c.is_control() => o.push(b'?'),
            c => o.extend_from_slice(c.encode_utf8(&mut buf).as_bytes()),
        }
    }
    o.push(b'"');
}

/// The path (already without its query string) with `//` collapsed and `.` and `..` segments
/// resolved, cut at [`MAX_PATH`] bytes. Borrowed when it is already so.
pub fn normalize_path(path: &str) -> Cow<'_, str> {
    let path = path.split(['?', '#']).next().unwrap_or("");
    let clean = path.starts_with('/')
        && path.len() <= MAX_PATH
        && !path.contains("//")
        && !path.split('/').any(|s| s == "." || s == "..");
    if clean {
        return Cow::Borrowed(path);
    }
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
    Cow::Owned(out)
}

/// `v` with every copy of a secret replaced by what stands for it (the API key by its
/// fingerprint, a bearer token by `[token]`), and anything shaped like a JWT (`eyJ…` with two
/// dots) by `[jwt]`. Borrowed when there is nothing to replace.
pub fn scrub<'v>(v: &'v str, secrets: &[(&str, &str)]) -> Cow<'v, str> {
    let mut out = Cow::Borrowed(v);
    for (secret, replacement) in secrets.iter().filter(|(s, _)| s.len() >= MIN_SECRET) {
        if out.contains(secret) {
            out = Cow::Owned(out.replace(secret, replacement));
        }
    }
    while let Some((start, end)) = find_jwt(&out) {
        out.to_mut().replace_range(start..end, "[jwt]");
    }
    out
}

/// The byte range of the first JWT-shaped run: `eyJ` followed by base64url characters with
/// two dots or more inside.
fn find_jwt(s: &str) -> Option<(usize, usize)> {
    let is_b64 = |c: u8| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'.';
    let b = s.as_bytes();
    let mut from = 0;
    while let Some(i) = s[from..].find("eyJ").map(|i| i + from) {
        let end = b[i..]
            .iter()
            .position(|&c| !is_b64(c))
            .map_or(b.len(), |n| i + n);
        if b[i..end].iter().filter(|&&c| c == b'.').count() >= 2 {
            return Some((i, end));
        }
        from = i + 3;
    }
    None
}

impl Observer {
    /// Write the line of one request that ended with `status` after `took` into `out`.
    pub(super) fn write_line(
        &self,
        out: &mut Vec<u8>,
        format: AccessLogFormat,
        (cfg, session, route, rec): (&Arc<Config>, &Session, Option<RouteId>, &Record),
        status: u16,
        took: Option<Duration>,
    ) {
        let req = session.req_header();
        let key = api_key(cfg, session);
        let fp = key.map(fingerprint);
        let bearer = cfg
            .identity
            .jwt
            .as_ref()
            .and_then(|j| req.headers.get(&j.header))
            .and_then(|v| v.to_str().ok())
            .map(|v| v.strip_prefix("Bearer ").unwrap_or(v));
        let mut secrets: [(&str, &str); 2] = [("", ""); 2];
        if let (Some(k), Some(fp)) = (key, &fp) {
            secrets[0] = (k, fp.as_str());
        }
        if let Some(b) = bearer {
            secrets[1] = (b, "[token]");
        }
        let header = |name: &str| req.headers.get(name).and_then(|v| v.to_str().ok());
        let request_id = match rec.generated_id {
            Some(n) => RequestId::Made {
                instance: self.instance,
                n,
            },
            None => RequestId::Client(scrub(header(REQUEST_ID).unwrap_or("-"), &secrets)),
        };
        let (limit, outcome) = match rec.verdict {
            Verdict::None => (None, None),
            Verdict::Allowed(id) => (Some(&*cfg.limit(id).name), Some("allow")),
            Verdict::Denied(id) => (Some(&*cfg.limit(id).name), Some("deny")),
            Verdict::Shed => (None, Some("shed")),
        };
        let took = took.unwrap_or_default();
        let peer = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip());
        Line {
            time: Time(
                SystemTime::now()
                    .checked_sub(took)
                    .unwrap_or_else(SystemTime::now),
            ),
            request_id,
            client_ip: rec.client_ip.or(peer),
            caller: match (fp, &rec.user) {
                (Some(fp), _) => Some(CallerName::Key(fp)),
                (None, Some(u)) => Some(CallerName::User(scrub(u, &secrets))),
                (None, None) => None,
            },
            method: req.method.as_str(),
            path: match normalize_path(req.uri.path()) {
                Cow::Borrowed(p) => scrub(p, &secrets),
                Cow::Owned(p) => Cow::Owned(scrub(&p, &secrets).into_owned()),
            },
            route: route.map(|r| &*cfg.routes[r].name),
            status,
            limit,
            outcome,
            degraded: rec.degraded.map(|d| d.as_str()),
            class: rec.class.map(|c| c.as_str()),
            upstream: rec.upstream,
            upstream_ms: rec.upstream_time.map(|t| t.as_secs_f64() * 1000.0),
            duration_ms: took.as_secs_f64() * 1000.0,
            bytes_in: session.body_bytes_read(),
            bytes_out: session.body_bytes_sent(),
            user_agent: header("user-agent").map(|ua| scrub(ua, &secrets)),
        }
        .write(format, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_lose_their_query_and_dot_segments() {
        assert_eq!(normalize_path("/a//b/./c/../d?api_key=secret"), "/a/b/d");
        assert!(matches!(normalize_path("/a/b"), Cow::Borrowed("/a/b")));
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
        assert!(matches!(scrub("eyJ only", &key), Cow::Borrowed("eyJ only")));
    }

    #[test]
    fn text_lines_quote_what_needs_it() {
        let mut o = Vec::new();
        quoted(&mut o, "a b\"c");
        assert_eq!(o, b"\"a b\\\"c\"");
    }
}
