//! Starting and stopping: the open-file limit at start, and the shutdown sequence that the
//! fleet (balancers, Kubernetes) relies on.
//!
//! On SIGTERM or SIGINT:
//! 1. `/readyz` answers 503 at once, and idle keep-alive connections are closed;
//! 2. for `server.drain_period` the proxy keeps accepting and serving, with
//!    `Connection: close` on every response, so a balancer that has not yet seen the 503 loses
//!    nothing;
//! 3. then it stops accepting, lets the requests in flight (heads still arriving included,
//!    and for up to a second the first bytes of connections accepted just before) finish
//!    within `server.grace_period`, and exits as soon as none is left.
//!
//! A second SIGINT exits at once. SIGQUIT hands the listening sockets to a new process
//! started with `--upgrade` (Pingora's graceful upgrade), then drains the same way but stays
//! ready: the new process answers `/readyz` on the same address.
//!
//! Phase: startup and shutdown; hooks read [`Lifecycle::draining`] per request (one atomic).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use parking_lot::Mutex;
use pingora_core::server::{ExecutionPhase, ShutdownSignal, ShutdownSignalWatch};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::broadcast;

use crate::conn::Connections;

/// How long the shutdown waits for connections accepted just before the listener stopped to
/// send the first byte of their request (their clients are sending it).
const FIRST_BYTE_WAIT: Duration = Duration::from_secs(1);

/// A function run just before the process exits (flushing logs).
pub type AtExit = Box<dyn FnOnce() + Send>;

/// How the gateway stops.
pub struct Lifecycle {
    draining: AtomicBool,
    /// Not ready: `/readyz` answers 503 (set on SIGTERM/SIGINT, not on an upgrade, where the
    /// new process answers on the same address).
    stopping: AtomicBool,
    conns: Arc<Connections>,
    drain_period: Duration,
    grace_period: Duration,
    at_exit: Mutex<Vec<AtExit>>,
}

impl Lifecycle {
    pub fn new(
        conns: Arc<Connections>,
        drain_period: Duration,
        grace_period: Duration,
    ) -> Arc<Self> {
        Arc::new(Lifecycle {
            draining: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            conns,
            drain_period,
            grace_period,
            at_exit: Mutex::new(Vec::new()),
        })
    }

    /// The gateway is shutting down or handing over: every response closes its connection.
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// The gateway is shutting down: `/readyz` answers 503.
    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }

    /// Run `f` just before the process exits.
    pub fn at_exit(&self, f: AtExit) {
        self.at_exit.lock().push(f);
    }

    /// Close idle connections and every connection after its response; `stopping`: also
    /// answer not ready.
    fn start_draining(&self, stopping: bool) {
        self.stopping.fetch_or(stopping, Ordering::Relaxed);
        if !self.draining.swap(true, Ordering::Relaxed) {
            let closed = self.conns.close_idle();
            if stopping {
                tracing::info!(
                    drain_period = ?self.drain_period,
                    idle_closed = closed,
                    "shutting down: not ready; serving with Connection: close during the drain period"
                );
            } else {
                tracing::info!(
                    idle_closed = closed,
                    "handing the listening sockets over (SIGQUIT)"
                );
            }
        }
    }

    /// Pingora's shutdown signal: SIGTERM and SIGINT drain first (see the module docs).
    pub fn signals(self: &Arc<Self>) -> Box<dyn ShutdownSignalWatch + Send + Sync> {
        Box::new(Signals(self.clone()))
    }

    /// Watch Pingora's execution phases (on a thread of its own) and exit as soon as the
    /// requests in flight have finished, instead of sleeping out the whole grace period.
    pub fn exit_when_idle(self: &Arc<Self>, phases: broadcast::Receiver<ExecutionPhase>) {
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name("tollgate shutdown".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime for the shutdown watch");
                rt.block_on(me.watch(phases));
            });
        if let Err(e) = spawned {
            tracing::warn!("cannot watch the shutdown: {e}; the whole grace period will be waited");
        }
    }

    async fn watch(self: Arc<Self>, mut phases: broadcast::Receiver<ExecutionPhase>) {
        let mut stopped_at = None;
        loop {
            match phases.recv().await {
                Ok(ExecutionPhase::ShutdownStarted) => stopped_at = Some(Instant::now()),
                Ok(ExecutionPhase::ShutdownGracePeriod) => break,
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
        let stopped_at = stopped_at.unwrap_or_else(Instant::now);
        let deadline = stopped_at + self.grace_period;
        let mut interrupt = signal(SignalKind::interrupt()).ok();
        loop {
            let left = self.conns.in_flight();
            let arriving = if stopped_at.elapsed() < FIRST_BYTE_WAIT.min(self.grace_period) {
                self.conns.fresh()
            } else {
                0
            };
            if (left == 0 && arriving == 0) || Instant::now() >= deadline {
                if left > 0 {
                    tracing::warn!(
                        in_flight = left,
                        "grace period over; exiting with requests in flight"
                    );
                }
                break;
            }
            let pause = tokio::time::sleep(Duration::from_millis(10));
            match interrupt.as_mut() {
                Some(int) => tokio::select! {
                    _ = pause => {}
                    _ = int.recv() => break,
                },
                None => pause.await,
            }
        }
        self.exit();
    }

    fn exit(&self) -> ! {
        for f in self.at_exit.lock().drain(..) {
            f();
        }
        tracing::info!("stopped");
        std::process::exit(0)
    }
}

struct Signals(Arc<Lifecycle>);

#[async_trait]
impl ShutdownSignalWatch for Signals {
    async fn recv(&self) -> ShutdownSignal {
        let (Ok(mut int), Ok(mut term), Ok(mut quit)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
            signal(SignalKind::quit()),
        ) else {
            tracing::error!("cannot catch SIGINT, SIGTERM and SIGQUIT");
            return std::future::pending().await;
        };
        tokio::select! {
            _ = quit.recv() => {
                self.0.start_draining(false);
                return ShutdownSignal::GracefulUpgrade;
            }
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        self.0.start_draining(true);
        tokio::select! {
            _ = tokio::time::sleep(self.0.drain_period) => ShutdownSignal::GracefulTerminate,
            _ = int.recv() => ShutdownSignal::FastShutdown,
        }
    }
}

/// Raise the soft limit on open files to the hard limit, and return the soft limit in force.
pub fn raise_open_files() -> Option<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    if soft < hard {
        match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => {
                tracing::info!(from = soft, to = hard, hard, "raised the open-file limit");
                return Some(hard);
            }
            Err(e) => tracing::warn!(soft, hard, "cannot raise the open-file limit: {e}"),
        }
    } else {
        tracing::info!(soft, hard, "open-file limit");
    }
    Some(soft)
}
