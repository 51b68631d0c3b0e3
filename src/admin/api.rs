//! `/admin/v1/…`: tenants without redeploys. JSON in and out, problem details on errors, every
//! change one audit row and one log line. `{key}` is the raw API key or `fp:<fingerprint>`; no
//! answer, row or log line ever holds a raw key.
//!
//! - `PUT|GET|DELETE /admin/v1/quotas/{key}`, `GET /admin/v1/quotas?limit=&cursor=`
//! - `GET /admin/v1/usage/{key}`, `POST /admin/v1/usage/{key}/reset`
//! - `GET /admin/v1/audit?limit=&cursor=`
//! - `POST /admin/v1/reload`, `GET /admin/v1/config`
//!
//! Phase: the admin listener, behind the admin token.

use std::sync::Arc;

use http::Method;
use pingora_core::protocols::http::ServerSession;
use serde_json::{json, Value};

use super::{json_response, usage, view, Admin};
use crate::config::Config;
use crate::fingerprint::{fingerprint, KeyHash};
use crate::quota::model::{AuditEntry, PutBody};
use crate::quota::{self, Change, Db, Lookup, Quotas};
use crate::store::Invalidation;
use http::Response;

/// The largest request body the API reads.
pub const MAX_BODY: usize = 64 * 1024;
/// Entries per page unless `?limit=` asks for another number (at most [`PAGE_MAX`]).
pub const PAGE: i64 = 100;
pub const PAGE_MAX: i64 = 1000;

/// A problem-details answer.
pub(super) fn problem(
    status: u16,
    detail: impl Into<String>,
    field: Option<&str>,
) -> Response<Vec<u8>> {
    let title = http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Error");
    let mut body =
        json!({ "type": "about:blank", "title": title, "status": status, "detail": detail.into() });
    if let Some(f) = field {
        body["field"] = json!(f);
    }
    let mut r = json_response(status, body);
    r.headers_mut().insert(
        "content-type",
        http::HeaderValue::from_static("application/problem+json"),
    );
    r
}

/// A key as the path names it.
struct Named {
    hash: KeyHash,
    /// 8 hex digits.
    fp: String,
    /// The raw key, when the path gave it (not when it gave a fingerprint).
    raw: Option<String>,
}

/// A path or query segment, percent-decoded; `None` unless it is UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .ok()
        .map(|c| c.into_owned())
}

/// Resolve `{key}`: a raw key, or `fp:…` looked up in the quota store.
async fn named(db: Option<&Db>, segment: &str) -> Result<Named, Response<Vec<u8>>> {
    let Some(s) = percent_decode(segment).filter(|s| !s.is_empty()) else {
        return Err(problem(
            400,
            "the key in the path is not valid",
            Some("key"),
        ));
    };
    let Some(hex) = s.strip_prefix("fp:") else {
        return Ok(Named {
            hash: KeyHash::of(&s),
            fp: fingerprint(&s).hex().to_string(),
            raw: Some(s),
        });
    };
    if crate::fingerprint::Fingerprint::parse(hex).is_none() {
        return Err(problem(
            400,
            "a fingerprint is fp: and 8 lowercase hex digits",
            Some("key"),
        ));
    }
    let Some(db) = db else {
        return Err(unavailable());
    };
    let hashes = db.by_fingerprint(hex).await.map_err(|e| db_error(&e))?;
    match hashes.as_slice() {
        [] => Err(problem(
            404,
            format!("no override has the fingerprint fp:{hex}"),
            Some("key"),
        )),
        [h] => Ok(Named {
            hash: *h,
            fp: hex.to_string(),
            raw: None,
        }),
        _ => Err(problem(
            409,
            format!("several keys have the fingerprint fp:{hex}; name the key itself"),
            Some("key"),
        )),
    }
}

fn unavailable() -> Response<Vec<u8>> {
    problem(503, "the quota database cannot be reached right now; gateways keep serving with the overrides they have", None)
}

fn db_error(e: &quota::DbError) -> Response<Vec<u8>> {
    tracing::warn!("quota database: {e}");
    unavailable()
}

/// `limit` and `cursor` of a query string.
fn page(query: Option<&str>) -> (i64, Option<String>) {
    let mut limit = PAGE;
    let mut cursor = None;
    for kv in query.into_iter().flat_map(|q| q.split('&')) {
        match kv.split_once('=') {
            Some(("limit", n)) => limit = n.parse().unwrap_or(PAGE).clamp(1, PAGE_MAX),
            Some(("cursor", c)) => cursor = percent_decode(c),
            _ => {}
        }
    }
    (limit, cursor)
}

