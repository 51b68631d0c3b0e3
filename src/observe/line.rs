//! One request's access-log line: its fields, put together from the request's [`Record`] and
//! session, and written as logfmt text or JSON ([`format`]) straight into the log's buffer,
//! without allocating unless a field has something to scrub.
//!
//! What is logged never holds a secret: the API key appears only as its fingerprint, the
//! `Authorization` header is never read into the line, the path loses its query string, and
//! client-chosen fields (path, user agent, request id) have any copy of the caller's API key
//! or bearer token replaced, and anything shaped like a JWT too ([`scrub`]). Pingora's own
//! error lines say of a request only what [`summary`] gives: the method, the path as logged
//! here and the route.
//!
//! Phase: the end of a request, only while the access log is on; [`summary`] when Pingora
//! logs a failed request.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use pingora_proxy::Session;

use super::format::{self, key, Value};
use super::{api_key, digest_peer_ip, Observer, Record, Verdict, REQUEST_ID_NAME};
use crate::config::{AccessLogFormat, Config, RouteId};
use crate::fingerprint::{fingerprint, Fingerprint};
use crate::redact::scrub;

/// Paths longer than this are cut.
const MAX_PATH: usize = 2048;

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

/// What the client chose, scrubbed of secrets, and the API key's fingerprint.
struct Client<'r> {
    fp: Option<Fingerprint>,
    /// The client's request id (`None` when the gateway made one).
    request_id: Option<Cow<'r, str>>,
    user: Option<Cow<'r, str>>,
    path: Cow<'r, str>,
    user_agent: Option<Cow<'r, str>>,
}

/// The caller's API key and its fingerprint, and its bearer token (when a JWT is configured).
type Credentials<'r> = (Option<(&'r str, Fingerprint)>, Option<&'r str>);

fn credentials<'r>(cfg: &Config, session: &'r Session) -> Credentials<'r> {
    let key = api_key(cfg, session).map(|k| (k, fingerprint(k)));
    let bearer = cfg
        .identity
        .jwt
        .as_ref()
        .and_then(|j| session.req_header().headers.get(&j.header))
        .and_then(|v| v.to_str().ok())
        .map(|v| v.strip_prefix("Bearer ").unwrap_or(v));
    (key, bearer)
}

/// What [`scrub`] replaces: the API key by its fingerprint, the bearer token by `[token]`.
fn secrets<'a>(creds: &'a Credentials<'_>) -> [(&'a str, &'a str); 2] {
    let mut secrets: [(&str, &str); 2] = [("", ""); 2];
    if let Some((k, fp)) = &creds.0 {
        secrets[0] = (k, fp.as_str());
    }
    if let Some(b) = creds.1 {
        secrets[1] = (b, "[token]");
    }
    secrets
}

/// The request's path as the log shows it: normal form, no query, secrets scrubbed.
fn logged_path<'r>(session: &'r Session, secrets: &[(&str, &str)]) -> Cow<'r, str> {
    match normalize_path(session.req_header().uri.path()) {
        Cow::Borrowed(p) => scrub(p, secrets),
        Cow::Owned(p) => Cow::Owned(scrub(&p, secrets).into_owned()),
    }
}

/// What Pingora's own log lines (a failed or retried proxy) say of a request, in place of its
/// raw request line and `Host`: `GET /path route=name` (`route=-` before routing), the path as
/// the access log writes it.
pub fn summary(cfg: &Config, session: &Session, route: Option<RouteId>) -> String {
    let creds = credentials(cfg, session);
    let path = logged_path(session, &secrets(&creds));
    let route = route
        .and_then(|r| cfg.routes.get(r))
        .map_or("-", |r| &*r.name);
    format!(
        "{} {path} route={route}",
        session.req_header().method.as_str()
    )
}

fn client_strings<'r>(cfg: &Config, session: &'r Session, rec: &'r Record) -> Client<'r> {
    let req = session.req_header();
    let creds = credentials(cfg, session);
    let secrets = secrets(&creds);
    let header = |name: &http::HeaderName| req.headers.get(name).and_then(|v| v.to_str().ok());
    let scrubbed = |v: &'r str| scrub(v, &secrets);
    let request_id = match rec.generated_id {
        Some(_) => None,
        None => Some(scrubbed(header(&REQUEST_ID_NAME).unwrap_or("-"))),
    };
    let user = rec.user.as_deref().map(scrubbed);
    let path = logged_path(session, &secrets);
    let user_agent = header(&http::header::USER_AGENT).map(scrubbed);
    Client {
        fp: creds.0.map(|(_, fp)| fp),
        request_id,
        user,
        path,
        user_agent,
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
}
