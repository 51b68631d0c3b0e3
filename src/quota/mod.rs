//! Per-key quota overrides: a key moved to another tier, new parameters for some of its limits,
//! or the key revoked, without a redeploy. Overrides live in PostgreSQL (or an embedded SQLite
//! file, [`db`]) and every gateway holds all of them in memory ([`table`]), so no request ever
//! waits on the database: a refresh task reloads them every `quotas.refresh` and, with
//! PostgreSQL, at once when another gateway's admin API announces a change (LISTEN/NOTIFY).
//! A change made through a gateway's admin API is in that gateway's table before the call
//! answers (read-your-writes). The listening connection is reconnected at most
//! [`LISTEN_RETRY`] apart, and every (re)connect reloads in full, since announcements sent
//! while nobody listened are lost: a change reaches every gateway within about a second of the
//! database answering again.
//!
//! If the database goes away, gateways keep serving with the overrides they have and stay
//! ready; `/readyz` says since when they are stale. A gateway that starts while the database is
//! down serves with the YAML alone and loads the overrides as soon as it answers.
//!
//! Phase: `request_filter` reads the table ([`Quotas::lookup`]: one hash of the API key, one
//! map lookup); the refresh task and the admin API run off the request path.

pub mod client;
pub mod db;
pub mod model;
pub mod table;

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::{ArcSwap, ArcSwapOption};
use tokio::sync::{Mutex, Notify};

use crate::config::{Config, QuotaSettings};
pub use db::{Db, DbError};
pub use model::{KeyHash, Override};
use table::{Resolved, ResolvedTable, Table};

/// How long a connection attempt to the database may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Reconnects to an unreachable database at most this far apart.
pub const MAX_RETRY: Duration = Duration::from_secs(5);
/// Reconnects of a dropped LISTEN at most this far apart (each attempt also waits up to
/// [`CONNECT_TIMEOUT`], retrying a refused connection within it): a change made while nobody
/// listened is loaded by the reconnect's full reload, so this bounds how late it arrives.
pub const LISTEN_RETRY: Duration = Duration::from_millis(500);
/// A reload that failed is tried again this soon (or at the next `quotas.refresh`, if sooner).
pub const RELOAD_RETRY: Duration = Duration::from_secs(1);

/// Unix seconds now.
pub fn now_s() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// A change this gateway has just written to the database, applied to its own table before the
/// admin call answers.
#[derive(Debug, Clone)]
pub enum Change {
    /// The key's override as written.
    Put(Override),
    /// The key's override removed.
    Delete(KeyHash),
}

/// What the quota store says about one API key.
#[derive(Debug, Clone)]
pub enum Lookup {
    /// No override in force.
    None,
    /// An override in force.
    Some(Arc<Resolved>),
}

/// The quota store of one gateway.
pub struct Quotas {
    settings: QuotaSettings,
    db: ArcSwapOption<Db>,
    table: ArcSwap<Table>,
    resolved: ArcSwapOption<ResolvedTable>,
    /// Unix seconds of the last load that worked (0: never).
    loaded_at: AtomicI64,
    /// Unix seconds since when loads fail (0: they do not).
    stale_since: AtomicI64,
    loads: AtomicU64,
    /// Wakes the refresh task (a change made through this gateway's admin API).
    changed: Notify,
    /// Wakes admin calls waiting for the first connection.
    connected: Notify,
    /// Held while the table is replaced or changed: a reload's read of the database and its
    /// store, or a local change, so a reload that read before a change cannot undo it.
    writing: Mutex<()>,
    /// PostgreSQL: whether the LISTEN connection is up.
    listening: AtomicBool,
    /// Unix seconds when this handle was made.
    created_at: i64,
}

impl Quotas {
    pub fn new(settings: QuotaSettings) -> Arc<Quotas> {
        Arc::new(Quotas {
            settings,
            db: ArcSwapOption::empty(),
            table: ArcSwap::from_pointee(Table::default()),
            resolved: ArcSwapOption::empty(),
            loaded_at: AtomicI64::new(0),
            stale_since: AtomicI64::new(0),
            loads: AtomicU64::new(0),
            changed: Notify::new(),
            connected: Notify::new(),
            writing: Mutex::new(()),
            listening: AtomicBool::new(false),
            created_at: now_s(),
        })
    }

