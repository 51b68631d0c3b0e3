//! Wiring: build the store, the proxy service (behind the connection guard), the admin
//! listener and the background tasks (config reload, memory sweeping) on one Pingora server,
//! and run it until the shutdown sequence of [`crate::lifecycle`] ends it.
//!
//! Phase: startup. Nothing here runs per request.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora_core::apps::HttpServerOptions;
use pingora_core::server::configuration::{Opt, ServerConf};
use pingora_core::server::{RunArgs, Server, ShutdownWatch};
use pingora_core::services::background::{background_service, BackgroundService};
use pingora_core::services::listening::Service;

use crate::admin::Admin;
use crate::config::reload::ConfigHandle;
use crate::config::ServerSettings;
use crate::conn::{proxy_cap, Connections, Guard, Phased};
use crate::demo::DemoUpstream;
use crate::lifecycle::{raise_open_files, Lifecycle};
use crate::limit::{Clock, SystemClock};
use crate::observe::Observer;
use crate::pingora_patches;
use crate::proxy::Gateway;
use crate::quota::Quotas;
use crate::shed::Shedder;
use crate::store::over_limit::changed_limits;
use crate::store::{Invalidation, Store};

/// How often the memory store drops expired keys.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(10);
/// How often ended quota leases are given back.
const LEASE_SWEEP: Duration = Duration::from_millis(50);

/// A startup failure, printed before exiting with status 1.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot set up the store: {0}")]
    Store(crate::store::StoreError),
    #[error("cannot open the access log: {0}")]
    AccessLog(std::io::Error),
    #[error("{0}")]
    UpgradeDir(#[from] crate::upgrade::UpgradeDirError),
    #[error("cannot listen on {addr} ({what}): {source}")]
    Listen {
        addr: SocketAddr,
        what: &'static str,
        source: std::io::Error,
    },
}

/// How to start.
#[derive(Debug, Clone, Copy, Default)]
pub struct StartOptions {
    /// Take the listening sockets over from a running gateway (`--upgrade`).
    pub upgrade: bool,
}

fn check_bind(addr: SocketAddr, what: &'static str) -> Result<(), StartError> {
    TcpListener::bind(addr)
        .map(drop)
        .map_err(|source| StartError::Listen { addr, what, source })
}

/// The Unix socket an upgrading process takes the listening sockets over through: the
/// configured one, or one per proxy port in a private directory ([`crate::upgrade`]).
pub fn upgrade_sock(s: &ServerSettings) -> PathBuf {
    crate::upgrade::sock_path(s)
}

/// Pingora's options for the proxy's HTTP sessions (`examples/bare_pingora` runs on them too):
/// request heads keep their header names' case only with `server.preserve_header_case`.
pub fn server_options(s: &ServerSettings) -> HttpServerOptions {
    let mut options = HttpServerOptions::default();
    pingora_patches::server_header_case(&mut options, s.preserve_header_case);
    options
}

/// Pingora's process-wide settings for the proxy (`examples/bare_pingora` takes them too):
/// streams do not time their reads' and writes' waits, which nothing here asks for and which
/// cost two clock reads a wait (Pingora pull request 30, `patches/README.md`).
pub fn pingora_process_settings() {
    pingora_patches::no_pending_time_accounting();
}

/// Pingora's settings for the proxy (`examples/bare_pingora` runs on them too).
pub fn pingora_conf(s: &ServerSettings) -> ServerConf {
    let mut conf = ServerConf {
        threads: s.threads,
        work_stealing: s.work_stealing,
        upstream_keepalive_pool_size: s.upstream_keepalive_pool,
        // Pingora's grace period is a fixed sleep; the lifecycle exits as soon as the requests
        // in flight are done, and this is only the backstop (rounded up to whole seconds).
        grace_period_seconds: Some(s.grace_period.as_secs_f64().ceil() as u64 + 1),
        graceful_shutdown_timeout_seconds: Some(1),
        upgrade_sock: upgrade_sock(s).display().to_string(),
        ..ServerConf::default()
    };
    // On single-threaded runtimes, every upstream timeout of a second or more runs on the
    // runtime's own tokio timer, not Pingora's shared "fast" timer map (a lock, a B-tree and a
    // clock thread ticking every 10 ms): with one thread, 1-2% fewer instructions and 0-6% less
    // CPU per request. On the work-stealing runtime, tokio's timer cost 6-9% more CPU with a
    // limit (two threads), so Pingora's default stays
    // (`loadtest/log/2026-11-25-peer-options-floor.md`).
    if !s.work_stealing {
        conf.fast_timeout_to_tokio_threshold_seconds = Some(0);
    }
    conf
}

