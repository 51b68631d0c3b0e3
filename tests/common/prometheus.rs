//! A real Prometheus server (Debian's `prometheus`) on a free loopback port, scraping the
//! targets it is given every second from a generated config, and PromQL through its HTTP API.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use tempfile::TempDir;

use super::http::client_builder;
use super::process::{free_port, loopback, on_free_ports, Proc};
use super::scrape::PROMETHEUS_INSTALL;
use super::wait::eventually;

pub struct Prometheus {
    pub addr: SocketAddr,
    pub proc: Proc,
    _dir: TempDir,
    client: reqwest::Client,
}

impl Prometheus {
    /// Scrape `/metrics` of every target (host:port) every second, as job `tollgate`.
    pub async fn start(targets: &[SocketAddr]) -> Prometheus {
        let client = client_builder()
            .timeout(Duration::from_secs(5))
            .build()
            .expect("client");
        let list: Vec<String> = targets.iter().map(|t| format!("\"{t}\"")).collect();
        let config = format!(
            "global: {{ scrape_interval: 1s, evaluation_interval: 1s }}\n\
             scrape_configs:\n  - job_name: tollgate\n    static_configs: [ {{ targets: [{}] }} ]\n",
            list.join(", ")
        );
        let (client, config) = (&client, &config);
        on_free_ports("prometheus", || async move {
            let dir = tempfile::tempdir().expect("temp dir");
            let file = dir.path().join("prometheus.yml");
            std::fs::write(&file, config).expect("write prometheus.yml");
            let addr = loopback(free_port());
            let mut cmd = Command::new("prometheus");
            cmd.arg(format!("--config.file={}", file.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.path().join("data").display()
                ))
                .arg(format!("--web.listen-address={addr}"));
            let ready = format!("http://{addr}/-/ready");
            let proc = Proc::spawn("prometheus", cmd, PROMETHEUS_INSTALL);
            proc.answering(client, &ready).await.map(|proc| Prometheus {
                addr,
                proc,
                _dir: dir,
                client: client.clone(),
            })
        })
        .await
    }

    /// The result of an instant PromQL query (`data.result`).
    pub async fn query(&self, promql: &str) -> serde_json::Value {
        let url = format!("http://{}/api/v1/query", self.addr);
        let r: serde_json::Value = self
            .client
            .get(&url)
            .query(&[("query", promql)])
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {url}?query={promql}: {e}"))
            .json()
            .await
            .expect("JSON from the Prometheus API");
        assert_eq!(r["status"], "success", "query {promql}: {r}");
        r["data"]["result"].clone()
    }

    /// The value of a query with one result, `None` while it has none.
    pub async fn scalar(&self, promql: &str) -> Option<f64> {
        let result = self.query(promql).await;
        let v = result.as_array()?.first()?["value"][1]
            .as_str()?
            .to_string();
        v.parse().ok()
    }

    /// Poll `promql` every 250 ms until it equals `want`; panics after `within`.
    pub async fn wait_for(&self, promql: &str, want: f64, within: Duration) {
        eventually(format!("prometheus: {promql} == {want}"), within)
            .every(Duration::from_millis(250))
            .holds_on(|| self.scalar(promql), |v| *v == Some(want))
            .await;
    }
}
