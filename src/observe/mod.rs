//! Observability: Prometheus [`metrics`], the [`top`] limited callers and the [`access_log`],
//! fed from a handful of points of a request's life through one [`Observer`] per gateway.
//!
//! A request carries a [`Record`] in its context. `request_filter` opens it
//! ([`Observer::begin`]: start time, request id), notes who called and which class it is,
//! hands over what admission decided ([`Observer::decided`], [`Observer::verdict`]), and the
//! `logging` hook closes it ([`Observer::finish`]): response metrics and the access-log line.
//! The admin listener reads the same [`Observer`] for `/metrics`, `/top` and `/stats`.
//!
//! Phase: every request (a few atomic adds and clock reads; no allocation with the access log
//! off), and the admin listener. Label handles are resolved once per config, not per request.

pub mod access_log;
pub mod format;
pub mod metrics;
#[cfg(test)]
mod tests;
pub mod top;

use std::cell::RefCell;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use pingora_proxy::Session;

use crate::admission::{Admitted, Refused, Report};
use crate::config::reload::ConfigHandle;
use crate::config::{Config, KeyPart, LimitId, OnError, Priority, RouteId};
use crate::fingerprint::fingerprint;
use crate::identity::Caller;
use crate::refusal::Refusal;
use crate::shed::Shedder;
use crate::store::Store;

use access_log::AccessLog;
use metrics::{Labels, Metrics};
use top::TopCallers;

/// The header that carries a request's id, generated when absent and forwarded upstream
/// (while the access log is on).
pub const REQUEST_ID: &str = "x-request-id";
const REQUEST_ID_NAME: http::HeaderName = http::HeaderName::from_static(REQUEST_ID);
/// Longest request id taken from a client; a longer one is replaced.
const MAX_REQUEST_ID: usize = 128;

/// Moves on whenever an observer's current labels change (a reload's first request or scrape).
static LABELS_GENERATION: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The labels this thread's last request used: whose (the observer's address), the
    /// [`LABELS_GENERATION`] then, and the labels, kept alive by this.
    static LAST_LABELS: RefCell<Option<(usize, u64, Arc<Labels>)>> = const { RefCell::new(None) };
}

/// What one request was decided, for its log line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Verdict {
    /// Not decided by a limit (refused earlier, or no limit applied).
    #[default]
    None,
    Allowed(LimitId),
    Denied(LimitId),
    Shed,
}

/// The peer's IP address as Pingora's session digest has it, for a request whose connection
/// entry is not at hand (or was never made): asking makes the session's digest if nothing has
/// yet.
pub fn digest_peer_ip(session: &Session) -> Option<IpAddr> {
    session.client_addr()?.as_inet().map(|a| a.ip())
}

/// One request, as observed from start to end. Lives in the request's context.
#[derive(Debug, Default)]
pub struct Record {
    start: Option<Instant>,
    /// Set when the request came without a usable `X-Request-Id`: the number of the one made.
    generated_id: Option<u64>,
    client_ip: Option<IpAddr>,
    /// A JWT user's claim (for `/top` and the log line).
    user: Option<String>,
    /// The request's priority class, once classified.
    pub class: Option<Priority>,
    verdict: Verdict,
    degraded: Option<OnError>,
    upstream: Option<SocketAddr>,
    /// Whether the access log was on when the request began: only its line shows the
    /// upstream's time, so only then is the upstream timed (two clock reads).
    logged: bool,
    upstream_start: Option<Instant>,
    upstream_time: Option<Duration>,
}

impl Record {
    /// Who is calling (after identity). Only a JWT user costs an allocation, next to the
    /// token's verification.
    pub fn identified(&mut self, caller: &Caller<'_>) {
        self.client_ip = Some(caller.client_ip);
        self.user.clone_from(&caller.user);
    }

    /// The upstream server picked; its time starts now (when the access log will show it).
    pub fn upstream(&mut self, addr: SocketAddr) {
        self.upstream = Some(addr);
        if self.logged {
            self.upstream_start = Some(Instant::now());
        }
    }