struct Maintenance {
    config: Arc<ConfigHandle>,
    /// The proxy's and the admin listener's connections: a reload sets their head size.
    conns: [Arc<Connections>; 2],
    store: Arc<Store>,
    quotas: Option<Arc<Quotas>>,
}

#[async_trait]
impl BackgroundService for Maintenance {
    async fn start(&self, shutdown: ShutdownWatch) {
        let watch = tokio::spawn(self.config.clone().watch(shutdown.clone()));
        let quotas = self
            .quotas
            .clone()
            .map(|q| tokio::spawn(q.run(shutdown.clone())));
        let store = self.store.clone();
        let follow = tokio::spawn(store.clone().follow_invalidations(shutdown.clone()));
        let mut shutdown = shutdown;
        let mut tick = tokio::time::interval(SWEEP_INTERVAL);
        // Woken by each reload (to drop cached denials of the limits it changed; lookups
        // check each denial's quota anyway), and by a lease sweep only where there are leases:
        // an idle gateway's maintenance thread is not woken 30 times a second.
        let mut reloads = self.config.reloads();
        let mut leases = tokio::time::interval(LEASE_SWEEP);
        let leasing = store.redis_store().is_some() && store.leases().enabled();
        let mut config = self.config.snapshot();
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = tick.tick() => {
                    let removed = store.sweep(SystemClock.now_ms());
                    tracing::debug!(removed, "swept expired counters");
                }
                _ = leases.tick(), if leasing => store.sweep_leases().await,
                Ok(()) = reloads.changed() => {
                    // A reload that changed limits drops their cached denials, everywhere.
                    let next = self.config.snapshot();
                    if !Arc::ptr_eq(&next, &config) {
                        for conns in &self.conns {
                            conns.set_max_head(next.http.max_request_header_bytes);
                        }
                        let changed = changed_limits(&config, &next);
                        if !changed.is_empty() {
                            store.invalidate(Invalidation::Limits(changed)).await;
                        }
                        config = next;
                    }
                }
            }
        }
        // Leases end with the process: their unspent units go back.
        store.leases().mark(&Invalidation::All);
        store.sweep_leases().await;
        let _ = follow.await;
        let _ = watch.await;
        if let Some(q) = quotas {
            let _ = q.await;
        }
    }
}

