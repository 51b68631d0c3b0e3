//! One request's access-log line: its fields, put together from the request's [`Record`] and
//! session, and written as logfmt text or JSON ([`format`]) straight into the log's buffer,
//! without allocating unless a field has something to scrub.
//!
//! What is logged never holds a secret: the API key appears only as its fingerprint, the
//! `Authorization` header is never read into the line, the path loses its query string, and
//! client-chosen fields (path, user agent, request id) have any copy of the caller's API key
//! or bearer token replaced, and anything shaped like a JWT too ([`scrub`]).
//!
//! Phase: the end of a request, only while the access log is on.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use pingora_proxy::Session;

use super::format::{self, key, Value};
use super::{api_key, digest_peer_ip, Observer, Record, Verdict, REQUEST_ID_NAME};
use crate::config::{AccessLogFormat, Config, RouteId};
use crate::fingerprint::{fingerprint, Fingerprint};

/// Paths longer than this are cut.
const MAX_PATH: usize = 2048;
/// Secrets shorter than this are not searched for (they would match ordinary text).
const MIN_SECRET: usize = 6;

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
    // A byte scan: most strings here are short, and `str::find` prepares a searcher first.
    let start = |from: usize| {
        b[from..]
            .windows(3)
            .position(|w| w == b"eyJ")
            .map(|i| i + from)
    };
    while let Some(i) = start(from) {
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

/// What the client chose, scrubbed of secrets, and the API key's fingerprint.
struct Client<'r> {
    fp: Option<Fingerprint>,
    /// The client's request id (`None` when the gateway made one).
    request_id: Option<Cow<'r, str>>,
    user: Option<Cow<'r, str>>,
    path: Cow<'r, str>,
    user_agent: Option<Cow<'r, str>>,
}

fn client_strings<'r>(cfg: &Config, session: &'r Session, rec: &'r Record) -> Client<'r> {
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
    let header = |name: &http::HeaderName| req.headers.get(name).and_then(|v| v.to_str().ok());
    let scrubbed = |v: &'r str| scrub(v, &secrets);
    Client {
        fp,
        request_id: match rec.generated_id {
            Some(_) => None,
            None => Some(scrubbed(header(&REQUEST_ID_NAME).unwrap_or("-"))),
        },
        user: rec.user.as_deref().map(scrubbed),
        path: match normalize_path(req.uri.path()) {
            Cow::Borrowed(p) => scrubbed(p),
            Cow::Owned(p) => Cow::Owned(scrub(&p, &secrets).into_owned()),
        },
        user_agent: header(&http::header::USER_AGENT).map(scrubbed),
    }
}

/// A config name or fixed word, or none.
fn safe(v: Option<&str>) -> Value<'_> {
    v.map_or(Value::None, Value::Safe)
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
        let Client {
            fp,
            request_id: client_id,
            user,
            path,
            user_agent,
        } = client_strings(cfg, session, rec);
        let (limit, outcome) = match rec.verdict {
            Verdict::None => (None, None),
            Verdict::Allowed(id) => (Some(&*cfg.limit(id).name), Some("allow")),
            Verdict::Denied(id) => (Some(&*cfg.limit(id).name), Some("deny")),
            Verdict::Shed => (None, Some("shed")),
        };
        let took = took.unwrap_or_default();
        let micros = |d: Duration| d.as_micros() as u64;
        let started = SystemTime::now().checked_sub(took);
        let request_id = match (&client_id, rec.generated_id) {
            (Some(id), _) => Value::Str(id),
            (None, n) => Value::MadeId(&self.id_prefix, n.unwrap_or_default()),
        };
        let caller = match (&fp, &user) {
            (Some(fp), _) => Value::Safe(fp.as_str()),
            (None, Some(u)) => Value::Tagged("user:", u),
            (None, None) => Value::None,
        };
        let upstream_time = rec.upstream_time.map(|t| Value::Micros(micros(t)));
        let time = Value::Time(started.unwrap_or_else(SystemTime::now));
        // The caller's address as identity saw it; the peer's for a request refused before.
        let client_ip = rec.client_ip.or_else(|| digest_peer_ip(session));
        let client_ip = client_ip.map_or(Value::None, Value::Ip);
        let upstream = rec.upstream.map_or(Value::None, Value::Addr);
        format::line(
            out,
            format,
            &[
                (key!("time"), time),
                (key!("request_id"), request_id),
                (key!("client_ip"), client_ip),
                (key!("caller"), caller),
                (key!("method"), Value::Safe(req.method.as_str())),
                (key!("path"), Value::Str(&path)),
                (key!("route"), safe(route.map(|r| &*cfg.routes[r].name))),
                (key!("status"), Value::Num(u64::from(status))),
                (key!("limit"), safe(limit)),
                (key!("outcome"), safe(outcome)),
                (key!("degraded"), safe(rec.degraded.map(|d| d.as_str()))),
                (key!("class"), safe(rec.class.map(|c| c.as_str()))),
                (key!("upstream"), upstream),
                (key!("upstream_ms"), upstream_time.unwrap_or(Value::None)),
                (key!("duration_ms"), Value::Micros(micros(took))),
                (
                    key!("bytes_in"),
                    Value::Num(session.body_bytes_read() as u64),
                ),
                (
                    key!("bytes_out"),
                    Value::Num(session.body_bytes_sent() as u64),
                ),
                (
                    key!("user_agent"),
                    user_agent.as_deref().map_or(Value::None, Value::Str),
                ),
            ],
        );
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
}