/// A new audit row's id: when, then a random part, so ids sort by time.
fn audit_id(now_ms: u64) -> String {
    let r = crate::store::instance_id() as u32 ^ (now_ms as u32).rotate_left(7);
    format!("{now_ms:016x}-{r:08x}")
}

impl Admin {
    /// Everything under `/admin/v1/`, after authentication.
    pub(super) async fn api(
        &self,
        session: &mut ServerSession,
        method: &Method,
        path: &str,
        query: Option<&str>,
    ) -> Response<Vec<u8>> {
        let rest = path.trim_start_matches("/admin/v1/");
        let parts: Vec<&str> = rest.split('/').collect();
        let cfg = self.config.snapshot();
        let client = session
            .client_addr()
            .map_or_else(|| "unknown".to_string(), |a| a.to_string());
        match (method, parts.as_slice()) {
            (&Method::POST, ["reload"]) => return self.reload(&client).await,
            (&Method::GET, ["config"]) => return json_response(200, view::config(&cfg)),
            _ => {}
        }
        let Some(quotas) = self.quotas.clone() else {
            return problem(404, "the quota store is not enabled: add `quotas: { database: \"sqlite:///var/lib/tollgate/quotas.db\" }` (or a postgres:// URL) to the config and restart", None);
        };
        let db = quotas.db_within(quota::CONNECT_TIMEOUT).await;
        match (method, parts.as_slice()) {
            (&Method::GET, ["quotas"]) => self.list(db.as_deref(), query).await,
            (&Method::GET, ["audit"]) => audit(db.as_deref(), query).await,
            (&Method::GET, ["quotas", key]) => self.get(db.as_deref(), key).await,
            (&Method::PUT, ["quotas", key]) => {
                let body = match read_body(session, MAX_BODY).await {
                    Ok(b) => b,
                    Err(r) => return r,
                };
                self.put(&cfg, &quotas, key, &body, &client).await
            }
            (&Method::DELETE, ["quotas", key]) => self.delete(&quotas, key, &client).await,
            (&Method::GET, ["usage", key]) => self.usage(&cfg, &quotas, key).await,
            (&Method::POST, ["usage", key, "reset"]) => {
                self.reset(&cfg, &quotas, key, &client).await
            }
            _ => problem(404, format!("no admin endpoint {method} {path}"), None),
        }
    }

    async fn list(&self, db: Option<&Db>, query: Option<&str>) -> Response<Vec<u8>> {
        let Some(db) = db else { return unavailable() };
        let (limit, cursor) = page(query);
        match db.list(limit, cursor.as_deref()).await {
            Err(e) => db_error(&e),
            Ok(rows) => {
                let now = quota::now_s();
                let next = (rows.len() as i64 == limit)
                    .then(|| {
                        rows.last()
                            .map(|o| format!("{}:{}", o.fingerprint, o.key_hash.hex()))
                    })
                    .flatten();
                json_response(
                    200,
                    json!({
                        "overrides": rows.iter().map(|o| o.to_json(now)).collect::<Vec<_>>(),
                        "next_cursor": next,
                    }),
                )
            }
        }
    }

    async fn get(&self, db: Option<&Db>, key: &str) -> Response<Vec<u8>> {
        let Some(db) = db else { return unavailable() };
        let named = match named(Some(db), key).await {
            Ok(n) => n,
            Err(r) => return r,
        };
        match db.get(&named.hash).await {
            Err(e) => db_error(&e),
            Ok(None) => problem(404, format!("no override for fp:{}", named.fp), Some("key")),
            Ok(Some(o)) => json_response(200, o.to_json(quota::now_s())),
        }
    }

    async fn put(
        &self,
        cfg: &Config,
        quotas: &Quotas,
        key: &str,
        body: &[u8],
        client: &str,
    ) -> Response<Vec<u8>> {
        let Some(db) = quotas.db() else {
            return unavailable();
        };
        let named = match named(Some(&db), key).await {
            Ok(n) => n,
            Err(r) => return r,
        };
        let body = match PutBody::parse(body) {
            Ok(b) => b,
            Err(e) => return problem(400, format!("{}: {}", e.field, e.message), Some(&e.field)),
        };
        let current = match db.get(&named.hash).await {
            Ok(c) => c,
            Err(e) => return db_error(&e),
        };
        let now = quota::now_s();
        let before = current.as_ref().map(|o| o.to_json(now).to_string());
        let created = current.is_none();
        let next = match body.apply(cfg, current, named.hash, &named.fp, now) {
            Ok(o) => o,
            Err(e) => return problem(400, format!("{}: {}", e.field, e.message), Some(&e.field)),
        };
        let after = next.to_json(now);
        let entry = self.audit_entry("put", &named.fp, before, Some(after.to_string()), client);
        if let Err(e) = db.put(&next, &entry).await {
            return db_error(&e);
        }
        // In force here before the answer; other gateways hear of it (NOTIFY or their refresh).
        quotas.apply(Change::Put(next)).await;
        quotas.changed();
        // Cached denials were decided under the old quota: drop them on every gateway.
        self.store.invalidate(Invalidation::All).await;
        tracing::info!(key = %format!("fp:{}", named.fp), client, "quota override {}: {after}", if created { "created" } else { "changed" });
        json_response(if created { 201 } else { 200 }, after)
    }

