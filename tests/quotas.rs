//! Tenant quotas end to end: real gateways, a real PostgreSQL server (and an embedded SQLite
//! file: the tests that touch the quota store run on both), real Redis where counters are
//! shared, and the demo upstream. Overrides move a key to another tier, change one limit for
//! one key, revoke a key; usage is read without consuming and reset clears one key; the admin
//! API is authenticated and never reachable through the proxy; a database outage leaves the
//! gateways serving with what they hold; no raw key is ever stored or logged.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};
use tempfile::TempDir;

use common::gateway::Gateway;
use common::http::{client, get, send, Resp};
use common::postgres::Postgres;
use common::redis::RedisServer;
use common::upstream::Upstream;
use common::wait::eventually;

const TOKEN: &str = "s3cret-admin-token";
const TOKEN_ENV: (&str, &str) = ("TG_ADMIN_TOKEN", TOKEN);
/// Every change reaches every gateway within this long (the issue's promise).
const PROPAGATION: Duration = Duration::from_secs(2);

/// The quota store a test runs against.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Postgres,
    Sqlite,
}

enum Db {
    Pg(Postgres),
    Sqlite(TempDir),
}

impl Db {
    fn start(kind: Kind) -> Db {
        match kind {
            Kind::Postgres => Db::Pg(Postgres::start()),
            Kind::Sqlite => Db::Sqlite(tempfile::tempdir().expect("temp dir")),
        }
    }

    fn sqlite_path(dir: &TempDir) -> PathBuf {
        dir.path().join("quotas.db")
    }

    fn url(&self) -> String {
        match self {
            Db::Pg(pg) => pg.url(),
            Db::Sqlite(dir) => format!("sqlite://{}", Db::sqlite_path(dir).display()),
        }
    }

    /// How often gateways reload: PostgreSQL tells them at once (NOTIFY), so its timer is
    /// the default 30 s and a change arriving within 2 s proves the notification works;
    /// SQLite has no notification, so other processes see a change at the next refresh.
    fn refresh(&self) -> &'static str {
        match self {
            Db::Pg(_) => "30s",
            Db::Sqlite(_) => "500ms",
        }
    }

    /// Everything the database holds, as text.
    fn dump(&self) -> String {
        match self {
            Db::Pg(pg) => pg.dump(),
            Db::Sqlite(dir) => {
                let mut all = Vec::new();
                for entry in std::fs::read_dir(dir.path()).expect("read the SQLite dir") {
                    all.extend(std::fs::read(entry.expect("entry").path()).unwrap_or_default());
                }
                String::from_utf8_lossy(&all).into_owned()
            }
        }
    }
}

