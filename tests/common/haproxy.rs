//! HAProxy, the fleet's load balancer (`docker/haproxy.cfg`): checking its config with
//! `haproxy -c`, and reading which servers it holds up or down (and what it counted of each)
//! from its stats page.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output};

/// What to install when `haproxy` is missing.
pub const INSTALL: &str = "install it with scripts/setup.sh (apt-get install haproxy)";

/// `haproxy -c -f <cfg>` with exactly `env` (plus PATH): the exit status and its output.
pub fn check_config(cfg: &Path, env: &[(&str, &str)]) -> Output {
    Command::new("haproxy")
        .args(["-c", "-f"])
        .arg(cfg)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("cannot run haproxy: {e}. {INSTALL}"))
}

/// The status HAProxy gives each server of `backend` ("UP", "DOWN", "UP 1/2", "DOWN 1/2",
/// ...), from the CSV of the stats page at `stats` (`/stats;csv`).
pub async fn server_status(
    client: &reqwest::Client,
    stats: SocketAddr,
    backend: &str,
) -> BTreeMap<String, String> {
    server_stats(client, stats, backend)
        .await
        .into_iter()
        .map(|(server, mut fields)| (server, fields.remove("status").unwrap_or_default()))
        .collect()
}

/// Every column of the stats page (`status`, `chkdown`: UP to DOWN transitions, `wretr`:
/// retries, `wredis`: redispatches, `hrsp_5xx`, ...) for each server of `backend`.
pub async fn server_stats(
    client: &reqwest::Client,
    stats: SocketAddr,
    backend: &str,
) -> BTreeMap<String, BTreeMap<String, String>> {
    let url = format!("http://{stats}/stats;csv");
    let csv = client
        .get(&url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
        .text()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    parse_stats(&csv, backend)
}

fn parse_stats(csv: &str, backend: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut lines = csv.lines();
    let header: Vec<&str> = lines
        .next()
        .and_then(|h| h.strip_prefix("# "))
        .unwrap_or_else(|| panic!("no CSV header in {csv:?}"))
        .split(',')
        .collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|c| *c == name)
            .unwrap_or_else(|| panic!("no {name} column in {header:?}"))
    };
    let (px, sv) = (col("pxname"), col("svname"));
    lines
        .map(|l| l.split(',').collect::<Vec<_>>())
        .filter(|f| f.len() > sv && f[px] == backend)
        .filter(|f| f[sv] != "BACKEND" && f[sv] != "FRONTEND")
        .map(|f| {
            let fields = header
                .iter()
                .zip(&f)
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            (f[sv].to_string(), fields)
        })
        .collect()
}