    async fn delete(&self, quotas: &Quotas, key: &str, client: &str) -> Response<Vec<u8>> {
        let Some(db) = quotas.db() else {
            return unavailable();
        };
        let named = match named(Some(&db), key).await {
            Ok(n) => n,
            Err(r) => return r,
        };
        let before = match db.get(&named.hash).await {
            Ok(Some(o)) => o.to_json(quota::now_s()).to_string(),
            Ok(None) => {
                return problem(404, format!("no override for fp:{}", named.fp), Some("key"))
            }
            Err(e) => return db_error(&e),
        };
        let entry = self.audit_entry("delete", &named.fp, Some(before), None, client);
        if let Err(e) = db.delete(&named.hash, &entry).await {
            return db_error(&e);
        }
        quotas.apply(Change::Delete(named.hash)).await;
        quotas.changed();
        self.store.invalidate(Invalidation::All).await;
        tracing::info!(key = %format!("fp:{}", named.fp), client, "quota override deleted");
        json_response(
            200,
            json!({ "key": format!("fp:{}", named.fp), "deleted": true }),
        )
    }

    /// The tier `named` is in now, and its override in force.
    fn tier_of(
        &self,
        cfg: &Arc<Config>,
        quotas: &Quotas,
        named: &Named,
    ) -> (Option<usize>, Option<Arc<quota::table::Resolved>>) {
        let over = match quotas.lookup_hash(cfg, named.hash, quota::now_s()) {
            Lookup::Some(r) => Some(r),
            Lookup::None => None,
        };
        let listed = cfg
            .api_keys
            .iter()
            .find(|(k, _)| match &named.raw {
                Some(raw) => *k == raw,
                None => KeyHash::of(k) == named.hash,
            })
            .map(|(_, t)| *t);
        let tier = over
            .as_ref()
            .and_then(|o| o.tier)
            .or(listed)
            .or(cfg.default_tier);
        (tier, over)
    }

    async fn usage(&self, cfg: &Arc<Config>, quotas: &Quotas, key: &str) -> Response<Vec<u8>> {
        let named = match named(quotas.db().as_deref(), key).await {
            Ok(n) => n,
            Err(r) => return r,
        };
        let (tier, over) = self.tier_of(cfg, quotas, &named);
        let now_ms = crate::limit::Clock::now_ms(&crate::limit::SystemClock);
        match usage::usage(cfg, &self.store, named.hash, tier, over.as_deref(), now_ms).await {
            Err(e) => problem(
                503,
                format!("the counters cannot be read right now: {e}"),
                None,
            ),
            Ok((limits, not_enumerable)) => json_response(
                200,
                json!({
                    "key": format!("fp:{}", named.fp),
                    "tier": tier.map(|t| cfg.tiers[t].name.clone()),
                    "limits": limits,
                    "not_enumerable": not_enumerable,
                }),
            ),
        }
    }

    async fn reset(
        &self,
        cfg: &Arc<Config>,
        quotas: &Quotas,
        key: &str,
        client: &str,
    ) -> Response<Vec<u8>> {
        let named = match named(quotas.db().as_deref(), key).await {
            Ok(n) => n,
            Err(r) => return r,
        };
        let (tier, over) = self.tier_of(cfg, quotas, &named);
        // The audit row first: a reset that cannot be audited is not made.
        let entry = self.audit_entry("reset", &named.fp, None, None, client);
        let audited = match quotas.db() {
            Some(db) => db.audit(&entry).await.map_err(|e| e.to_string()),
            None => Err("the quota database is not connected".to_string()),
        };
        if let Err(e) = audited {
            tracing::warn!(
                "the usage reset of fp:{} is refused: its audit row cannot be written: {e}",
                named.fp
            );
            return problem(
                503,
                "the usage reset cannot be written to the audit log right now (the quota database does not answer), so it is not made",
                None,
            );
        }
        let removed = match usage::reset(cfg, &self.store, named.hash, tier, over.as_deref()).await
        {
            Ok(n) => n,
            Err(e) => {
                return problem(
                    503,
                    format!("the counters cannot be reset right now: {e}"),
                    None,
                )
            }
        };
        tracing::info!(key = %format!("fp:{}", named.fp), client, removed, "usage reset");
        json_response(
            200,
            json!({ "key": format!("fp:{}", named.fp), "reset": true, "counters_removed": removed }),
        )
    }

