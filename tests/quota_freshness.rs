//! Quota changes are read-your-writes and survive a PostgreSQL restart (issue 39, item 10),
//! with a real PostgreSQL server and two real gateways: the gateway whose admin API answered
//! a change already applies it to the very next request; after the database comes back, a
//! revocation reaches the other gateway within 2 s (its LISTEN connection is made again and
//! every reconnect reloads in full); `/readyz` says whether the overrides are loaded, how old
//! they are, and whether changes are being listened for.

mod common;

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};

use common::gateway::Gateway;
use common::http::{client, get, send, Resp};
use common::postgres::Postgres;
use common::upstream::Upstream;
use common::wait::eventually;

const TOKEN: &str = "fresh-admin-token";
/// A revocation reaches every gateway within this long (the target).
const PROPAGATION: Duration = Duration::from_secs(2);

/// Keys must be known (in `api_keys` or in the quota store); PostgreSQL's refresh is the
/// default 30 s, so anything seen sooner came by a notification, a reconnect's reload or the
/// gateway's own write.
fn config(pg: &Postgres, up: &Upstream, refresh: &str) -> String {
    format!(
        "{upstreams}\
store: {{ backend: memory }}
routes: [ {{ name: all, match: {{ path_prefix: / }}, upstream: backend }} ]
identity: {{ api_key_header: x-api-key, require_known_keys: true }}
tiers:
  free:
    - {{ name: free-hour, limit: 100000, window: 1h }}
default_tier: free
api_keys: {{ listed-key-0001: free }}
quotas: {{ database: \"{db}\", refresh: {refresh} }}
admin: {{ token_env: TG_ADMIN_TOKEN }}
",
        upstreams = up.upstreams_yaml(),
        db = pg.url(),
    )
}

async fn start(name: &str, yaml: &str) -> Gateway {
    Gateway::start_named(name, yaml, &[], &[("TG_ADMIN_TOKEN", TOKEN)]).await
}

async fn admin(gw: &Gateway, method: Method, key: &str, body: Option<Value>) -> Resp {
    send(
        &client(),
        method,
        &format!("http://{}/admin/v1/quotas/{key}", gw.admin),
        &[
            ("authorization", &format!("Bearer {TOKEN}")),
            ("content-type", "application/json"),
        ],
        body.map(|b| b.to_string().into_bytes()),
    )
    .await
}

/// A change that must succeed: `PUT` (200 or 201) or `DELETE` (200).
async fn change(gw: &Gateway, method: Method, key: &str, body: Option<Value>) {
    let r = admin(gw, method.clone(), key, body).await;
    assert!(
        matches!(r.status.as_u16(), 200 | 201),
        "{method} {key} on {}: {} {}",
        gw.proc.name(),
        r.status,
        r.text()
    );
}

/// The statuses of `n` requests with `key`, one after the other on one connection.
async fn statuses(c: &reqwest::Client, gw: &Gateway, key: &str, n: usize) -> Vec<u16> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let r = get(c, &gw.url("/api/thing"), &[("x-api-key", key)]).await;
        out.push(r.status.as_u16());
    }
    out
}

async fn status_of(gw: &Gateway, key: &str) -> u16 {
    statuses(&client(), gw, key, 1).await[0]
}

/// Wait until `key` gets `want` on `gw`; panics `PROPAGATION` after `since`.
async fn until_status(gw: &Gateway, key: &str, want: u16, since: Instant, what: &str) {
    let left = PROPAGATION.saturating_sub(since.elapsed());
    eventually(
        format!("{}: {key} gets {want} within 2 s {what}", gw.proc.name()),
        left.max(Duration::from_millis(1)),
    )
    .every(Duration::from_millis(25))
    .holds_on(|| status_of(gw, key), |s| *s == want)
    .await;
}