    /// The upstream's response head arrived.
    pub fn upstream_answered(&mut self) {
        self.upstream_time = self.upstream_start.map(|s| s.elapsed());
    }

    /// The request id to forward upstream when the client sent none (or an unusable one).
    pub fn generated_id(&self, observer: &Observer) -> Option<http::HeaderValue> {
        let n = self.generated_id?;
        let mut id = Vec::with_capacity(33);
        id.extend_from_slice(&observer.id_prefix);
        format::push_hex(&mut id, n, 1);
        http::HeaderValue::from_maybe_shared(bytes::Bytes::from(id)).ok()
    }
}

/// The gateway's observability: metrics, top callers, the access log.
pub struct Observer {
    pub metrics: Metrics,
    pub top: TopCallers,
    labels: ArcSwap<Labels>,
    resolving: parking_lot::Mutex<()>,
    config: Arc<ConfigHandle>,
    store: Arc<Store>,
    shedder: &'static Shedder,
    log: AccessLog,
    /// This process among all gateways (as the start of every request id it makes), and the
    /// requests numbered so far, for request ids.
    id_prefix: [u8; 17],
    requests: AtomicU64,
    /// Requests considered for the access log, for sampling.
    considered: AtomicU64,
    /// The quota store, whose state the metrics show.
    quotas: Option<Arc<crate::quota::Quotas>>,
}

impl Observer {
    /// The observer of a gateway. Opens the access log (standard output or its file) and
    /// starts its writer.
    pub fn new(
        config: Arc<ConfigHandle>,
        store: Arc<Store>,
        shedder: &'static Shedder,
    ) -> std::io::Result<Observer> {
        let cfg = config.snapshot();
        let metrics = Metrics::new();
        let labels = Labels::resolve(&metrics, &cfg, store.redis_store().is_some());
        // Started also while disabled, so that a reload can switch it on.
        let log = AccessLog::start(cfg.access_log.path.as_deref(), cfg.access_log.buffer)?;
        Ok(Observer {
            metrics,
            top: TopCallers::default(),
            labels: ArcSwap::from_pointee(labels),
            resolving: parking_lot::Mutex::new(()),
            config,
            store,
            shedder,
            log,
            id_prefix: format::id_prefix(crate::store::instance_id()),
            requests: AtomicU64::new(0),
            considered: AtomicU64::new(0),
            quotas: None,
        })
    }

    /// Also show the quota store's state in the metrics.
    pub fn with_quotas(mut self, quotas: Option<Arc<crate::quota::Quotas>>) -> Observer {
        self.quotas = quotas;
        self
    }

    /// The label handles of `cfg`, then `f` of them. The current config's are resolved once
    /// (on its first request or scrape) and kept; a request still running on an older config
    /// after a reload gets labels of its own. A thread uses the labels of its last request
    /// again, without touching the shared ones (a load from the `ArcSwap` is two atomic
    /// read-modify-writes), while they are of `cfg` and no observer's have changed since.
    fn with_labels<R>(&self, cfg: &Arc<Config>, f: impl FnOnce(&Labels) -> R) -> R {
        let me = std::ptr::from_ref(self) as usize;
        let generation = LABELS_GENERATION.load(Ordering::Acquire);
        // `f` only counts or reads (it never comes back here), so it runs under the borrow.
        LAST_LABELS.with_borrow_mut(|last| {
            let kept =
                matches!(last, Some((of, g, l)) if *of == me && *g == generation && l.of(cfg));
            if !kept {
                *last = Some((me, generation, self.labels_of(cfg)));
            }
            let (_, _, labels) = last.as_ref().expect("set above");
            f(labels)
        })
    }

