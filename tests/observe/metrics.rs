//! `GET /metrics`: exact decision counts, histogram counts, responses by class, the store's
//! failures and the breaker on a Redis that dies, config reloads, and no secret in a label.

use std::time::Duration;

use crate::common::gateway::Gateway;
use crate::common::http::{client, get};
use crate::common::redis::RedisServer;
use crate::common::scrape::promtool;
use crate::common::upstream::Upstream;
use crate::common::wait::eventually;
use crate::{config, start, SECRET_KEY};

const DECISIONS: &str = "tollgate_decisions_total";

#[tokio::test(flavor = "multi_thread")]
async fn decision_counters_move_by_exactly_the_requests_sent_and_denied() {
    let (_up, gw) = start("").await;
    let before = gw.metrics().await;
    let per_ip = |outcome| {
        [
            ("limit", "per-ip"),
            ("outcome", outcome),
            ("source", "memory"),
        ]
    };
    assert_eq!(before.value(DECISIONS, &per_ip("allow")), 0.0);
    assert_eq!(
        before.histogram_count("tollgate_check_duration_seconds", &[]),
        0.0
    );

    let c = client();
    let mut statuses = Vec::new();
    for _ in 0..10 {
        statuses.push(get(&c, &gw.url("/hello"), &[]).await.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 200, 200, 429, 429, 429]);

    // A request's duration and response class are counted in its logging phase, which runs
    // after the client has its answer: the scrape waits for the tenth (never more than ten).
    let route = [("route", "default")];
    let m = eventually(
        "the tenth request's logging phase is counted",
        Duration::from_secs(5),
    )
    .holds_on(
        || gw.metrics(),
        |m| m.histogram_count("tollgate_request_duration_seconds", &route) >= 10.0,
    )
    .await;
    assert_eq!(m.value(DECISIONS, &per_ip("allow")), 7.0);
    assert_eq!(m.value(DECISIONS, &per_ip("deny")), 3.0);
    assert_eq!(m.value(DECISIONS, &per_ip("shadow_deny")), 0.0);
    assert_eq!(
        m.histogram_count("tollgate_check_duration_seconds", &[]),
        10.0
    );
    assert_eq!(
        m.histogram_count("tollgate_request_duration_seconds", &route),
        10.0
    );
    let class = |c| [("route", "default"), ("code_class", c)];
    assert_eq!(m.value("tollgate_requests_total", &class("2xx")), 7.0);
    assert_eq!(m.value("tollgate_requests_total", &class("4xx")), 3.0);
    assert_eq!(
        m.value("tollgate_admitted_total", &[("class", "get")]),
        10.0
    );
    assert_eq!(m.value("tollgate_shed_total", &[("class", "get")]), 0.0);
    assert_eq!(m.value("tollgate_requests_in_flight", &[]), 0.0);
    assert_eq!(
        m.value(
            "tollgate_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        1.0
    );
    assert_eq!(m.value("tollgate_breaker_open", &[]), 0.0);

    // A tier limit: 5 of 6 API-key requests admitted, and quota use recorded by tier.
    for _ in 0..6 {
        get(&c, &gw.url("/hello"), &[("x-api-key", SECRET_KEY)]).await;
    }
    let m = gw.metrics().await;
    let tier = |o| [("limit", "free-hour"), ("outcome", o), ("source", "memory")];
    assert_eq!(
        (
            m.value(DECISIONS, &tier("allow")),
            m.value(DECISIONS, &tier("deny"))
        ),
        (5.0, 1.0)
    );
    assert_eq!(
        m.histogram_count("tollgate_quota_utilization_ratio", &[("tier", "free")]),
        6.0
    );
    // Exactly full after the fifth: used 1/5 .. 5/5, then 1 for the denial.
    let sum = m.value("tollgate_quota_utilization_ratio_sum", &[("tier", "free")]);
    assert!(
        (sum - (0.2 + 0.4 + 0.6 + 0.8 + 1.0 + 1.0)).abs() < 1e-9,
        "sum {sum}"
    );
    assert!(!m.text.contains(SECRET_KEY), "no API key in /metrics");
    assert!(m
        .label_values()
        .iter()
        .all(|v| !v.contains("127.0.0.1") && !v.contains("/hello")));
}

#[tokio::test(flavor = "multi_thread")]
async fn promtool_accepts_the_exposition() {
    let (_up, gw) = start("").await;
    get(&client(), &gw.url("/hello"), &[]).await;
    let text = gw.metrics().await.text;
    let (ok, out) = promtool(&["check", "metrics"], &text);
    assert!(ok, "promtool check metrics:\n{out}\n{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn store_errors_breaker_and_failure_policies_when_redis_dies() {
    let mut redis = RedisServer::start();
    let up = Upstream::start().await;
    let yaml = format!(
        "store: {{ backend: redis, url: \"{}\", breaker: {{ failures: 3, cooldown: 60s }} }}\n{}",
        redis.url(),
        config(
            &up,
            "  - { name: local-one, key: [client_ip], limit: 1000, window: 1h, on_error: local }\n"
        )
    );
    let gw = Gateway::start(&yaml).await;
    let c = client();
    get(&c, &gw.url("/hello"), &[]).await;
    let m = gw.metrics().await;
    let redis_allow = [
        ("limit", "per-ip"),
        ("outcome", "allow"),
        ("source", "redis"),
    ];
    assert_eq!(m.value(DECISIONS, &redis_allow), 1.0);
    assert_eq!(m.sum("tollgate_store_errors_total", &[]), 0.0);

    redis.kill();
    for _ in 0..6 {
        let r = get(&c, &gw.url("/hello"), &[]).await;
        assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    }
    let m = gw.metrics().await;
    assert_eq!(m.value("tollgate_breaker_open", &[]), 1.0);
    assert_eq!(
        m.value("tollgate_breaker_transitions_total", &[("state", "open")]),
        1.0
    );
    // Three calls failed before the breaker opened (the first refused; the client's reconnect
    // attempts may miss the deadline instead); three were not made.
    assert_eq!(m.sum("tollgate_store_errors_total", &[]), 3.0, "{}", m.text);
    assert!(m.value("tollgate_store_errors_total", &[("kind", "connection")]) >= 1.0);
    assert_eq!(m.value("tollgate_breaker_rejected_total", &[]), 3.0);
    let policy = |l, p| [("limit", l), ("policy", p)];
    assert_eq!(
        m.value("tollgate_failure_policy_total", &policy("per-ip", "allow")),
        6.0
    );
    assert_eq!(
        m.value(
            "tollgate_failure_policy_total",
            &policy("local-one", "local")
        ),
        6.0
    );
    let local = [
        ("limit", "local-one"),
        ("outcome", "allow"),
        ("source", "local"),
    ];
    assert_eq!(m.value(DECISIONS, &local), 6.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn reloads_are_counted_and_removed_limits_leave_the_scrape() {
    let (up, gw) = start("  - { name: doomed, key: [], limit: 100, window: 1m }\n").await;
    get(&client(), &gw.url("/hello"), &[]).await;
    assert!(gw.metrics().await.text.contains("limit=\"doomed\""));
    gw.replace_config("limits: [ { name: broken, limit: 0, window: 1m } ]\nroutes: []\n");
    gw.sighup();
    eventually("a failed reload is counted", Duration::from_secs(10))
        .holds_async(|| async {
            gw.metrics()
                .await
                .value("tollgate_config_reloads_total", &[("result", "failure")])
                == 1.0
        })
        .await;
    gw.replace_config(&config(&up, ""));
    gw.sighup();
    gw.wait_generation(1, Duration::from_secs(10)).await;
    let m = gw.metrics().await;
    assert_eq!(
        m.value("tollgate_config_reloads_total", &[("result", "success")]),
        1.0
    );
    assert_eq!(m.value("tollgate_config_generation", &[]), 1.0);
    assert!(!m.text.contains("limit=\"doomed\""), "{}", m.text);
}