/// The `quotas` object of `/readyz`.
async fn quotas_status(gw: &Gateway) -> Value {
    gw.readyz_status().await.1["quotas"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_is_applied_by_the_gateway_that_answered_it_before_the_answer() {
    let pg = Postgres::start();
    let up = Upstream::start().await;
    let yaml = config(&pg, &up, "30s");
    let (a, b) = (start("a", &yaml).await, start("b", &yaml).await);
    let c = client();
    let rounds = 5;
    for round in 0..rounds {
        let key = format!("tenant-key-{round:04}");
        // Unknown: refused. Created on A: A serves it at once.
        assert_eq!(statuses(&c, &a, &key, 1).await, [401], "{key} unknown");
        change(&a, Method::PUT, &key, Some(json!({"label": "acme"}))).await;
        assert_eq!(statuses(&c, &a, &key, 3).await, [200; 3], "{key} created");
        // Revoked on A: not one more request admitted by A after the answer.
        change(&a, Method::PUT, &key, Some(json!({"status": "disabled"}))).await;
        assert_eq!(statuses(&c, &a, &key, 3).await, [401; 3], "{key} disabled");
        change(&a, Method::PUT, &key, Some(json!({"status": "active"}))).await;
        assert_eq!(statuses(&c, &a, &key, 3).await, [200; 3], "{key} active");
        // Deleted on A: the key is unknown again, at once.
        let t = Instant::now();
        change(&a, Method::DELETE, &key, None).await;
        assert_eq!(statuses(&c, &a, &key, 3).await, [401; 3], "{key} deleted");
        // The other gateway hears of it (NOTIFY) within 2 s.
        until_status(&b, &key, 401, t, "after the DELETE on a").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_postgres_restarts_a_revocation_reaches_the_other_gateway_within_2_s() {
    let mut pg = Postgres::start();
    let up = Upstream::start().await;
    let yaml = config(&pg, &up, "30s");
    let (a, b) = (start("a", &yaml).await, start("b", &yaml).await);
    let keys = ["restart-key-0001", "restart-key-0002"];
    let t = Instant::now();
    for key in keys {
        change(&a, Method::PUT, key, Some(json!({"label": "acme"}))).await;
    }
    for key in keys {
        until_status(&b, key, 200, t, "after the PUT on a").await;
    }

    pg.stop();
    // Long enough for both gateways to find their connections gone.
    tokio::time::sleep(Duration::from_secs(2)).await;
    pg.start_again();
    // Revoke as soon as the database takes a change again.
    let revoked = eventually(
        "a takes a change once PostgreSQL is back",
        Duration::from_secs(15),
    )
    .every(Duration::from_millis(20))
    .holds_on(
        || {
            admin(
                &a,
                Method::PUT,
                keys[0],
                Some(json!({"status": "disabled"})),
            )
        },
        |r| r.status.as_u16() == 200,
    )
    .await;
    let t = Instant::now();
    assert_eq!(revoked.json()["status"], "disabled");
    assert_eq!(
        status_of(&a, keys[0]).await,
        401,
        "a applies its own change"
    );
    until_status(&b, keys[0], 401, t, "after the database came back").await;

    // And the other gateway listens again: a later revocation arrives the same way.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let t = Instant::now();
    change(&a, Method::DELETE, keys[1], None).await;
    until_status(&b, keys[1], 401, t, "of a later DELETE").await;
    assert!(
        b.output().contains("quota LISTEN connection lost"),
        "b logs the lost connection: {}",
        b.output()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_says_whether_the_overrides_are_loaded_how_old_they_are_and_if_changes_are_heard() {
    let mut pg = Postgres::start();
    let up = Upstream::start().await;
    let yaml = config(&pg, &up, "1s");
    let gw = start("a", &yaml).await;
    let q = eventually(
        "the overrides load and LISTEN is up",
        Duration::from_secs(10),
    )
    .holds_on(
        || quotas_status(&gw),
        |q| q["loaded"] == true && q["listening"] == true,
    )
    .await;
    assert_eq!(q["state"], "loaded", "{q}");
    // Reloaded every second: a few seconds old at most (whole seconds, rounded down).
    let age = q["age_s"].as_i64().unwrap_or_else(|| panic!("age_s: {q}"));
    assert!((0..=5).contains(&age), "{q}");
    assert_eq!(q["overrides"], 0, "{q}");

    pg.stop();
    let q = eventually("/readyz: no longer listening", Duration::from_secs(10))
        .holds_on(
            || quotas_status(&gw),
            |q| q["listening"] == false && q["stale_since"].is_string(),
        )
        .await;
    assert_eq!(q["loaded"], true, "still serving what it loaded: {q}");
    // The age grows while the database is away.
    let older = eventually("/readyz: the overrides age", Duration::from_secs(10))
        .holds_on(
            || quotas_status(&gw),
            |q| q["age_s"].as_i64().is_some_and(|a| a >= 3),
        )
        .await;
    assert_eq!(
        older["state"],
        "stale: serving with the overrides last loaded"
    );

    // A gateway started while the database is down has loaded nothing.
    let late = start("late", &yaml).await;
    let q = quotas_status(&late).await;
    assert_eq!(q["loaded"], false, "{q}");
    assert_eq!(q["age_s"], Value::Null, "{q}");
    assert_eq!(q["connected"], false, "{q}");

    pg.start_again();
    for g in [&gw, &late] {
        let q = eventually(
            format!("{}: loaded and listening again", g.proc.name()),
            Duration::from_secs(15),
        )
        .holds_on(
            || quotas_status(g),
            |q| q["listening"] == true && q["stale_since"].is_null() && q["loaded"] == true,
        )
        .await;
        assert!(
            q["age_s"].as_i64().is_some_and(|a| (0..=5).contains(&a)),
            "{q}"
        );
    }
}
