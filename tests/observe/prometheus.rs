//! A real Prometheus scraping a gateway; the alert rules under `promtool test rules`; and every
//! metric name the dashboard and the alert rules use, found in a live scrape.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::common::http::{client, get};
use crate::common::prometheus::Prometheus;
use crate::common::scrape::promtool;
use crate::start;

const ALERTS: &str = "docker/prometheus/alerts.yml";
const ALERT_TESTS: &str = "docker/prometheus/alerts.test.yml";
const DASHBOARD: &str = "docker/grafana/dashboards/tollgate.json";

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
        .unwrap_or_else(|e| panic!("read {path}: {e}"))
}

/// Every `tollgate_*` metric name in a PromQL expression.
fn metric_names(promql: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in promql.match_indices("tollgate_") {
        let name: String = promql[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        out.insert(name);
    }
    out
}

/// The alert rules: (name, expression).
fn alert_rules() -> Vec<(String, String)> {
    let doc: serde_yaml::Value = serde_yaml::from_str(&read(ALERTS)).expect("alerts.yml is YAML");
    let mut rules = Vec::new();
    for group in doc["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let name = rule["alert"].as_str().expect("an alert name").to_string();
            rules.push((name, rule["expr"].as_str().expect("an expr").to_string()));
        }
    }
    rules
}

/// Every PromQL expression of the dashboard: panel targets and template variable queries.
fn dashboard_queries() -> Vec<String> {
    let dash: Value = serde_json::from_str(&read(DASHBOARD)).expect("the dashboard is JSON");
    let mut out = Vec::new();
    for p in dash["panels"].as_array().expect("panels") {
        for t in p["targets"].as_array().expect("targets") {
            out.push(t["expr"].as_str().expect("expr").to_string());
        }
    }
    for v in dash["templating"]["list"].as_array().expect("templating") {
        if let Some(q) = v["definition"].as_str() {
            out.push(q.to_string());
        }
    }
    out
}

#[test]
fn every_alert_rule_passes_promtool_and_has_a_test() {
    let (ok, out) = promtool(&["check", "rules", ALERTS], "");
    assert!(ok, "promtool check rules:\n{out}");
    let (ok, out) = promtool(&["test", "rules", ALERT_TESTS], "");
    assert!(ok, "promtool test rules:\n{out}");
    let tests = read(ALERT_TESTS);
    let rules = alert_rules();
    let names: Vec<&str> = rules.iter().map(|(n, _)| n.as_str()).collect();
    for want in [
        "TollgateDenialSpike",
        "TollgateBreakerOpen",
        "TollgateFailOpen",
        "TollgateConfigReloadFailing",
        "TollgateStoreSlow",
        "TollgateShedding",
    ] {
        assert!(names.contains(&want), "no {want} in {ALERTS}");
    }
    for name in names {
        assert!(
            tests.contains(&format!(
                "alertname: {name}\n        exp_alerts:\n          - exp_labels"
            )),
            "{name} has no test in {ALERT_TESTS} that expects it to fire"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_metric_the_dashboard_and_alerts_use_exists_in_a_live_scrape() {
    let (_up, gw) = start("").await;
    get(&client(), &gw.url("/hello"), &[]).await;
    let live = gw.metrics().await.names();
    let mut used = BTreeSet::new();
    for q in dashboard_queries() {
        used.extend(metric_names(&q));
    }
    let dashboard_count = used.len();
    for (_, expr) in alert_rules() {
        used.extend(metric_names(&expr));
    }
    assert!(
        dashboard_count >= 10 && used.len() > dashboard_count - 1,
        "names: {used:?}"
    );
    let missing: Vec<&String> = used.iter().filter(|n| !live.contains(*n)).collect();
    assert!(
        missing.is_empty(),
        "used but not in /metrics: {missing:?}\nlive: {live:?}"
    );
    // And docs/operations.md documents every metric the gateway exports.
    let readme = read("docs/operations.md");
    let family = |n: &str| {
        ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| n.strip_suffix(s))
            .unwrap_or(n)
            .to_string()
    };
    let undocumented: BTreeSet<String> = live
        .iter()
        .map(|n| family(n))
        .filter(|n| !readme.contains(&format!("`{n}")))
        .collect();
    assert!(
        undocumented.is_empty(),
        "metrics missing from docs/operations.md: {undocumented:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_real_prometheus_scrapes_the_gateway_and_promql_counts_the_decisions() {
    let (_up, gw) = start("").await;
    let c = client();
    for _ in 0..10 {
        get(&c, &gw.url("/hello"), &[]).await;
    }
    let prom = Prometheus::start(&[gw.admin]).await;
    let within = Duration::from_secs(30);
    prom.wait_for("up{job=\"tollgate\"}", 1.0, within).await;
    prom.wait_for(
        "sum(tollgate_decisions_total{job=\"tollgate\",limit=\"per-ip\",outcome=\"allow\"})",
        7.0,
        within,
    )
    .await;
    prom.wait_for(
        "sum(tollgate_decisions_total{outcome=\"deny\"})",
        3.0,
        within,
    )
    .await;
    prom.wait_for(
        "sum(tollgate_requests_total{code_class=\"4xx\"})",
        3.0,
        within,
    )
    .await;
    prom.wait_for("tollgate_check_duration_seconds_count", 10.0, within)
        .await;
}