    /// The override in force for the key hashed `key` under config `cfg` at `now` (Unix
    /// seconds).
    pub fn lookup_hash(&self, cfg: &Arc<Config>, key: KeyHash, now: i64) -> Lookup {
        let table = self.table.load();
        if table.by_key.is_empty() {
            return Lookup::None;
        }
        let resolved = self.resolved_for(cfg, &table);
        match resolved.by_key.get(&key) {
            Some(r) if r.in_force(now) => Lookup::Some(r.clone()),
            _ => Lookup::None,
        }
    }

    /// The table resolved against `cfg`, rebuilt when either has changed.
    fn resolved_for(&self, cfg: &Arc<Config>, table: &Arc<Table>) -> Arc<ResolvedTable> {
        if let Some(r) = self.resolved.load_full() {
            if Arc::ptr_eq(&r.config, cfg) && r.version == table.version {
                return r;
            }
        }
        let r = Arc::new(ResolvedTable::resolve(cfg, table));
        self.resolved.store(Some(r.clone()));
        r
    }

    /// The database, for the admin API; `Err` while it cannot be reached.
    pub fn db(&self) -> Option<Arc<Db>> {
        self.db.load_full()
    }

    /// The database, waiting up to `within` for the first connection: an admin call that
    /// arrives while a gateway is still starting gets an answer, not a 503.
    pub async fn db_within(&self, within: Duration) -> Option<Arc<Db>> {
        // Made before the check, so a connection between the two is not missed.
        let connected = self.connected.notified();
        if let Some(db) = self.db() {
            return Some(db);
        }
        let _ = tokio::time::timeout(within, connected).await;
        self.db()
    }

    /// Reload soon: a change was made through this gateway.
    pub fn changed(&self) {
        self.changed.notify_one();
    }

    /// Apply a change this gateway has just written (read-your-writes): the next request sees
    /// it, without waiting for the reload that follows.
    pub async fn apply(&self, change: Change) {
        let _writing = self.writing.lock().await;
        let table = self.table.load_full();
        let mut by_key = table.by_key.clone();
        match change {
            Change::Put(o) => {
                by_key.insert(o.key_hash, o);
            }
            Change::Delete(key) => {
                by_key.remove(&key);
            }
        }
        let version = table.version + 1;
        self.table.store(Arc::new(Table { by_key, version }));
    }

    /// For `/readyz`: the database, whether the overrides are loaded and how old they are,
    /// since when they are stale, and (PostgreSQL) whether changes are being listened for
    /// (never a reason to be unready: gateways serve with what they have).
    pub fn status_json(&self) -> serde_json::Value {
        let at = |v: &AtomicI64| {
            let t = v.load(Ordering::Relaxed);
            (t > 0).then(|| model::rfc3339(t))
        };
        let state = match (self.loaded_at.load(Ordering::Relaxed), self.is_stale()) {
            (0, _) => "not loaded: serving with the config file alone until the database answers",
            (_, true) => "stale: serving with the overrides last loaded",
            (_, false) => "loaded",
        };
        let loaded_at = self.loaded_at.load(Ordering::Relaxed);
        let db = self.db.load();
        serde_json::json!({
            "state": state,
            "loaded": loaded_at > 0,
            "age_s": (loaded_at > 0).then(|| (now_s() - loaded_at).max(0)),
            "database": self.settings.database_redacted(),
            "connected": db.is_some(),
            "listening": db.as_ref().filter(|d| d.is_postgres()).map(|_| self.listening.load(Ordering::Relaxed)),
            "overrides": self.table.load().by_key.len(),
            "loaded_at": at(&self.loaded_at),
            "stale_since": at(&self.stale_since),
            "loads": self.loads.load(Ordering::Relaxed),
        })
    }

    /// Seconds since the overrides were last loaded (since this handle was made, before the
    /// first load), for a metric.
    pub fn age_s(&self, now: i64) -> i64 {
        let t = self.loaded_at.load(Ordering::Relaxed);
        now - if t > 0 { t } else { self.created_at }
    }

    /// Whether the last load failed (or none has worked yet).
    pub fn is_stale(&self) -> bool {
        self.stale_since.load(Ordering::Relaxed) != 0 || self.loaded_at.load(Ordering::Relaxed) == 0
    }

    /// How many overrides are held.
    pub fn held(&self) -> usize {
        self.table.load().by_key.len()
    }

