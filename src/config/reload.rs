//! Hot reload: on SIGHUP, and when the file's contents change, validate the file again and
//! swap the new [`Config`] in atomically. A request keeps the snapshot it started with; a bad
//! file is logged and the last good config keeps serving.
//!
//! Phase: a background task, never on the request path. Requests only call
//! [`ConfigHandle::snapshot`].

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use super::{load, Config, ConfigErrors, Overrides};

/// How often the file is compared with what was last loaded.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// How often a received SIGHUP is looked for.
pub const SIGNAL_INTERVAL: Duration = Duration::from_millis(100);

/// The live configuration and where it came from.
pub struct ConfigHandle {
    current: ArcSwap<Config>,
    path: Option<PathBuf>,
    overrides: Overrides,
    /// Hash of the file contents last attempted (good or bad), so a bad file is reported once.
    last_seen: AtomicU64,
    /// Successful reloads since start.
    pub generation: AtomicU64,
    /// Reloads rejected (the file did not validate) since start.
    pub rejected: AtomicU64,
    /// Whether the last reload attempt succeeded (true before any).
    pub last_reload_ok: AtomicBool,
    /// Set by the SIGHUP handler, cleared by the watcher.
    hup: Arc<AtomicBool>,
}

impl ConfigHandle {
    pub fn new(config: Config, path: Option<PathBuf>, overrides: Overrides) -> Self {
        let last_seen = path
            .as_ref()
            .and_then(|p| std::fs::read(p).ok())
            .map_or(0, |b| content_hash(&b));
        ConfigHandle {
            current: ArcSwap::from_pointee(config),
            path,
            overrides,
            last_seen: AtomicU64::new(last_seen),
            generation: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            last_reload_ok: AtomicBool::new(true),
            hup: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Catch SIGHUP from now on (its default action would end the process). Call this as
    /// early as possible; [`ConfigHandle::watch`] acts on it.
    pub fn catch_sighup(&self) -> std::io::Result<()> {
        signal_hook::flag::register(signal_hook::consts::SIGHUP, self.hup.clone()).map(drop)
    }

    /// The config a request runs on, from start to end.
    pub fn snapshot(&self) -> Arc<Config> {
        self.current.load_full()
    }

    /// Validate the file again and swap it in. On error the current config stays.
    pub fn reload(&self) -> Result<Arc<Config>, ConfigErrors> {
        let Some(path) = &self.path else {
            return Ok(self.snapshot());
        };
        if let Ok(bytes) = std::fs::read(path) {
            self.last_seen
                .store(content_hash(&bytes), Ordering::Relaxed);
        }
        let mut next = load(path, &self.overrides).inspect_err(|_| {
            self.rejected.fetch_add(1, Ordering::Relaxed);
            self.last_reload_ok.store(false, Ordering::Relaxed);
        })?;
        let old = self.current.load();
        let changed = old.startup.changes(&next.startup);
        if !changed.is_empty() {
            tracing::warn!(
                "{} changed in {}; these take effect on restart, the running values stay",
                changed.join(", "),
                path.display()
            );
        }
        // The snapshot says what is in effect: the settings read at start stay.
        next.startup = old.startup.clone();
        let next = Arc::new(next);
        self.current.store(next.clone());
        self.generation.fetch_add(1, Ordering::Relaxed);
        self.last_reload_ok.store(true, Ordering::Relaxed);
        Ok(next)
    }

    /// Reload if the file's contents differ from what was last loaded or rejected.
    fn reload_if_changed(&self) {
        let Some(path) = &self.path else { return };
        let Ok(bytes) = std::fs::read(path) else {
            return;
        };
        if content_hash(&bytes) != self.last_seen.load(Ordering::Relaxed) {
            self.reload_logged("file changed");
        }
    }

    fn reload_logged(&self, why: &str) {
        match self.reload() {
            Ok(c) => tracing::info!(
                source = %c.source,
                routes = c.routes.len(),
                limits = c.limits.len(),
                "config reloaded ({why})"
            ),
            Err(e) => tracing::error!(
                "config reload rejected ({why}); still serving the last good config:\n{e}"
            ),
        }
    }

    /// Runs until `shutdown` resolves: reloads on SIGHUP and on file change.
    pub async fn watch(self: Arc<Self>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(SIGNAL_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let polls_per_check = (POLL_INTERVAL.as_millis() / SIGNAL_INTERVAL.as_millis()).max(1);
        let mut n: u128 = 0;
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tick.tick() => {
                    n += 1;
                    if self.hup.swap(false, Ordering::Relaxed) {
                        self.reload_logged("SIGHUP");
                    } else if n.is_multiple_of(polls_per_check) {
                        self.reload_if_changed();
                    }
                }
            }
        }
    }
}

fn content_hash(bytes: &[u8]) -> u64 {
    let h = blake3::hash(bytes);
    u64::from_le_bytes(h.as_bytes()[..8].try_into().expect("8 bytes"))
}
