//! One request's access-log line, put together from its [`Record`] and session.
//!
//! Phase: the end of a request, only while the access log is on.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use pingora_proxy::Session;

use super::access_log::{normalize_path, rfc3339, scrub, Line};
use super::{api_key, Observer, Record, Verdict, REQUEST_ID};
use crate::config::{Config, RouteId};
use crate::fingerprint::fingerprint;

impl Observer {
    /// The line of one request that ended with `status` after `took`.
    pub(super) fn line(
        &self,
        cfg: &Arc<Config>,
        session: &Session,
        route: Option<RouteId>,
        rec: &Record,
        status: u16,
        took: Option<Duration>,
    ) -> String {
        let req = session.req_header();
        let key = api_key(cfg, session);
        let fp = key.map(|k| fingerprint(k).to_string());
        let bearer = cfg
            .identity
            .jwt
            .as_ref()
            .and_then(|j| req.headers.get(&j.header))
            .and_then(|v| v.to_str().ok())
            .map(|v| v.strip_prefix("Bearer ").unwrap_or(v));
        let mut secrets: Vec<(&str, &str)> = Vec::with_capacity(2);
        if let (Some(k), Some(fp)) = (key, &fp) {
            secrets.push((k, fp));
        }
        secrets.extend(bearer.map(|b| (b, "[token]")));
        let clean = |v: &str| scrub(v, &secrets);
        let header = |name: &str| req.headers.get(name).and_then(|v| v.to_str().ok());
        let request_id = match rec.generated_id(self) {
            Some(id) => id,
            None => clean(header(REQUEST_ID).unwrap_or("-")),
        };
        let user = rec.user.as_ref().map(|u| clean(&format!("user:{u}")));
        let path = clean(&normalize_path(req.uri.path()));
        let user_agent = header("user-agent").map(clean);
        let (limit, outcome) = match rec.verdict {
            Verdict::None => (None, None),
            Verdict::Allowed(id) => (Some(&*cfg.limit(id).name), Some("allow")),
            Verdict::Denied(id) => (Some(&*cfg.limit(id).name), Some("deny")),
            Verdict::Shed => (None, Some("shed")),
        };
        let took = took.unwrap_or_default();
        let started = SystemTime::now()
            .checked_sub(took)
            .unwrap_or_else(SystemTime::now);
        let peer = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip());
        Line {
            time: rfc3339(started),
            request_id: &request_id,
            client_ip: rec.client_ip.or(peer),
            caller: fp.as_deref().or(user.as_deref()),
            method: req.method.as_str(),
            path: &path,
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
            user_agent: user_agent.as_deref(),
        }
        .format(self.logging.load().format)
    }
}