    /// The labels of `cfg`: the current ones, or resolved now (and kept when `cfg` is the
    /// current config, pruning the series the last config had and this one has not).
    fn labels_of(&self, cfg: &Arc<Config>) -> Arc<Labels> {
        let cur = self.labels.load_full();
        if cur.of(cfg) {
            return cur;
        }
        let _one = self.resolving.lock();
        let cur = self.labels.load_full();
        if cur.of(cfg) {
            return cur;
        }
        let next = Arc::new(Labels::resolve(
            &self.metrics,
            cfg,
            self.store.redis_store().is_some(),
        ));
        if Arc::ptr_eq(&self.config.snapshot(), cfg) {
            cur.prune(&self.metrics, &next);
            self.labels.store(next.clone());
            // After the store: a thread that sees the new generation loads the new labels.
            LABELS_GENERATION.fetch_add(1, Ordering::Release);
        }
        next
    }

    /// A request starts: its clock and, while the access log is on, its id unless the client
    /// sent a usable one. (Request ids tie log lines to the upstream's; forwarding one costs
    /// about 2% of a proxied request, so it is part of the access log's cost.)
    pub fn begin(&self, session: &Session, cfg: &Config) -> Record {
        let logged = cfg.access_log.enabled;
        let make_id = logged
            && !session
                .req_header()
                .headers
                .get(REQUEST_ID_NAME)
                .is_some_and(|v| usable_request_id(v.as_bytes()));
        Record {
            start: Some(Instant::now()),
            generated_id: make_id.then(|| self.requests.fetch_add(1, Ordering::Relaxed)),
            logged,
            ..Record::default()
        }
    }

    /// What admission decided, since `started`: decisions by limit, failure policies, check
    /// time and quota use. A request no limit applied to is not a check (nor a clock read).
    /// `started` is on the system clock, which the limits' time was read from too: a check
    /// during which that clock stepped back is timed as 0.
    pub fn decided(&self, cfg: &Arc<Config>, report: &Report, started: SystemTime) {
        if report.decided.is_empty() && report.failed.is_empty() {
            return;
        }
        let took = started.elapsed().unwrap_or_default();
        self.with_labels(cfg, |l| {
            for d in &report.decided {
                l.decision(d.limit, d.outcome, d.source);
                if let Some(used) = d.used {
                    l.quota_used(d.limit, used);
                }
            }
            for &id in &report.failed {
                l.failure_policy(id);
            }
        });
        self.metrics.check_duration.observe(took.as_secs_f64());
    }

    /// The request's outcome: kept for its log line; a denial counts for its caller in
    /// `/top`.
    pub fn verdict(
        &self,
        cfg: &Config,
        session: &Session,
        rec: &mut Record,
        decided: &Result<Admitted, Refused>,
    ) {
        let (verdict, degraded) = match decided {
            Ok(a) => (
                a.decisive
                    .map_or(Verdict::None, |(id, _)| Verdict::Allowed(id)),
                a.degraded,
            ),
            Err(r) => match r.refusal {
                Refusal::RateLimited { limit, .. } | Refusal::SlotsFull { limit, .. } => {
                    let caller = self.caller_of(cfg, limit, session, rec);
                    self.top
                        .record(&cfg.limit(limit).name, caller, unix_seconds());
                    (Verdict::Denied(limit), r.degraded)
                }
                Refusal::StoreUnavailable { limit } => (Verdict::Denied(limit), r.degraded),
                Refusal::Shed(_) => (Verdict::Shed, r.degraded),
                _ => (Verdict::None, r.degraded),
            },
        };
        rec.verdict = verdict;
        rec.degraded = degraded;
    }

    /// How `/top` names the caller a limit denied: by what the limit counts (API key, user,
    /// client IP), else by the most specific identity the request has.
    fn caller_of(&self, cfg: &Config, limit: LimitId, session: &Session, rec: &Record) -> String {
        let key = api_key(cfg, session);
        let parts = &cfg.limit(limit).key;
        let has = |p: KeyPart| parts.contains(&p);
        let ip = || {
            rec.client_ip
                .map_or("ip:unknown".to_string(), |ip| format!("ip:{ip}"))
        };
        match (key, &rec.user) {
            (Some(k), _) if has(KeyPart::ApiKey) => fingerprint(k).to_string(),
            (_, Some(u)) if has(KeyPart::User) => format!("user:{u}"),
            _ if has(KeyPart::ClientIp) => ip(),
            (Some(k), _) => fingerprint(k).to_string(),
            (_, Some(u)) => format!("user:{u}"),
            _ => ip(),
        }
    }

