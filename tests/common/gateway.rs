//! The gateway under test: `tollgate` on a temporary `gateway.yaml`, with its proxy and admin
//! listeners on free loopback ports, and what the tests read from its admin listener
//! (`/readyz`, `/stats`) and its log.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::http::{client_builder, get, get_json, http_ok, tcp_open, Resp};
use super::process::{free_port, loopback, on_free_ports, Proc};
use super::scrape::Metrics;
use super::wait::eventually;

/// The gateway on a temporary `gateway.yaml`, with `--listen` and `--admin-listen` on free
/// loopback ports.
pub struct Gateway {
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    pub proc: Proc,
    dir: TempDir,
    client: reqwest::Client,
}

/// `store_status` of `/readyz`: the circuit breaker in front of the store and its counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreStatus {
    pub breaker: String,
    pub failures: u64,
    pub rejected: u64,
    pub opened: u64,
}

pub fn path_of(p: &Path) -> String {
    p.display().to_string()
}

impl Gateway {
    pub async fn start(yaml: &str) -> Gateway {
        Gateway::launch("gateway".into(), yaml, &[], &[]).await
    }

    /// Start with extra environment variables (for example a JWT secret).
    pub async fn start_with_env(yaml: &str, env: &[(&str, &str)]) -> Gateway {
        Gateway::launch("gateway".into(), yaml, &[], env).await
    }

    /// Start with extra command-line arguments (after `--config`, `--listen` and
    /// `--admin-listen`) and environment variables. `name` tells several gateways of one test
    /// apart: the process is "gateway {name}" in its panic output and error messages.
    pub async fn start_named(
        name: &str,
        yaml: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Gateway {
        Gateway::launch(format!("gateway {name}"), yaml, args, env).await
    }

    /// [`Gateway::start_named`] run by a wrapper command, e.g. `prlimit --nofile=1024:4096 --`.
    pub async fn start_under(
        wrapper: &[&str],
        name: &str,
        yaml: &str,
        env: &[(&str, &str)],
    ) -> Gateway {
        let name = format!("gateway {name}");
        Gateway::launch_under(wrapper, name, yaml, &[], env, Ipv4Addr::LOCALHOST.into()).await
    }

    /// [`Gateway::start_with_env`] with the admin listener bound to every interface
    /// (`0.0.0.0:PORT`, as the image binds it); [`Gateway::admin`] still names it on loopback,
    /// where the tests reach it.
    pub async fn start_admin_on_every_interface(yaml: &str, env: &[(&str, &str)]) -> Gateway {
        let any = Ipv4Addr::UNSPECIFIED.into();
        Gateway::launch_under(&[], "gateway".into(), yaml, &[], env, any).await
    }

    async fn launch(name: String, yaml: &str, extra: &[&str], env: &[(&str, &str)]) -> Gateway {
        let local = Ipv4Addr::LOCALHOST.into();
        Gateway::launch_under(&[], name, yaml, extra, env, local).await
    }

    async fn launch_under(
        wrapper: &[&str],
        name: String,
        yaml: &str,
        extra: &[&str],
        env: &[(&str, &str)],
        admin_ip: IpAddr,
    ) -> Gateway {
        let client = client_builder()
            .timeout(Duration::from_secs(2))
            .build()
            .expect("client");
        let (client, name) = (&client, name.as_str());
        on_free_ports(name, || async move {
            let dir = tempfile::tempdir().expect("temp dir");
            std::fs::write(dir.path().join("gateway.yaml"), yaml).expect("write config");
            let (listen, admin) = (loopback(free_port()), loopback(free_port()));
            let mut args = vec![
                "--config".to_string(),
                dir.path().join("gateway.yaml").display().to_string(),
                "--listen".into(),
                listen.to_string(),
                "--admin-listen".into(),
                SocketAddr::new(admin_ip, admin.port()).to_string(),
            ];
            args.extend(extra.iter().map(|a| a.to_string()));
            let mut proc = Proc::tollgate_under(wrapper, name, &args, env);
            let healthz = format!("http://{admin}/healthz");
            proc.wait_ready(|| {
                let healthz = &healthz;
                async move { http_ok(client, healthz).await && tcp_open(listen) }
            })
            .await
            .map(|()| Gateway {
                listen,
                admin,
                proc,
                dir,
                client: client.clone(),
            })
        })
        .await
    }

    /// `http://127.0.0.1:PORT{path}` of the proxy listener.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.listen)
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("gateway.yaml")
    }

    /// Everything the gateway logged so far.
    pub fn output(&self) -> String {
        self.proc.output()
    }

    /// Replace the config file atomically (write a sibling, rename over it).
    pub fn replace_config(&self, yaml: &str) {
        let tmp = self.dir.path().join("gateway.yaml.new");
        std::fs::write(&tmp, yaml).expect("write new config");
        std::fs::rename(&tmp, self.config_path()).expect("rename config");
    }

    /// Rewrite the config file in place, as an editor saving it would.
    pub fn rewrite_config(&self, yaml: &str) {
        std::fs::write(self.config_path(), yaml).expect("rewrite config");
    }

    /// Send SIGHUP with `kill -HUP <pid>`.
    pub fn sighup(&self) {
        self.proc.signal("HUP");
    }

