//! Hot reload: on SIGHUP, and when the file's contents change, validate the file again and
//! swap the new [`Config`] in atomically. A change is applied only once the file has settled
//! (two reads [`SETTLE`] apart agree), so a file rewritten in place is never applied
//! half-written; write it atomically (write a sibling, rename over it) all the same. A request keeps the snapshot it started with; a bad
//! file is logged and the last good config keeps serving.
//!
//! Phase: a background task, never on the request path. Requests only call
//! [`ConfigHandle::snapshot`].

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::{ArcSwap, Cache};

use super::{from_file_text, Config, ConfigErrors, Overrides};

/// How often the file is compared with what was last loaded.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// How often a received SIGHUP is looked for.
pub const SIGNAL_INTERVAL: Duration = Duration::from_millis(100);
/// A changed file is applied only when two reads this far apart have the same contents.
pub const SETTLE: Duration = Duration::from_millis(200);
/// Reads of a file that keeps changing before a reload gives up (until the next poll).
pub const SETTLE_ATTEMPTS: usize = 25;

/// A thread's copy of the current config's `Arc` ([`ConfigHandle::snapshot`]).
type Snapshots = Cache<Arc<ArcSwap<Config>>, Arc<Config>>;

thread_local! {
    /// This thread's copy of the current config of the handle it last asked (one per process,
    /// but for tests), revalidated by one plain load: a snapshot then costs one reference-count
    /// increment, where `ArcSwap::load_full` costs three atomic read-modify-writes.
    static SNAPSHOTS: RefCell<Option<Snapshots>> = const { RefCell::new(None) };
}

/// The live configuration and where it came from.
pub struct ConfigHandle {
    current: Arc<ArcSwap<Config>>,
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
    /// Signalled after each successful reload (the count is `generation`).
    reloaded: tokio::sync::watch::Sender<()>,
}

impl ConfigHandle {
    pub fn new(config: Config, path: Option<PathBuf>, overrides: Overrides) -> Self {
        let last_seen = path
            .as_ref()
            .and_then(|p| std::fs::read(p).ok())
            .map_or(0, |b| content_hash(&b));
        ConfigHandle {
            current: Arc::new(ArcSwap::from_pointee(config)),
            path,
            overrides,
            last_seen: AtomicU64::new(last_seen),
            generation: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            last_reload_ok: AtomicBool::new(true),
            hup: Arc::new(AtomicBool::new(false)),
            reloaded: tokio::sync::watch::Sender::new(()),
        }
    }

    /// A receiver that sees each successful reload from now on (`changed()`).
    pub fn reloads(&self) -> tokio::sync::watch::Receiver<()> {
        self.reloaded.subscribe()
    }

    /// Catch SIGHUP from now on (its default action would end the process). Call this as
    /// early as possible; [`ConfigHandle::watch`] acts on it.
    pub fn catch_sighup(&self) -> std::io::Result<()> {
        signal_hook::flag::register(signal_hook::consts::SIGHUP, self.hup.clone()).map(drop)
    }

    /// The config a request runs on, from start to end. Each thread keeps a copy of the
    /// current one's `Arc` and sees a reload at its next snapshot (until then the copy keeps
    /// the config it replaced alive).
    pub fn snapshot(&self) -> Arc<Config> {
        SNAPSHOTS.with_borrow_mut(|cache| {
            let cache = match cache {
                Some(c) if std::ptr::eq(c.arc_swap(), &*self.current) => c,
                _ => cache.insert(Cache::new(self.current.clone())),
            };
            cache.load().clone()
        })
    }

    /// Read the file again, once it has settled, validate it and swap it in. On error the
    /// current config stays.
    pub async fn reload(&self) -> Result<Arc<Config>, ConfigErrors> {
        let Some(path) = &self.path else {
            return Ok(self.snapshot());
        };
        let label = path.display().to_string();
        let bytes = settled_read(path).await.map_err(|e| {
            ConfigErrors(vec![format!("{label}: cannot read a settled version: {e}")])
        })?;
        self.apply(&label, &bytes)
    }

    /// Validate `bytes` (the file's contents) and swap them in.
    fn apply(&self, label: &str, bytes: &[u8]) -> Result<Arc<Config>, ConfigErrors> {
        self.last_seen.store(content_hash(bytes), Ordering::Relaxed);
        let text = std::str::from_utf8(bytes)
            .map_err(|e| ConfigErrors(vec![format!("{label}: not UTF-8: {e}")]))?;
        let mut next = from_file_text(label, text, &self.overrides).inspect_err(|_| {
            self.rejected.fetch_add(1, Ordering::Relaxed);
            self.last_reload_ok.store(false, Ordering::Relaxed);
        })?;
        let old = self.current.load();
        let changed = old.startup.changes(&next.startup);
        if !changed.is_empty() {
            tracing::warn!(
                "{} changed in {label}; these take effect on restart, the running values stay",
                changed.join(", "),
            );
        }
        // The snapshot says what is in effect: the settings read at start stay.
        next.startup = old.startup.clone();
        let next = Arc::new(next);
        self.current.store(next.clone());
        self.generation.fetch_add(1, Ordering::Relaxed);
        self.last_reload_ok.store(true, Ordering::Relaxed);
        self.reloaded.send_replace(());
        Ok(next)
    }

