//! The quota store on its own, against a real PostgreSQL and a real SQLite file with the same
//! tests: the schema is applied once, overrides are written, read, listed by fingerprint and
//! deleted with an audit entry each, and nothing holds a raw API key.

mod common;

use common::postgres::Postgres;
use tollgate::config::{from_yaml, Config, Overrides};
use tollgate::fingerprint::fingerprint;
use tollgate::quota::model::{AuditEntry, KeyHash, PutBody, Status};
use tollgate::quota::Db;

const YAML: &str = r#"
tiers:
  free: [ { name: free-minute, limit: 10, window: 1m } ]
  gold: [ { name: gold-minute, limit: 5000, window: 1m } ]
default_tier: free
upstreams: { b: ["127.0.0.1:9"] }
routes: [ { name: r, match: { path_prefix: / }, upstream: b } ]
limits: [ { name: inflight, kind: concurrency, key: [api_key], limit: 5, timeout: 10s } ]
"#;

fn config() -> Config {
    from_yaml("t.yaml", YAML, &Overrides::default()).unwrap()
}

fn audit(action: &str, fp: &str, n: i64) -> AuditEntry {
    AuditEntry {
        id: format!("{n:016x}-00000000"),
        at: n,
        fingerprint: fp.into(),
        action: action.into(),
        before: None,
        after: None,
        client: "127.0.0.1".into(),
    }
}

const KEY: &str = "sk_live_A1B2C3D4E5F6";