    /// `GET /readyz` of the admin listener, which must answer 200.
    pub async fn readyz(&self) -> serde_json::Value {
        get_json(&self.client, &format!("http://{}/readyz", self.admin)).await
    }

    /// `GET /readyz` of the admin listener, whatever it answers (503 while draining, or while
    /// the store is unreachable with `server.ready_requires_store`): the status and the JSON
    /// body. Each request may take up to 5 s.
    pub async fn readyz_status(&self) -> (u16, serde_json::Value) {
        let url = format!("http://{}/readyz", self.admin);
        let r = self
            .client
            .get(&url)
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {url}: {e}"));
        let status = r.status().as_u16();
        let body = r
            .json()
            .await
            .unwrap_or_else(|e| panic!("GET {url} ({status}): not JSON: {e}"));
        (status, body)
    }

    /// `GET /readyz` (200 or 503): its status, its `store_status`, and the whole body.
    pub async fn store_status(&self) -> (u16, StoreStatus, serde_json::Value) {
        let (status, body) = self.readyz_status().await;
        let s = &body["store_status"];
        let n = |k: &str| {
            s[k].as_u64()
                .unwrap_or_else(|| panic!("store_status.{k} missing in {body}"))
        };
        let st = StoreStatus {
            breaker: s["breaker"]
                .as_str()
                .unwrap_or_else(|| panic!("store_status.breaker missing in {body}"))
                .to_string(),
            failures: n("failures"),
            rejected: n("rejected_by_breaker"),
            opened: n("breaker_opened"),
        };
        (status, st, body)
    }

    /// Poll `/readyz` every 50 ms until it answers `want`; panics after `within`. Returns the
    /// JSON body of that answer.
    pub async fn wait_readyz(&self, want: u16, within: Duration) -> serde_json::Value {
        let what = format!("/readyz of {} answers {want}", self.proc.name());
        eventually(what, within)
            .holds_on(|| self.readyz_status(), |(status, _)| *status == want)
            .await
            .1
    }

    /// Poll `/readyz` until its body says the store is `want` (`ok`, `unreachable`), whatever
    /// its status (200 unless `server.ready_requires_store`); returns the body.
    pub async fn wait_store(&self, want: &str, within: Duration) -> serde_json::Value {
        let what = format!("/readyz of {} says the store is {want}", self.proc.name());
        eventually(what, within)
            .holds_on(|| self.readyz_status(), |(_, body)| body["store"] == want)
            .await
            .1
    }

    /// `GET /metrics` of the admin listener, parsed.
    pub async fn metrics(&self) -> Metrics {
        let r = self.admin_get("/metrics", &[]).await;
        assert_eq!(r.status.as_u16(), 200, "GET /metrics: {}", r.text());
        assert_eq!(
            r.header("content-type"),
            "text/plain; version=0.0.4; charset=utf-8"
        );
        Metrics::parse(&r.text())
    }

    /// `GET {path}` of the admin listener with `headers`, whatever it answers.
    pub async fn admin_get(&self, path: &str, headers: &[(&str, &str)]) -> Resp {
        get(
            &self.client,
            &format!("http://{}{path}", self.admin),
            headers,
        )
        .await
    }

    /// `GET /stats` of the admin listener: requests in flight, shedding per class, slots.
    pub async fn stats(&self) -> serde_json::Value {
        get_json(&self.client, &format!("http://{}/stats", self.admin)).await
    }

    /// Poll `/stats` every 20 ms until `cond` holds; panics after `within`.
    pub async fn wait_stats(
        &self,
        what: &str,
        within: Duration,
        cond: impl Fn(&serde_json::Value) -> bool,
    ) {
        eventually(format!("{}: {what}", self.proc.name()), within)
            .every(Duration::from_millis(20))
            .holds_on(|| self.stats(), cond)
            .await;
    }

    /// Wait until no request holds a concurrency slot and the in-process table is empty.
    pub async fn wait_slots_free(&self, within: Duration) {
        self.wait_stats("every concurrency slot free", within, |s| {
            let c = &s["concurrency"];
            c["requests_holding_slots"] == 0
                && c["memory_slots"] == 0
                && c["redis_releases_pending"] == 0
        })
        .await
    }

    /// Wait until no request is in flight; panics after 10 s.
    pub async fn wait_idle(&self) {
        self.wait_stats("no request in flight", Duration::from_secs(10), |s| {
            s["in_flight"] == 0
        })
        .await
    }

    /// Successful reloads since start, from `/readyz`.
    pub async fn generation(&self) -> u64 {
        self.readyz().await["config_generation"]
            .as_u64()
            .expect("config_generation")
    }

    /// Poll every 50 ms until the config generation reaches `at_least`; panics after
    /// `within`. Returns how long it took.
    pub async fn wait_generation(&self, at_least: u64, within: Duration) -> Duration {
        let start = Instant::now();
        eventually(format!("config generation {at_least}"), within)
            .holds_on(|| self.generation(), |g| *g >= at_least)
            .await;
        start.elapsed()
    }

    /// Poll the gateway's output every 50 ms until it contains `needle`; panics after
    /// `within`.
    pub async fn wait_output(&self, needle: &str, within: Duration) {
        eventually(format!("the gateway logs {needle:?}"), within)
            .holds(|| self.output().contains(needle))
            .await
    }
}