    /// `POST /admin/v1/reload`, with an audit row (no key: `reload` with the generation and
    /// file it loaded, or `reload_refused` with how many errors the file has) when the quota
    /// store is configured. A reload whose row cannot be written is still made (it may be what
    /// repairs the database settings), and its answer says `"audited": false`.
    async fn reload(&self, client: &str) -> Response<Vec<u8>> {
        let before = json!({ "config_generation": self.generation() }).to_string();
        let result = self.config.reload().await;
        let after = match &result {
            Ok(c) => json!({ "config_generation": self.generation(), "source": c.source }),
            Err(e) => json!({ "config_generation": self.generation(), "errors": e.0.len() }),
        };
        let action = if result.is_ok() {
            "reload"
        } else {
            "reload_refused"
        };
        let entry = self.audit_entry(action, "", Some(before), Some(after.to_string()), client);
        let audited = self.audit_alone(&entry).await;
        tracing::info!(client, audited, "config {action}");
        match result {
            Ok(c) => json_response(
                200,
                json!({
                    "reloaded": true,
                    "config_generation": self.generation(),
                    "source": c.source,
                    "audited": audited,
                }),
            ),
            Err(e) => {
                let body = json!({
                    "type": "about:blank", "title": "Bad Request", "status": 400,
                    "detail": "the config file does not validate; the last good config keeps serving",
                    "errors": e.0,
                    "audited": audited,
                });
                let mut r = json_response(400, body);
                r.headers_mut().insert(
                    "content-type",
                    http::HeaderValue::from_static("application/problem+json"),
                );
                r
            }
        }
    }

    /// Write `entry` on its own, when there is a quota store: whether it was written (`true`
    /// without a store: there is no audit log to miss).
    async fn audit_alone(&self, entry: &AuditEntry) -> bool {
        let Some(quotas) = &self.quotas else {
            return true;
        };
        let Some(db) = quotas.db_within(quota::CONNECT_TIMEOUT).await else {
            tracing::warn!(
                "the {} is not in the audit log: the quota database is not connected",
                entry.action
            );
            return false;
        };
        match db.audit(entry).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!("the {} is not in the audit log: {e}", entry.action);
                false
            }
        }
    }

    fn audit_entry(
        &self,
        action: &str,
        fp: &str,
        before: Option<String>,
        after: Option<String>,
        client: &str,
    ) -> AuditEntry {
        let now_ms = crate::limit::Clock::now_ms(&crate::limit::SystemClock);
        AuditEntry {
            id: audit_id(now_ms),
            at: (now_ms / 1000) as i64,
            fingerprint: fp.to_string(),
            action: action.to_string(),
            before,
            after,
            client: client.to_string(),
        }
    }
}

async fn audit(db: Option<&Db>, query: Option<&str>) -> Response<Vec<u8>> {
    let Some(db) = db else { return unavailable() };
    let (limit, cursor) = page(query);
    match db.audit_page(limit, cursor.as_deref()).await {
        Err(e) => db_error(&e),
        Ok(rows) => {
            let next = (rows.len() as i64 == limit)
                .then(|| rows.last().map(|e| e.id.clone()))
                .flatten();
            json_response(
                200,
                json!({
                    "entries": rows.iter().map(AuditEntry::to_json).collect::<Vec<Value>>(),
                    "next_cursor": next,
                }),
            )
        }
    }
}

/// The request body, at most `max` bytes: 413 as soon as a declared length (or the bytes read)
/// pass it, and then the connection is closed rather than the rest of the body read.
pub(super) async fn read_body(
    session: &mut ServerSession,
    max: usize,
) -> Result<Vec<u8>, Response<Vec<u8>>> {
    let too_large = |session: &mut ServerSession| {
        session.set_keepalive(None);
        problem(
            413,
            format!("the body is larger than {max} bytes"),
            Some("body"),
        )
    };
    let declared = session
        .req_header()
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(too_large(session));
    }
    let mut body = Vec::new();
    loop {
        match session.read_request_body().await {
            Ok(Some(chunk)) => {
                body.extend_from_slice(&chunk);
                if body.len() > max {
                    return Err(too_large(session));
                }
            }
            Ok(None) => return Ok(body),
            Err(e) => {
                return Err(problem(
                    400,
                    format!("the body could not be read: {e}"),
                    Some("body"),
                ))
            }
        }
    }
}
