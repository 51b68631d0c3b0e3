//! Wiring: build the store, the proxy service, the admin listener and the background tasks
//! (config reload, memory sweeping) on one Pingora server, and run it.
//!
//! Phase: startup. Nothing here runs per request.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora_core::server::configuration::ServerConf;
use pingora_core::server::{Server, ShutdownWatch};
use pingora_core::services::background::{background_service, BackgroundService};
use pingora_core::services::listening::Service;

use crate::admin::Admin;
use crate::config::reload::ConfigHandle;
use crate::demo::DemoUpstream;
use crate::limit::{Clock, SystemClock};
use crate::observe::Observer;
use crate::proxy::Gateway;
use crate::shed::Shedder;
use crate::store::Store;

/// How often the memory store drops expired keys.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(10);

/// A startup failure, printed before exiting with status 1.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot set up the store: {0}")]
    Store(crate::store::StoreError),
    #[error("cannot open the access log: {0}")]
    AccessLog(std::io::Error),
    #[error("cannot listen on {addr} ({what}): {source}")]
    Listen {
        addr: SocketAddr,
        what: &'static str,
        source: std::io::Error,
    },
}

fn check_bind(addr: SocketAddr, what: &'static str) -> Result<(), StartError> {
    TcpListener::bind(addr)
        .map(drop)
        .map_err(|source| StartError::Listen { addr, what, source })
}

fn pingora_conf(threads: usize, grace: Duration) -> ServerConf {
    ServerConf {
        threads,
        grace_period_seconds: Some(grace.as_secs()),
        graceful_shutdown_timeout_seconds: Some(grace.as_secs().max(1)),
        ..ServerConf::default()
    }
}

struct Maintenance {
    config: Arc<ConfigHandle>,
    store: Arc<Store>,
}

#[async_trait]
impl BackgroundService for Maintenance {
    async fn start(&self, shutdown: ShutdownWatch) {
        let watch = tokio::spawn(self.config.clone().watch(shutdown.clone()));
        let store = self.store.clone();
        let mut shutdown = shutdown;
        let mut tick = tokio::time::interval(SWEEP_INTERVAL);
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = tick.tick() => {
                    let removed = store.sweep(SystemClock.now_ms());
                    tracing::debug!(removed, "swept expired counters");
                }
            }
        }
        let _ = watch.await;
    }
}

/// Run the gateway until it is told to stop (SIGINT, SIGTERM).
pub fn run(config: Arc<ConfigHandle>) -> Result<(), StartError> {
    let cfg = config.snapshot();
    let startup = &cfg.startup;
    check_bind(startup.server.listen, "server.listen")?;
    check_bind(startup.server.admin_listen, "server.admin_listen")?;

    let mut server = Server::new_with_opt_and_conf(
        None,
        pingora_conf(startup.server.threads, startup.server.grace_period),
    );
    server.bootstrap();

    let store = Arc::new(Store::new(&startup.store).map_err(StartError::Store)?);
    let shedder = Arc::new(Shedder::new());
    let observer = Observer::new(config.clone(), store.clone(), shedder.clone());
    let observer = Arc::new(observer.map_err(StartError::AccessLog)?);
    let gateway = Gateway {
        config: config.clone(),
        store: store.clone(),
        clock: Arc::new(SystemClock),
        shedder: shedder.clone(),
        observer: observer.clone(),
    };
    let mut proxy = pingora_proxy::http_proxy_service_with_name(
        &server.configuration,
        gateway,
        "tollgate proxy",
    );
    proxy.add_tcp(&startup.server.listen.to_string());

    let mut admin = Service::new(
        "tollgate admin".to_string(),
        Admin {
            config: config.clone(),
            store: store.clone(),
            shedder,
            observer,
        },
    );
    admin.add_tcp(&startup.server.admin_listen.to_string());

    let maintenance = background_service("tollgate maintenance", Maintenance { config, store });

    tracing::info!(
        listen = %startup.server.listen,
        admin = %startup.server.admin_listen,
        config = %cfg.source,
        routes = cfg.routes.len(),
        limits = cfg.limits.len(),
        store = %startup.store.backend,
        "tollgate starting"
    );
    server.add_service(proxy);
    server.add_service(admin);
    server.add_service(maintenance);
    server.run_forever()
}

/// Run the demo upstream until stopped.
pub fn run_demo_upstream(listen: SocketAddr) -> Result<(), StartError> {
    check_bind(listen, "--listen")?;
    let mut server = Server::new_with_opt_and_conf(None, pingora_conf(1, Duration::from_secs(0)));
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