/// The config every test starts from: tiers `free` (3 an hour, or `free_limit`) and `gold`
/// (8 an hour), unknown keys in `free`, a per-IP limit no test reaches (it is not named by a
/// key, so usage lists it as not enumerable), the quota store, and the admin token.
fn config(store: &str, db: &Db, up: &Upstream, free_limit: u64, identity_extra: &str) -> String {
    format!(
        "{store}\n{upstreams}\
routes: [ {{ name: all, match: {{ path_prefix: / }}, upstream: backend }} ]
identity: {{ api_key_header: x-api-key, trusted_proxies: [\"127.0.0.1/32\"]{identity_extra} }}
tiers:
  free:
    - {{ name: free-hour, limit: {free_limit}, window: 1h }}
  gold:
    - {{ name: gold-hour, limit: 8, window: 1h }}
default_tier: free
api_keys: {{ listed-key-0001: free }}
limits:
  - {{ name: per-ip, key: [client_ip], limit: 100000, window: 1h }}
quotas: {{ database: \"{db_url}\", refresh: {refresh} }}
admin: {{ token_env: TG_ADMIN_TOKEN }}
",
        upstreams = up.upstreams_yaml(),
        db_url = db.url(),
        refresh = db.refresh(),
    )
}

fn redis_store(redis: &RedisServer) -> String {
    format!(
        "store: {{ backend: redis, url: \"{}\", key_prefix: quotas, timeout: 5s, on_error: deny }}",
        redis.url()
    )
}

/// The test `body` on PostgreSQL (`$pg`) and on SQLite (`$sqlite`).
macro_rules! on_both_stores {
    ($pg:ident, $sqlite:ident, $body:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $pg() {
            $body(Kind::Postgres).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $sqlite() {
            $body(Kind::Sqlite).await;
        }
    };
}

const MEMORY: &str = "store: { backend: memory }";

async fn start(name: &str, yaml: &str) -> Gateway {
    Gateway::start_named(name, yaml, &[], &[TOKEN_ENV]).await
}

/// A call of the admin API with the admin token.
async fn admin(gw: &Gateway, method: Method, path: &str, body: Option<Value>) -> Resp {
    send(
        &client(),
        method,
        &format!("http://{}{path}", gw.admin),
        &[
            ("authorization", &format!("Bearer {TOKEN}")),
            ("content-type", "application/json"),
        ],
        body.map(|b| b.to_string().into_bytes()),
    )
    .await
}

/// `PUT /admin/v1/quotas/{key}`, which must succeed (201 created or 200 changed).
async fn put(gw: &Gateway, key: &str, body: Value) -> Value {
    let r = admin(
        gw,
        Method::PUT,
        &format!("/admin/v1/quotas/{key}"),
        Some(body),
    )
    .await;
    assert!(
        matches!(r.status.as_u16(), 200 | 201),
        "PUT {key}: {} {}",
        r.status,
        r.text()
    );
    r.json()
}

async fn usage(gw: &Gateway, key: &str) -> Value {
    let r = admin(gw, Method::GET, &format!("/admin/v1/usage/{key}"), None).await;
    assert_eq!(r.status.as_u16(), 200, "usage of {key}: {}", r.text());
    r.json()
}

/// The entry of limit `name` in a usage answer.
fn limit_of<'a>(usage: &'a Value, name: &str) -> &'a Value {
    usage["limits"]
        .as_array()
        .and_then(|ls| ls.iter().find(|l| l["name"] == name))
        .unwrap_or_else(|| panic!("no limit {name} in {usage}"))
}

/// Wait until `cond` holds of `key`'s usage on every gateway; panics after 2 s from `since`.
async fn until_usage(gws: &[&Gateway], key: &str, since: Instant, cond: impl Fn(&Value) -> bool) {
    for gw in gws {
        let left = PROPAGATION.saturating_sub(since.elapsed());
        eventually(
            format!("{}: usage of {key} changes within 2 s", gw.proc.name()),
            left.max(Duration::from_millis(1)),
        )
        .every(Duration::from_millis(25))
        .holds_on(|| usage(gw, key), &cond)
        .await;
    }
}

/// Send `n` requests with API key `key`, alternating between `gws`: how many were admitted.
/// Every answer is 200 or 429.
async fn admitted(gws: &[&Gateway], key: &str, n: usize) -> usize {
    let c = client();
    let mut ok = 0;
    for i in 0..n {
        let gw = gws[i % gws.len()];
        let r = get(&c, &gw.url("/api/thing"), &[("x-api-key", key)]).await;
        match r.status.as_u16() {
            200 => ok += 1,
            429 => {}
            s => panic!("{key} via {}: {s} {}", gw.proc.name(), r.text()),
        }
    }
    ok
}

/// One request's status with `key`.
async fn status_of(gw: &Gateway, key: &str) -> u16 {
    get(&client(), &gw.url("/api/thing"), &[("x-api-key", key)])
        .await
        .status
        .as_u16()
}

fn assert_no_raw_key(keys: &[&str], db: &Db, gws: &[&Gateway]) {
    let dump = db.dump();
    for k in keys {
        assert!(!dump.contains(k), "the database holds the raw key {k}");
        for gw in gws {
            assert!(
                !gw.output().contains(k),
                "{} logged the raw key {k}",
                gw.proc.name()
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------

async fn tier_change_and_limit_override_reach_both_gateways(kind: Kind) {
    let (a, b) = ("tenant-a-7f3e9c", "tenant-b-51d0aa");
    let db = Db::start(kind);
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let yaml = config(&redis_store(&redis), &db, &up, 3, "");
    let g1 = start("one", &yaml).await;
    let g2 = start("two", &yaml).await;
    let both = [&g1, &g2];

    // Before: both keys are in `free`, 3 an hour across the fleet.
    assert_eq!(admitted(&both, a, 6).await, 3, "{a} before the change");
    assert_eq!(admitted(&both, b, 1).await, 1, "{b} before the change");

    // A tier change on one gateway reaches both within 2 s.
    let t = Instant::now();
    let doc = put(&g1, a, json!({"tier": "gold", "label": "acme-prod"})).await;
    assert_eq!(doc["tier"], "gold");
    assert!(doc["key"].as_str().unwrap().starts_with("fp:"), "{doc}");
    until_usage(&both, a, t, |u| u["tier"] == "gold").await;
    // Exactly gold's 8 are admitted, on both gateways together.
    assert_eq!(admitted(&both, a, 20).await, 8, "{a} in gold");
    // The other key on the same tier is unaffected: 2 left of its 3.
    assert_eq!(admitted(&both, b, 5).await, 2, "{b} still in free");

    // A per-limit override: b's free-hour becomes 6 (it has used 3), set on the other gateway.
    let t = Instant::now();
    put(&g2, b, json!({"limits": {"free-hour": {"limit": 6}}})).await;
    until_usage(&both, b, t, |u| limit_of(u, "free-hour")["limit"] == 6).await;
    assert_eq!(admitted(&both, b, 10).await, 3, "{b} with free-hour 6");
    // a is unaffected by b's override: gold, all 8 used.
    assert_eq!(admitted(&both, a, 3).await, 0, "{a} after b's override");

    assert_eq!(
        up.requests().await,
        3 + 1 + 8 + 2 + 3,
        "the upstream saw exactly the admitted requests"
    );
    // The audit trail holds both changes, by fingerprint.
    let audit = admin(&g1, Method::GET, "/admin/v1/audit", None)
        .await
        .json();
    let actions: Vec<&str> = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["put", "put"], "{audit}");
    assert!(!audit.to_string().contains(a) && !audit.to_string().contains(b));
    assert_no_raw_key(&[a, b], &db, &both);
}

on_both_stores!(
    postgres_a_tier_change_and_a_limit_override_reach_both_gateways_within_2s,
    sqlite_a_tier_change_and_a_limit_override_reach_both_gateways_within_2s,
    tier_change_and_limit_override_reach_both_gateways
);

// ---------------------------------------------------------------------------------------------

async fn overrides_apply_only_between_effective_at_and_expires_at(kind: Kind) {
    let db = Db::start(kind);
    let up = Upstream::start().await;
    let gw = start("one", &config(MEMORY, &db, &up, 3, "")).await;
    let (expired, future, current) = ("key-expired-01", "key-future-002", "key-current-03");
    put(
        &gw,
        expired,
        json!({"tier": "gold", "expires_at": "2020-01-01T00:00:00Z"}),
    )
    .await;
    put(
        &gw,
        future,
        json!({"tier": "gold", "effective_at": "2099-01-01T00:00:00Z"}),
    )
    .await;
    let t = Instant::now();
    put(
        &gw,
        current,
        json!({"tier": "gold", "effective_at": "2020-01-01T00:00:00Z", "expires_at": "2099-01-01T00:00:00Z"}),
    )
    .await;
    until_usage(&[&gw], current, t, |u| u["tier"] == "gold").await;
    assert_eq!(usage(&gw, expired).await["tier"], "free");
    assert_eq!(usage(&gw, future).await["tier"], "free");

    assert_eq!(
        admitted(&[&gw], expired, 10).await,
        3,
        "expired: the tier's 3"
    );
    assert_eq!(
        admitted(&[&gw], future, 10).await,
        3,
        "not yet effective: 3"
    );
    assert_eq!(admitted(&[&gw], current, 10).await, 8, "in force: gold's 8");

    let in_force = |doc: Value| doc["in_force"].clone();
    let get_doc = |k: &'static str| {
        let gw = &gw;
        async move {
            admin(gw, Method::GET, &format!("/admin/v1/quotas/{k}"), None)
                .await
                .json()
        }
    };
    assert_eq!(in_force(get_doc(expired).await), false);
    assert_eq!(in_force(get_doc(future).await), false);
    assert_eq!(in_force(get_doc(current).await), true);
}

on_both_stores!(
    postgres_an_override_applies_only_between_effective_at_and_expires_at,
    sqlite_an_override_applies_only_between_effective_at_and_expires_at,
    overrides_apply_only_between_effective_at_and_expires_at
);

// ---------------------------------------------------------------------------------------------

/// Poll one request at a time until `key` gets `want` on every gateway, within 2 s of `since`.
async fn until_status(gws: &[&Gateway], key: &str, want: u16, since: Instant) {
    for gw in gws {
        let left = PROPAGATION.saturating_sub(since.elapsed());
        eventually(
            format!("{}: {key} gets {want} within 2 s", gw.proc.name()),
            left.max(Duration::from_millis(1)),
        )
        .every(Duration::from_millis(25))
        .holds_on(|| status_of(gw, key), |s| *s == want)
        .await;
    }
}

async fn disabled_keys_and_unknown_keys_get_401(kind: Kind) {
    let db = Db::start(kind);
    let up = Upstream::start().await;
    // Each gateway counts alone (memory store); the quota store is shared.
    let yaml = config(MEMORY, &db, &up, 1000, ", require_known_keys: true");
    let g1 = start("one", &yaml).await;
    let g2 = start("two", &yaml).await;
    let both = [&g1, &g2];
    let (listed, tenant, stranger) = ("listed-key-0001", "tenant-key-9c41", "stranger-key-77");

    // require_known_keys: a key in api_keys is served, one in neither place gets 401.
    for gw in both {
        assert_eq!(status_of(gw, listed).await, 200);
        let r = get(&client(), &gw.url("/api/thing"), &[("x-api-key", stranger)]).await;
        assert_eq!(r.status.as_u16(), 401, "{}", r.text());
        assert_eq!(r.header("content-type"), "application/problem+json");
    }
    // A key the quota store knows is known.
    let t = Instant::now();
    put(&g1, tenant, json!({"label": "acme"})).await;
    until_status(&both, tenant, 200, t).await;

    // Disabling a key revokes it on every gateway within 2 s: the store's key and a listed one.
    let t = Instant::now();
    put(&g2, tenant, json!({"status": "disabled"})).await;
    put(&g2, listed, json!({"status": "disabled"})).await;
    until_status(&both, tenant, 401, t).await;
    until_status(&both, listed, 401, t).await;
    let r = get(&client(), &g1.url("/api/thing"), &[("x-api-key", tenant)]).await;
    assert_eq!(r.header("content-type"), "application/problem+json");
    assert!(
        !r.text().contains(tenant),
        "the 401 echoes the key: {}",
        r.text()
    );

    // Deleting the override makes the listed key usable again.
    let t = Instant::now();
    let r = admin(
        &g1,
        Method::DELETE,
        &format!("/admin/v1/quotas/{listed}"),
        None,
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    until_status(&both, listed, 200, t).await;
    assert_eq!(status_of(&g1, tenant).await, 401, "still disabled");
    assert_no_raw_key(&[tenant, listed, stranger], &db, &both);
}

on_both_stores!(
    postgres_a_disabled_key_gets_401_on_every_gateway_and_so_does_an_unknown_one,
    sqlite_a_disabled_key_gets_401_on_every_gateway_and_so_does_an_unknown_one,
    disabled_keys_and_unknown_keys_get_401
);

// ---------------------------------------------------------------------------------------------

async fn usage_is_exact_and_read_only_and_reset_clears_one_key(kind: Kind) {
    let db = Db::start(kind);
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let gw = start("one", &config(&redis_store(&redis), &db, &up, 3, "")).await;
    let (a, b) = ("usage-key-a-1111", "usage-key-b-2222");
    assert_eq!(admitted(&[&gw], a, 2).await, 2);
    assert_eq!(admitted(&[&gw], b, 1).await, 1);

    let u = usage(&gw, a).await;
    assert_eq!(u["tier"], "free", "{u}");
    let hour = limit_of(&u, "free-hour");
    assert_eq!(
        (&hour["used"], &hour["limit"], &hour["remaining"]),
        (&json!(2), &json!(3), &json!(1)),
        "{u}"
    );
    // Seconds until the quota is whole again: for a sliding window of 1 h, up to 2 h (the
    // previous window's weight fades over the whole next window), as X-RateLimit-Reset says.
    let reset = hour["reset"].as_u64().expect("reset in seconds");
    assert!((3600..=7200).contains(&reset), "{u}");
    let not_enumerable: Vec<&str> = u["not_enumerable"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    assert_eq!(not_enumerable, ["per-ip"], "{u}");
    assert!(!u.to_string().contains(a), "usage echoes the raw key: {u}");

    // Reading usage consumes nothing: five reads later a still has exactly 1 left.
    for _ in 0..5 {
        assert_eq!(limit_of(&usage(&gw, a).await, "free-hour")["used"], 2);
    }
    assert_eq!(admitted(&[&gw], a, 3).await, 1, "a after reading its usage");

    // Reset clears a's counters and no one else's.
    let r = admin(
        &gw,
        Method::POST,
        &format!("/admin/v1/usage/{a}/reset"),
        None,
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    assert_eq!(limit_of(&usage(&gw, a).await, "free-hour")["used"], 0);
    assert_eq!(limit_of(&usage(&gw, b).await, "free-hour")["used"], 1);
    assert_eq!(admitted(&[&gw], a, 5).await, 3, "a after its reset");
    assert_eq!(admitted(&[&gw], b, 5).await, 2, "b was not reset");
    assert_eq!(up.requests().await, 2 + 1 + 1 + 3 + 2);
    // The reset is in the audit trail.
    let audit = admin(&gw, Method::GET, "/admin/v1/audit", None)
        .await
        .json();
    assert_eq!(audit["entries"][0]["action"], "reset", "{audit}");
}

on_both_stores!(
    postgres_usage_is_exact_and_read_only_and_reset_clears_only_that_key,
    sqlite_usage_is_exact_and_read_only_and_reset_clears_only_that_key,
    usage_is_exact_and_read_only_and_reset_clears_one_key
);

// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_needs_the_token_and_never_answers_on_the_proxy_port() {
    let db = Db::start(Kind::Sqlite);
    let up = Upstream::start().await;
    let gw = start("token", &config(MEMORY, &db, &up, 3, "")).await;
    let c = client();
    let url = format!("http://{}/admin/v1/quotas", gw.admin);

    let r = get(&c, &url, &[]).await;
    assert_eq!(r.status.as_u16(), 401, "no token: {}", r.text());
    let r = get(&c, &url, &[("authorization", "Bearer wrong-token")]).await;
    assert_eq!(r.status.as_u16(), 403, "wrong token: {}", r.text());
    let r = send(
        &c,
        Method::PUT,
        &format!("{url}/some-key-123"),
        &[("authorization", "Bearer wrong-token")],
        Some(br#"{"tier":"gold"}"#.to_vec()),
    )
    .await;
    assert_eq!(
        r.status.as_u16(),
        403,
        "PUT with a wrong token: {}",
        r.text()
    );
    let r = get(&c, &url, &[("authorization", &format!("Bearer {TOKEN}"))]).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    assert_eq!(
        r.json()["overrides"],
        json!([]),
        "the wrong-token PUT wrote nothing"
    );
    // Load balancers and Prometheus need no token.
    for open in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(gw.admin_get(open, &[]).await.status.as_u16(), 200, "{open}");
    }

    // The proxy port has no admin routes, even for a request claiming to come from loopback
    // through a trusted proxy: it is proxied like any other path.
    let before = up.requests().await;
    for method in [Method::GET, Method::PUT] {
        let r = send(
            &c,
            method.clone(),
            &gw.url("/admin/v1/quotas/some-key-123"),
            &[
                ("x-forwarded-for", "127.0.0.1"),
                ("authorization", &format!("Bearer {TOKEN}")),
            ],
            (method == Method::PUT).then(|| br#"{"tier":"gold"}"#.to_vec()),
        )
        .await;
        assert_eq!(r.status.as_u16(), 200, "{method} on the proxy port");
        assert!(r.json()["overrides"].is_null() && r.json()["tier"].is_null());
    }
    assert_eq!(up.requests().await, before + 2, "both went to the upstream");
    let r = get(&c, &url, &[("authorization", &format!("Bearer {TOKEN}"))]).await;
    assert_eq!(
        r.json()["overrides"],
        json!([]),
        "nothing was written through the proxy"
    );

    // With no admin token configured, /admin/v1/* is refused, saying how to enable it.
    let db2 = Db::start(Kind::Sqlite);
    let yaml =
        config(MEMORY, &db2, &up, 3, "").replace("admin: { token_env: TG_ADMIN_TOKEN }\n", "");
    let open = Gateway::start_named("no token", &yaml, &[], &[]).await;
    let r = get(&c, &format!("http://{}/admin/v1/quotas", open.admin), &[]).await;
    assert_eq!(r.status.as_u16(), 403, "{}", r.text());
    assert!(r.text().contains("admin.token_env"), "{}", r.text());
}

// ---------------------------------------------------------------------------------------------

async fn every_bad_body_gets_a_400_naming_its_field(kind: Kind) {
    let db = Db::start(kind);
    let up = Upstream::start().await;
    let gw = start("bodies", &config(MEMORY, &db, &up, 3, "")).await;
    let cases: &[(&str, &str)] = &[
        ("{}", "body"),
        ("not json", "body"),
        (r#"{"tier":"platinum"}"#, "tier"),
        (r#"{"tierr":"gold"}"#, "tierr"),
        (r#"{"label":5}"#, "label"),
        (r#"{"status":"paused"}"#, "status"),
        (r#"{"limits":5}"#, "limits"),
        (r#"{"limits":{"nope":{"limit":1}}}"#, "limits.nope"),
        (r#"{"limits":{"free-hour":{}}}"#, "limits.free-hour"),
        (
            r#"{"limits":{"free-hour":{"limit":0}}}"#,
            "limits.free-hour.limit",
        ),
        (
            r#"{"limits":{"free-hour":{"limit":"many"}}}"#,
            "limits.free-hour.limit",
        ),
        (
            r#"{"limits":{"free-hour":{"window":"1x"}}}"#,
            "limits.free-hour.window",
        ),
        (
            r#"{"limits":{"free-hour":{"burst":5}}}"#,
            "limits.free-hour.burst",
        ),
        (r#"{"effective_at":"tomorrow"}"#, "effective_at"),
        (r#"{"expires_at":"soon"}"#, "expires_at"),
        (
            r#"{"effective_at":"2027-01-01T00:00:00Z","expires_at":"2026-01-01T00:00:00Z"}"#,
            "expires_at",
        ),
    ];
    for (body, field) in cases {
        let r = send(
            &client(),
            Method::PUT,
            &format!("http://{}/admin/v1/quotas/bad-body-key-1", gw.admin),
            &[("authorization", &format!("Bearer {TOKEN}"))],
            Some(body.as_bytes().to_vec()),
        )
        .await;
        assert_eq!(r.status.as_u16(), 400, "{body}: {}", r.text());
        assert_eq!(
            r.header("content-type"),
            "application/problem+json",
            "{body}"
        );
        let p = r.json();
        assert_eq!(p["field"], *field, "{body}: {p}");
        assert!(
            p["detail"].as_str().unwrap().starts_with(field),
            "{body}: {p}"
        );
    }
    // A key that is neither a key nor a fingerprint, and a body too large.
    let r = admin(&gw, Method::GET, "/admin/v1/quotas/fp:XYZ", None).await;
    assert_eq!(
        (r.status.as_u16(), r.json()["field"].clone()),
        (400, json!("key"))
    );
    let big = json!({ "label": "x".repeat(100 * 1024) });
    let r = admin(
        &gw,
        Method::PUT,
        "/admin/v1/quotas/bad-body-key-1",
        Some(big),
    )
    .await;
    assert_eq!(r.status.as_u16(), 413, "{}", r.text());
    // Nothing was written.
    let list = admin(&gw, Method::GET, "/admin/v1/quotas", None)
        .await
        .json();
    assert_eq!(list["overrides"], json!([]), "{list}");
}

on_both_stores!(
    postgres_every_bad_body_gets_a_400_naming_its_field,
    sqlite_every_bad_body_gets_a_400_naming_its_field,
    every_bad_body_gets_a_400_naming_its_field
);

// ---------------------------------------------------------------------------------------------

/// The `quotas` object of `/readyz`, which must answer 200.
async fn quotas_status(gw: &Gateway) -> Value {
    let (status, body) = gw.readyz_status().await;
    assert_eq!(status, 200, "/readyz: {body}");
    body["quotas"].clone()
}

fn stale_gauge(text: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with("tollgate_quota_overrides_stale"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_down_mid_run_the_gateway_serves_its_cached_overrides_and_catches_up() {
    let mut db = Db::start(Kind::Postgres);
    let up = Upstream::start().await;
    let yaml = config(MEMORY, &db, &up, 3, "").replace("refresh: 30s", "refresh: 1s");
    let gw = start("one", &yaml).await;
    let (a, b) = ("cached-key-a-01", "later-key-b-002");
    let t = Instant::now();
    put(&gw, a, json!({"tier": "gold"})).await;
    until_usage(&[&gw], a, t, |u| u["tier"] == "gold").await;
    assert_eq!(quotas_status(&gw).await["stale_since"], Value::Null);

    let Db::Pg(pg) = &mut db else { unreachable!() };
    pg.stop();
    // Ready, and saying its overrides are stale.
    eventually(
        "/readyz reports the overrides stale",
        Duration::from_secs(10),
    )
    .holds_on(|| quotas_status(&gw), |q| q["stale_since"].is_string())
    .await;
    let metrics = gw.admin_get("/metrics", &[]).await.text();
    assert_eq!(stale_gauge(&metrics), Some(1.0), "{metrics}");
    // Requests are served with the cached override: gold's 8.
    assert_eq!(admitted(&[&gw], a, 10).await, 8, "{a} on cached overrides");
    // A change cannot be made while the database is down: 503, nothing half-done.
    let r = admin(
        &gw,
        Method::PUT,
        &format!("/admin/v1/quotas/{b}"),
        Some(json!({"tier": "gold"})),
    )
    .await;
    assert_eq!(r.status.as_u16(), 503, "{}", r.text());

    pg.start_again();
    eventually(
        "/readyz reports the overrides fresh again",
        Duration::from_secs(15),
    )
    .holds_on(|| quotas_status(&gw), |q| q["stale_since"].is_null())
    .await;
    // A change made after the database is back reaches the gateway.
    let path = format!("/admin/v1/quotas/{b}");
    let r = eventually(
        "a PUT succeeds once PostgreSQL is back",
        Duration::from_secs(15),
    )
    .holds_on(
        || admin(&gw, Method::PUT, &path, Some(json!({"tier": "gold"}))),
        |r| r.status.as_u16() == 201,
    )
    .await;
    assert_eq!(r.json()["tier"], "gold");
    let t = Instant::now();
    until_usage(&[&gw], b, t, |u| u["tier"] == "gold").await;
    assert_eq!(admitted(&[&gw], b, 10).await, 8, "{b} after the outage");
    let metrics = gw.admin_get("/metrics", &[]).await.text();
    assert_eq!(stale_gauge(&metrics), Some(0.0), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_started_while_postgres_is_down_serves_and_loads_the_overrides_when_it_returns() {
    let mut db = Db::start(Kind::Postgres);
    let up = Upstream::start().await;
    let yaml = config(MEMORY, &db, &up, 3, "").replace("refresh: 30s", "refresh: 1s");
    let key = "early-key-c-0003";
    {
        let first = start("first", &yaml).await;
        let t = Instant::now();
        put(&first, key, json!({"tier": "gold"})).await;
        until_usage(&[&first], key, t, |u| u["tier"] == "gold").await;
    }
    let Db::Pg(pg) = &mut db else { unreachable!() };
    pg.stop();

    let gw = start("second", &yaml).await;
    let q = quotas_status(&gw).await;
    assert!(
        q["state"].as_str().unwrap().starts_with("not loaded"),
        "{q}"
    );
    // Serving with the config file alone: the key is in `free`.
    assert_eq!(
        admitted(&[&gw], key, 5).await,
        3,
        "{key} before the overrides load"
    );

    pg.start_again();
    eventually(
        "the overrides load once PostgreSQL answers",
        Duration::from_secs(15),
    )
    .holds_on(|| quotas_status(&gw), |q| q["state"] == "loaded")
    .await;
    assert_eq!(usage(&gw, key).await["tier"], "gold");
    assert_eq!(admitted(&[&gw], key, 10).await, 8, "{key} once loaded");
}

// ---------------------------------------------------------------------------------------------

/// `tollgate quotas …` with `env`: exit code, stdout, stderr.
fn cli(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("quotas")
        .args(args)
        .envs(env.iter().copied())
        .env_remove("TOLLGATE_CONFIG")
        .output()
        .expect("run tollgate quotas");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quotas_command_drives_the_admin_api() {
    let db = Db::start(Kind::Sqlite);
    let up = Upstream::start().await;
    let gw = start("cli", &config(MEMORY, &db, &up, 3, "")).await;
    // The command finds the admin listener and the token's variable in a config file.
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("gateway.yaml");
    std::fs::write(
        &cfg,
        format!(
            "server: {{ admin_listen: \"{}\" }}\nadmin: {{ token_env: TG_ADMIN_TOKEN }}\n",
            gw.admin
        ),
    )
    .unwrap();
    let cfg = cfg.display().to_string();
    let key = "cli-key-5e6f7a8b";
    let run = |args: &[&str]| {
        let mut all = vec!["-c", cfg.as_str()];
        all.extend_from_slice(args);
        cli(&all, &[TOKEN_ENV])
    };

    let (code, out, err) = run(&[
        "set",
        key,
        "--tier",
        "gold",
        "--label",
        "acme-prod",
        "--limit",
        "gold-hour=5/1h",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("gold") && out.contains("acme-prod"), "{out}");
    assert!(!out.contains(key), "the table shows the raw key: {out}");

    let (code, out, err) = run(&["list"]);
    assert_eq!(code, 0, "{err}");
    let rows: Vec<&str> = out.lines().collect();
    assert_eq!(rows.len(), 2, "a header and one row: {out}");
    assert!(
        rows[0].starts_with("KEY") && rows[1].starts_with("fp:"),
        "{out}"
    );
    let fp = rows[1].split_whitespace().next().unwrap().to_string();

    let (code, out, _) = run(&["--json", "get", &fp]);
    assert_eq!(code, 0);
    let doc: Value = serde_json::from_str(&out).expect("--json prints JSON");
    assert_eq!(
        (&doc["tier"], &doc["limits"]["gold-hour"]),
        (&json!("gold"), &json!({"limit": 5, "window": "1h"}))
    );

    assert_eq!(admitted(&[&gw], key, 2).await, 2);
    let (code, out, _) = run(&["usage", key]);
    assert_eq!(code, 0);
    let row = out
        .lines()
        .find(|l| l.starts_with("gold-hour"))
        .expect(&out);
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        &cols[1..4],
        ["2", "5", "3"],
        "used, limit, remaining: {out}"
    );

    let (code, out, _) = run(&["reset", key]);
    assert_eq!((code, out.contains("counters reset")), (0, true), "{out}");
    let (_, out, _) = run(&["--json", "usage", key]);
    let u: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(limit_of(&u, "gold-hour")["used"], 0);

    let (code, out, _) = run(&["audit"]);
    assert_eq!(code, 0);
    assert_eq!(
        out.lines().count(),
        3,
        "a header, the put and the reset: {out}"
    );

    let (code, out, _) = run(&["delete", &fp]);
    assert_eq!(
        (code, out.trim()),
        (0, format!("{fp}: override deleted").as_str())
    );
    let (code, _, err) = run(&["get", key]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("404"), "{err}");

    // A wrong token, an unset token variable, and a bad --limit each say what is wrong.
    let (code, _, err) = cli(&["-c", &cfg, "list"], &[("TG_ADMIN_TOKEN", "wrong")]);
    assert_eq!((code, err.contains("403")), (1, true), "{err}");
    let (code, _, err) = cli(&["-c", &cfg, "list"], &[]);
    assert_eq!((code, err.contains("TG_ADMIN_TOKEN")), (2, true), "{err}");
    let (code, _, err) = run(&["set", key, "--limit", "gold-hour"]);
    assert_eq!((code, err.contains("--limit")), (2, true), "{err}");
    // --admin-url wins over the config.
    let (code, _, err) = cli(
        &[
            "--admin-url",
            &format!("http://{}", gw.admin),
            "--token-env",
            "TG_ADMIN_TOKEN",
            "list",
        ],
        &[TOKEN_ENV],
    );
    assert_eq!(code, 0, "{err}");
}