    /// Load every override from the database now.
    pub async fn reload(&self, db: &Db) -> Result<usize, DbError> {
        let _writing = self.writing.lock().await;
        let rows = db.all().await?;
        let n = rows.len();
        let version = self.table.load().version + 1;
        let by_key = rows.into_iter().map(|o| (o.key_hash, o)).collect();
        self.table.store(Arc::new(Table { by_key, version }));
        self.loads.fetch_add(1, Ordering::Relaxed);
        self.loaded_at.store(now_s(), Ordering::Relaxed);
        if self.stale_since.swap(0, Ordering::Relaxed) != 0 {
            tracing::info!(
                overrides = n,
                "quota overrides loaded again; no longer stale"
            );
        }
        Ok(n)
    }

    fn failed(&self, e: &dyn std::fmt::Display) {
        if self
            .stale_since
            .compare_exchange(0, now_s(), Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            tracing::warn!(
                "quota overrides cannot be loaded ({e}); serving with the last ones loaded"
            );
        }
    }

    /// The refresh task: connect (retrying), load, then reload every `refresh`, on a change
    /// made here, and (PostgreSQL) on a NOTIFY from any gateway. Runs until `shutdown`.
    pub async fn run(self: Arc<Self>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let db = tokio::select! {
            db = self.connect() => db,
            _ = shutdown.changed() => return,
        };
        if db.is_postgres() {
            tokio::spawn(self.clone().listen(shutdown.clone()));
        }
        let mut tick = tokio::time::interval(self.settings.refresh);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let retry = RELOAD_RETRY.min(self.settings.refresh);
        let mut failed = false;
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tick.tick() => {}
                _ = self.changed.notified() => {}
                _ = tokio::time::sleep(retry), if failed => {}
            }
            failed = match self.reload(&db).await {
                Ok(_) => false,
                Err(e) => {
                    self.failed(&e);
                    true
                }
            };
        }
    }

    /// Connect and load, retrying until the database answers.
    async fn connect(&self) -> Arc<Db> {
        let mut pause = Duration::from_millis(200);
        loop {
            match Db::connect(&self.settings.database, CONNECT_TIMEOUT).await {
                Ok(db) => {
                    let db = Arc::new(db);
                    self.db.store(Some(db.clone()));
                    self.connected.notify_waiters();
                    match self.reload(&db).await {
                        Ok(n) => {
                            tracing::info!(overrides = n, database = %self.settings.database_redacted(), "quota overrides loaded")
                        }
                        Err(e) => self.failed(&e),
                    }
                    return db;
                }
                Err(e) => {
                    self.failed(&e);
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MAX_RETRY);
                }
            }
        }
    }

    /// PostgreSQL: reload as soon as any gateway announces a change, and in full on every
    /// (re)connect of the listening connection, since announcements sent while it was down are
    /// lost. The connection is never reconnected behind our back (sqlx's `recv` would, and
    /// nothing would reload): a lost connection ends `try_recv` with `None`, and it is made
    /// again here, at most [`LISTEN_RETRY`] apart.
    async fn listen(self: Arc<Self>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let mut pause = Duration::from_millis(50);
        loop {
            let mut l = tokio::select! {
                l = self.listener() => l,
                _ = shutdown.changed() => return,
            };
            match &mut l {
                Ok(l) => {
                    pause = Duration::from_millis(50);
                    self.listening.store(true, Ordering::Relaxed);
                    // Whatever was announced before this LISTEN took effect is read now.
                    self.changed.notify_one();
                    loop {
                        tokio::select! {
                            _ = shutdown.changed() => return,
                            n = l.try_recv() => match n {
                                Ok(Some(_)) => self.changed.notify_one(),
                                Ok(None) => { tracing::info!("quota LISTEN connection lost; reconnecting"); break }
                                Err(e) => { tracing::info!("quota LISTEN connection lost ({e}); reconnecting"); break }
                            }
                        }
                    }
                    self.listening.store(false, Ordering::Relaxed);
                }
                Err(e) => tracing::debug!("quota LISTEN failed: {e}"),
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(LISTEN_RETRY);
        }
    }

    /// A listening connection on [`db::CHANNEL`] that does not reconnect by itself.
    async fn listener(&self) -> Result<sqlx::postgres::PgListener, sqlx::Error> {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .max_lifetime(None)
            .idle_timeout(None)
            .acquire_timeout(CONNECT_TIMEOUT)
            .connect(&self.settings.database)
            .await?;
        let mut l = sqlx::postgres::PgListener::connect_with(&pool).await?;
        l.eager_reconnect(false);
        l.listen(db::CHANNEL).await?;
        Ok(l)
    }
}