async fn exercise(db: &Db, dump: impl Fn() -> String) {
    let cfg = config();
    let key = KeyHash::of(KEY);
    let fp = fingerprint(KEY);
    let body = PutBody::parse(
        br#"{"tier":"gold","label":"acme-prod","limits":{"free-minute":{"limit":20}}}"#,
    )
    .unwrap();
    let o = body.apply(&cfg, None, key, fp.hex(), 1_000).unwrap();
    db.put(&o, &audit("put", fp.hex(), 1)).await.unwrap();
    assert_eq!(db.get(&key).await.unwrap().as_ref(), Some(&o));
    assert_eq!(db.by_fingerprint(fp.hex()).await.unwrap(), vec![key]);

    // A second PUT changes only what it names.
    let o2 = PutBody::parse(br#"{"status":"disabled"}"#)
        .unwrap()
        .apply(&cfg, Some(o.clone()), key, fp.hex(), 2_000)
        .unwrap();
    assert_eq!(
        (o2.tier.as_deref(), o2.status),
        (Some("gold"), Status::Disabled)
    );
    db.put(&o2, &audit("put", fp.hex(), 2)).await.unwrap();

    for i in 0..5 {
        let k = format!("other-{i}");
        let o = PutBody::parse(br#"{"label":"x"}"#)
            .unwrap()
            .apply(&cfg, None, KeyHash::of(&k), fingerprint(&k).hex(), 3_000)
            .unwrap();
        db.put(&o, &audit("put", o.fingerprint.as_str(), 3 + i))
            .await
            .unwrap();
    }
    assert_eq!(db.all().await.unwrap().len(), 6);
    let page1 = db.list(4, None).await.unwrap();
    let cursor = format!("{}:{}", page1[3].fingerprint, page1[3].key_hash.hex());
    let page2 = db.list(4, Some(&cursor)).await.unwrap();
    assert_eq!((page1.len(), page2.len()), (4, 2));
    assert!(page1
        .iter()
        .chain(&page2)
        .map(|o| &o.fingerprint)
        .is_sorted());

    let audit_all = db.audit_page(100, None).await.unwrap();
    assert_eq!(audit_all.len(), 7);
    assert!(
        audit_all.windows(2).all(|w| w[0].id > w[1].id),
        "newest first"
    );
    assert!(db
        .delete(&key, &audit("delete", fp.hex(), 20))
        .await
        .unwrap());
    assert!(!db
        .delete(&key, &audit("delete", fp.hex(), 21))
        .await
        .unwrap());
    assert_eq!(db.get(&key).await.unwrap(), None);
    assert_eq!(db.audit_page(2, None).await.unwrap()[0].action, "delete");

    let everything = dump();
    assert!(!everything.contains(KEY), "the raw key is stored somewhere");
}

#[tokio::test]
async fn bad_bodies_name_their_field() {
    let cfg = config();
    let key = KeyHash::of(KEY);
    let cases: &[(&[u8], &str)] = &[
        (b"{}", "body"),
        (b"not json", "body"),
        (br#"{"tier":"platinum"}"#, "tier"),
        (br#"{"tierr":"gold"}"#, "tierr"),
        (br#"{"status":"paused"}"#, "status"),
        (br#"{"limits":{"nope":{"limit":1}}}"#, "limits.nope"),
        (br#"{"limits":{"inflight":{"limit":1}}}"#, "limits.inflight"),
        (
            br#"{"limits":{"free-minute":{"limit":0}}}"#,
            "limits.free-minute.limit",
        ),
        (
            br#"{"limits":{"free-minute":{"window":"1x"}}}"#,
            "limits.free-minute.window",
        ),
        (
            br#"{"limits":{"free-minute":{"burst":5}}}"#,
            "limits.free-minute.burst",
        ),
        (
            br#"{"limits":{"free-minute":{"limt":5}}}"#,
            "limits.free-minute.limt",
        ),
        (br#"{"limits":{"free-minute":{}}}"#, "limits.free-minute"),
        (br#"{"effective_at":"tomorrow"}"#, "effective_at"),
        (
            br#"{"effective_at":"2027-01-01T00:00:00Z","expires_at":"2026-01-01T00:00:00Z"}"#,
            "expires_at",
        ),
        (br#"{"limits":5}"#, "limits"),
    ];
    for (body, field) in cases {
        let err = PutBody::parse(body)
            .and_then(|b| b.apply(&cfg, None, key, "00000000", 0))
            .expect_err(&String::from_utf8_lossy(body));
        assert_eq!(
            err.field,
            *field,
            "{}: {err:?}",
            String::from_utf8_lossy(body)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_keeps_overrides_and_their_audit_without_raw_keys() {
    let pg = Postgres::start();
    let db = Db::connect(&pg.url(), std::time::Duration::from_secs(5))
        .await
        .unwrap();
    assert!(db.is_postgres());
    // Connecting again applies no migration twice.
    Db::connect(&pg.url(), std::time::Duration::from_secs(5))
        .await
        .unwrap();
    exercise(&db, || pg.dump()).await;
}

#[tokio::test]
async fn sqlite_keeps_overrides_and_their_audit_without_raw_keys() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("quotas.db");
    let url = format!("sqlite://{}", path.display());
    let db = Db::connect(&url, std::time::Duration::from_secs(5))
        .await
        .unwrap();
    assert!(!db.is_postgres());
    Db::connect(&url, std::time::Duration::from_secs(5))
        .await
        .unwrap();
    exercise(&db, || {
        String::from_utf8_lossy(&std::fs::read(&path).unwrap()).into_owned()
    })
    .await;
}

/// The schema as the hand-written runner before sqlx's `Migrator` left it (its steps, and
/// `tollgate_schema` at version 3), with one override row in it.
const OLD_SCHEMA: &[&str] = &[
    "CREATE TABLE tollgate_schema (version BIGINT NOT NULL)",
    "CREATE TABLE tollgate_quota_overrides (key_hash TEXT PRIMARY KEY, fingerprint TEXT NOT NULL,
        label TEXT, tier TEXT, status TEXT NOT NULL, limits TEXT NOT NULL, effective_at BIGINT,
        expires_at BIGINT, created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL)",
    "CREATE INDEX tollgate_quota_fingerprint ON tollgate_quota_overrides (fingerprint)",
    "CREATE TABLE tollgate_quota_audit (id TEXT PRIMARY KEY, at BIGINT NOT NULL,
        fingerprint TEXT NOT NULL, action TEXT NOT NULL, before_doc TEXT, after_doc TEXT,
        client TEXT NOT NULL)",
    "INSERT INTO tollgate_schema (version) VALUES (1), (2), (3)",
    "INSERT INTO tollgate_quota_overrides VALUES (
        'abababababababababababababababababababababababababababababababab', '0000abcd', 'old',
        'gold', 'active', '{}', NULL, NULL, 1, 1)",
];

#[tokio::test]
async fn a_database_of_the_old_migration_runner_is_taken_over_with_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("quotas.db");
    let url = format!("sqlite://{}?mode=rwc", path.display());
    {
        sqlx::any::install_default_drivers();
        let pool = sqlx::AnyPool::connect(&url).await.unwrap();
        for step in OLD_SCHEMA {
            sqlx::query(sqlx::AssertSqlSafe(*step))
                .execute(&pool)
                .await
                .unwrap();
        }
        pool.close().await;
    }
    let db = Db::connect(&url, std::time::Duration::from_secs(5))
        .await
        .unwrap();
    let all = db.all().await.unwrap();
    assert_eq!(all.len(), 1, "{all:?}");
    assert_eq!(all[0].label.as_deref(), Some("old"));
    assert_eq!(db.by_fingerprint("0000abcd").await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_starting_together_on_a_new_postgres_migrate_it_once() {
    let pg = Postgres::start();
    let url = pg.url();
    let connects = (0..4).map(|_| Db::connect(&url, std::time::Duration::from_secs(10)));
    for db in futures_util::future::join_all(connects).await {
        db.expect("every gateway starts; the migrator's lock serializes them");
    }
    let out = std::process::Command::new("psql")
        .args([url.as_str(), "-At", "-c"])
        .arg("SELECT version, success FROM _sqlx_migrations ORDER BY version")
        .output()
        .expect("psql (apt-get install -y postgresql-client)");
    let applied = String::from_utf8_lossy(&out.stdout);
    assert_eq!(applied.trim(), "1|t", "{applied}");
}