    /// Reload if the file's contents differ from what was last loaded or rejected.
    async fn reload_if_changed(&self) {
        let Some(path) = &self.path else { return };
        let Ok(bytes) = std::fs::read(path) else {
            return;
        };
        if content_hash(&bytes) != self.last_seen.load(Ordering::Relaxed) {
            self.reload_logged("file changed").await;
        }
    }

    async fn reload_logged(&self, why: &str) {
        match self.reload().await {
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

    /// Runs until `shutdown` resolves: reloads on SIGHUP (at once) and on file change (looked
    /// for every [`POLL_INTERVAL`]). The flag [`Self::catch_sighup`] set keeps a SIGHUP that
    /// came before this ran; should the signal stream be unavailable, the flag is looked at
    /// every [`SIGNAL_INTERVAL`].
    pub async fn watch(self: Arc<Self>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hups = signal(SignalKind::hangup()).ok();
        let mut flag = tokio::time::interval(SIGNAL_INTERVAL);
        let mut files = tokio::time::interval(POLL_INTERVAL);
        files.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let file_due = tokio::select! {
                _ = shutdown.changed() => return,
                Some(()) = next_hup(&mut hups) => false,
                _ = flag.tick(), if hups.is_none() => false,
                _ = files.tick() => true,
            };
            if self.hup.swap(false, Ordering::Relaxed) {
                self.reload_logged("SIGHUP").await;
            } else if file_due {
                self.reload_if_changed().await;
            }
        }
    }
}

/// The next SIGHUP on `hups`; never, without the stream.
async fn next_hup(hups: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match hups {
        Some(h) => h.recv().await,
        None => std::future::pending().await,
    }
}

/// The file's contents once two reads [`SETTLE`] apart agree: a file written in place is never
/// applied half-written (nor is a ConfigMap mid-swap). Gives up after [`SETTLE_ATTEMPTS`].
async fn settled_read(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut first = std::fs::read(path)?;
    for _ in 0..SETTLE_ATTEMPTS {
        tokio::time::sleep(SETTLE).await;
        let second = std::fs::read(path)?;
        if second == first {
            return Ok(second);
        }
        first = second;
    }
    Err(std::io::Error::other(format!(
        "still changing after {} reads {SETTLE:?} apart",
        SETTLE_ATTEMPTS + 1
    )))
}

fn content_hash(bytes: &[u8]) -> u64 {
    let h = blake3::hash(bytes);
    u64::from_le_bytes(h.as_bytes()[..8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load;

    fn yaml(route: &str) -> String {
        format!(
            "upstreams: {{ b: [\"127.0.0.1:9\"] }}\n\
             routes: [ {{ name: {route}, match: {{ path_prefix: / }}, upstream: b }} ]\n"
        )
    }

    fn handle(dir: &Path, route: &str) -> ConfigHandle {
        let path = dir.join(format!("{route}.yaml"));
        std::fs::write(&path, yaml(route)).unwrap();
        let cfg = load(&path, &Overrides::default()).unwrap();
        ConfigHandle::new(cfg, Some(path), Overrides::default())
    }

    /// A thread's kept copy of the config is the current one: after a reload its next
    /// snapshot is the new config, on this thread and on another, and two handles asked in
    /// turn on one thread each give their own.
    #[tokio::test]
    async fn a_snapshot_is_the_current_config_of_its_own_handle() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (handle(dir.path(), "a"), handle(dir.path(), "b"));
        let route = |h: &ConfigHandle| h.snapshot().routes[0].name.to_string();
        assert_eq!(
            (route(&a), route(&b), route(&a)),
            ("a".into(), "b".into(), "a".into())
        );
        let first = a.snapshot();
        assert!(
            Arc::ptr_eq(&first, &a.snapshot()),
            "the same config, not a copy"
        );

        std::fs::write(a.path.as_ref().unwrap(), yaml("a2")).unwrap();
        a.reload().await.unwrap();
        assert_eq!(route(&a), "a2");
        assert_eq!(
            std::thread::scope(|s| s.spawn(|| route(&a)).join().unwrap()),
            "a2"
        );
        assert_eq!(
            &*first.routes[0].name, "a",
            "a request keeps the config it started with"
        );
        assert_eq!(route(&b), "b");
    }
}