/// Run the gateway until the shutdown sequence ends it (see [`crate::lifecycle`]).
pub fn run(config: Arc<ConfigHandle>, opts: StartOptions) -> Result<(), StartError> {
    let cfg = config.snapshot();
    let s = &cfg.startup.server;
    if !opts.upgrade {
        // An upgrading process takes these sockets over from the running one instead.
        check_bind(s.listen, "server.listen")?;
        check_bind(s.admin_listen, "server.admin_listen")?;
    }
    crate::upgrade::prepare(s)?;
    let open_files = raise_open_files();
    let opt = Opt {
        upgrade: opts.upgrade,
        ..Opt::default()
    };
    pingora_process_settings();
    let mut server = Server::new_with_opt_and_conf(Some(opt), pingora_conf(s));
    server.bootstrap();

    let store = Arc::new(Store::new(&cfg.startup.store).map_err(StartError::Store)?);
    let shedder = Shedder::leaked();
    let admin_cap = cfg.admin.max_connections;
    let cap = proxy_cap(s.max_connections, admin_cap, open_files);
    let max_head = cfg.http.max_request_header_bytes;
    let conns = Connections::new(cap, s.header_timeout, max_head);
    let admin_conns = Connections::admin(admin_cap, s.header_timeout, max_head);
    let lifecycle = Lifecycle::new(conns.clone(), s.drain_period, s.grace_period);
    let quotas = cfg.startup.quotas.clone().map(Quotas::new);
    let observer = observer(&config, &store, shedder, &lifecycle, &quotas)?;
    let gateway = Gateway {
        config: config.clone(),
        quotas: quotas.clone(),
        store: store.clone(),
        clock: Arc::new(SystemClock),
        shedder,
        lifecycle: lifecycle.clone(),
        observer: observer.clone(),
    };
    let mut proxy = pingora_proxy::http_proxy(&server.configuration, gateway);
    proxy.server_options = Some(server_options(s));
    let mut proxy = Service::new(
        "tollgate proxy".to_string(),
        Guard::new(proxy, conns.clone()),
    );
    proxy.add_tcp(&s.listen.to_string());

    let admin = Admin {
        config: config.clone(),
        store: store.clone(),
        shedder,
        conns: conns.clone(),
        lifecycle: lifecycle.clone(),
        observer,
        quotas: quotas.clone(),
        sessions: Default::default(),
    };
    let admin = Guard::new(Phased::new(admin, config.clone()), admin_conns.clone());
    let mut admin = Service::new("tollgate admin".to_string(), admin);
    admin.add_tcp(&s.admin_listen.to_string());

    let maintenance = background_service(
        "tollgate maintenance",
        Maintenance {
            config,
            conns: [conns.clone(), admin_conns],
            store,
            quotas,
        },
    );

    log_start(&cfg, conns.cap(), opts.upgrade);
    server.add_service(proxy);
    server.add_service(admin);
    server.add_service(maintenance);
    lifecycle.exit_when_idle(server.watch_execution_phase());
    server.run(RunArgs {
        shutdown_signal: lifecycle.signals(),
    });
    Ok(())
}

/// Metrics, top callers and the access log; its lines are flushed when the process exits.
fn observer(
    config: &Arc<ConfigHandle>,
    store: &Arc<Store>,
    shedder: &'static Shedder,
    lifecycle: &Lifecycle,
    quotas: &Option<Arc<Quotas>>,
) -> Result<Arc<Observer>, StartError> {
    let observer = Observer::new(config.clone(), store.clone(), shedder);
    let observer = observer.map_err(StartError::AccessLog)?;
    let observer = Arc::new(observer.with_quotas(quotas.clone()));
    let flushed = observer.clone();
    lifecycle.at_exit(Box::new(move || flushed.flush(Duration::from_millis(200))));
    Ok(observer)
}

fn log_start(cfg: &crate::config::Config, max_connections: usize, upgrade: bool) {
    let s = &cfg.startup.server;
    tracing::info!(
        listen = %s.listen,
        admin = %s.admin_listen,
        config = %cfg.source,
        routes = cfg.routes.len(),
        limits = cfg.limits.len(),
        threads = s.threads,
        work_stealing = s.work_stealing,
        upstream_keepalive_pool = s.upstream_keepalive_pool,
        store = %cfg.startup.store.backend,
        quotas = cfg.startup.quotas.as_ref().map_or("none", |q| q.backend_name()),
        max_connections,
        admin_max_connections = cfg.admin.max_connections,
        upgrade,
        "tollgate starting"
    );
    if !s.admin_listen.ip().is_loopback() && cfg.admin.token_hash.is_none() {
        tracing::warn!(
            admin = %s.admin_listen,
            "the admin listener is not on loopback and no admin token is set: /healthz, /readyz \
             and /metrics are open to anyone who reaches it, and /stats, /top, the live page and \
             /admin/v1 answer 403; set admin.token_env to the name of an environment variable \
             holding a token"
        );
    }
}

/// Run the demo upstream until stopped.
pub fn run_demo_upstream(listen: SocketAddr) -> Result<(), StartError> {
    check_bind(listen, "--listen")?;
    let conf = ServerConf {
        threads: 1,
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut svc = Service::new(
        "tollgate demo upstream".to_string(),
        DemoUpstream::default(),
    );
    svc.add_tcp(&listen.to_string());
    tracing::info!(%listen, "demo upstream listening");
    server.add_service(svc);
    server.run_forever()
}