    /// The end of a request: response metrics, and its access-log line.
    pub fn finish(
        &self,
        session: &Session,
        cfg: Option<&Arc<Config>>,
        route: Option<RouteId>,
        rec: &Record,
        now: Instant,
    ) {
        let snapshot;
        let cfg = match cfg {
            Some(cfg) => cfg,
            None => {
                snapshot = self.config.snapshot();
                &snapshot
            }
        };
        let status = session.response_written().map_or(0, |r| r.status.as_u16());
        let took = rec.start.map(|s| now.saturating_duration_since(s));
        self.with_labels(cfg, |l| {
            l.request(route, status, took.map(|t| t.as_secs_f64()))
        });
        // Logged when the access log was on as the request began (as its id and upstream
        // time are), and is still.
        if !rec.logged {
            return;
        }
        let log = &self.log;
        let logging = &cfg.access_log;
        if logging.enabled && self.sampled(logging.sample) {
            let request = (cfg, session, route, rec);
            log.log(|out| self.write_line(out, logging.format, request, status, took));
        }
    }

    /// Whether this request is among the `sample` fraction logged: evenly spread.
    fn sampled(&self, sample: f64) -> bool {
        if sample >= 1.0 {
            return true;
        }
        let n = self.considered.fetch_add(1, Ordering::Relaxed) as f64;
        (n * sample).floor() != ((n + 1.0) * sample).floor()
    }

    /// `/metrics`: the text exposition, with the values kept elsewhere copied in first.
    /// Write what the access log still holds (at most `within`): before the process exits.
    pub fn flush(&self, within: std::time::Duration) {
        self.log.flush(within);
    }

    pub fn render_metrics(&self) -> Vec<u8> {
        let cfg = self.config.snapshot();
        self.with_labels(&cfg, |_| ());
        self.metrics.sync(&self.store, self.shedder, &self.config);
        let m = &self.metrics;
        let add = |c: &prometheus::IntCounter, v: u64| c.inc_by(v.saturating_sub(c.get()));
        add(&m.access_log_dropped, self.log.dropped());
        add(&m.access_log_lines, self.log.written());
        if let Some(q) = &self.quotas {
            self.metrics.sync_quotas(q);
        }
        self.metrics.render()
    }

    /// Decision and response totals of the current config, for `/stats` and the live page.
    pub fn totals(&self) -> serde_json::Value {
        let cfg = self.config.snapshot();
        self.with_labels(&cfg, |l| {
            let mut all = [0u64; 3];
            let by_limit: Vec<serde_json::Value> = l
                .decision_totals()
                .map(|(name, n)| {
                    all.iter_mut().zip(n).for_each(|(a, n)| *a += n);
                    serde_json::json!({ "limit": name, "allow": n[0], "deny": n[1], "shadow_deny": n[2] })
                })
                .collect();
            let responses = l.response_totals();
            let classes: serde_json::Map<String, serde_json::Value> = metrics::CODE_CLASSES
                .iter()
                .zip(responses)
                .map(|(c, n)| (c.to_string(), n.into()))
                .collect();
            serde_json::json!({
                "decisions": { "allow": all[0], "deny": all[1], "shadow_deny": all[2], "by_limit": by_limit },
                "responses": classes,
            })
        })
    }
}

/// The request's API key header, if sent.
fn api_key<'s>(cfg: &Config, session: &'s Session) -> Option<&'s str> {
    let v = session
        .req_header()
        .headers
        .get(&cfg.identity.api_key_header)?;
    v.to_str().ok().filter(|k| !k.is_empty())
}

/// A client's request id is used when it is 1 to 128 visible ASCII characters without quotes
/// or backslashes.
fn usable_request_id(v: &[u8]) -> bool {
    !v.is_empty()
        && v.len() <= MAX_REQUEST_ID
        && v.iter()
            .all(|&c| c.is_ascii_graphic() && c != b'"' && c != b'\\')
}

fn unix_seconds() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

mod line;
pub use line::summary;
