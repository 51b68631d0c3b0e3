//! No secret in any output (issue 39, item 6). One gateway on a real Redis whose password
//! holds `@` and a real PostgreSQL quota store whose URL carries `?password=`, with a JWT
//! secret and an admin token from its environment, gets traffic carrying a known secret in
//! every place a client puts one (the API key header, a bearer JWT, the query string, a
//! cookie, and the API key and JWT in the path too), to a route whose upstream refuses
//! connections (so Pingora logs its own ERROR line) and to one that answers. None of those
//! secrets may appear in the process log (stdout and stderr), the access log, `tollgate
//! check`'s output (a good file and files whose URLs are wrong), the reload answer (refused
//! and accepted) and the log's account of a refused reload, `/readyz`, `/admin/v1/config`, `/metrics`, `/top` or `/stats`.

mod common;

use std::process::Command;
use std::time::Duration;

use reqwest::Method;
use serde_json::json;

use common::clock::clear_of_window_boundary;
use common::gateway::Gateway;
use common::http::{client, get, send, Resp};
use common::postgres::Postgres;
use common::process::{count, free_port};
use common::redis::RedisServer;
use common::upstream::Upstream;
use common::wait::eventually;

const API_KEY: &str = "sk_apikey_Q7wX9v";
const QUERY_SECRET: &str = "qry_pw_Z3k8Lm";
const COOKIE_SECRET: &str = "cky_sess_M4n2Pq";
/// The Redis password is `A@B`: each half is looked for on its own.
const REDIS_PW: (&str, &str) = ("rds_pw_A1x", "rds_pw_B2y");
const PG_SECRET: &str = "pg_pw_T6v1Rs";
const JWT_SECRET: &str = "jwt_hs256_secret_K9j3";
const ADMIN_TOKEN: &str = "adm_token_W5e7Ht";

const ENV_JWT: &str = "TG_SECRETS_JWT";
const ENV_ADMIN: &str = "TG_SECRETS_ADMIN";
const HOUR: u64 = 3600;

fn jwt() -> String {
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
        + HOUR;
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &json!({ "sub": "alice", "exp": exp }),
        &jsonwebtoken::EncodingKey::from_secret(JWT_SECRET.as_bytes()),
    )
    .expect("encode JWT")
}

/// Every secret, and the parts of each that must not show either.
fn needles(token: &str) -> Vec<String> {
    let signature = token.rsplit('.').next().expect("a JWT has three parts");
    [
        API_KEY,
        QUERY_SECRET,
        COOKIE_SECRET,
        REDIS_PW.0,
        REDIS_PW.1,
        PG_SECRET,
        JWT_SECRET,
        ADMIN_TOKEN,
        token,
        signature,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// What the test saw: every output, and every output whose form is not the one expected
/// (reported after the leaks, so that today's code fails on what it shows).
#[derive(Default)]
struct Seen {
    outputs: Vec<(String, String)>,
    unexpected: Vec<String>,
}

impl Seen {
    fn output(&mut self, place: impl Into<String>, text: String) {
        self.outputs.push((place.into(), text));
    }

    fn expect<T: PartialEq + std::fmt::Debug>(&mut self, what: &str, got: T, want: T) {
        if got != want {
            self.unexpected
                .push(format!("{what}:\n   got {got:?}\n  want {want:?}"));
        }
    }

    /// The places where a needle shows.
    fn leaks(&self, needles: &[String]) -> Vec<String> {
        let mut found = Vec::new();
        for (place, text) in &self.outputs {
            for n in needles.iter().filter(|n| text.contains(n.as_str())) {
                found.push(format!("{n:?} in {place}:\n{text}\n"));
            }
        }
        found
    }
}

struct Urls {
    redis: String,
    database: String,
    /// `quotas: "URL"` instead of `quotas: { database: "URL" }`: a mistake serde reports
    /// quoting the value it refused.
    quotas_as_string: bool,
}

/// The gateway's config: a tier limiting the API key to 3 an hour, a route whose upstream
/// refuses connections, Redis and PostgreSQL with passwords, the access log to `log`.
fn config(up: &Upstream, dead: u16, urls: &Urls, log: &std::path::Path) -> String {
    format!(
        r#"store: {{ backend: redis, url: "{redis}" }}
identity: {{ api_key_header: x-api-key, jwt: {{ hs256_secret_env: {ENV_JWT} }} }}
tiers:
  free: [ {{ name: per-key, key: [api_key], algorithm: fixed_window, limit: 3, window: 1h }} ]
api_keys: {{ {API_KEY}: free }}
upstreams: {{ backend: ["{up}"], broken: ["127.0.0.1:{dead}"] }}
routes:
  - {{ name: broken, match: {{ path_prefix: /broken }}, upstream: broken }}
  - {{ name: default, match: {{ path_prefix: / }}, upstream: backend }}
quotas: {quotas}
admin: {{ token_env: {ENV_ADMIN} }}
access_log: {{ path: "{log}" }}
"#,
        redis = urls.redis,
        quotas = match urls.quotas_as_string {
            false => format!("{{ database: \"{}\", refresh: 1s }}", urls.database),
            true => format!("\"{}\"", urls.database),
        },
        up = up.addr,
        log = log.display(),
    )
}

/// `tollgate check FILE` with the gateway's environment: its exit code and stdout + stderr.
fn check(path: &std::path::Path) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["check", &path.display().to_string()])
        .env(ENV_JWT, JWT_SECRET)
        .env(ENV_ADMIN, ADMIN_TOKEN)
        .output()
        .expect("run tollgate check");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

async fn admin(gw: &Gateway, method: Method, path: &str) -> Resp {
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let url = format!("http://{}{path}", gw.admin);
    send(&client(), method, &url, &[("authorization", &bearer)], None).await
}

/// A client request with a secret in every place, to `/{route}/...`: its status.
async fn request(gw: &Gateway, route: &str, token: &str) -> u16 {
    let bearer = format!("Bearer {token}");
    let cookie = format!("session={COOKIE_SECRET}");
    let headers = [
        ("x-api-key", API_KEY),
        ("authorization", bearer.as_str()),
        ("cookie", cookie.as_str()),
    ];
    let url = gw.url(&format!(
        "/{route}/{API_KEY}/{token}?password={QUERY_SECRET}&api_key={API_KEY}&jwt={token}"
    ));
    get(&client(), &url, &headers).await.status.as_u16()
}

/// Config files whose URLs are wrong (one that does not parse, one of another scheme, one
/// Redis refuses, one where a section should be), each with the errors `check` must print (after `FILE: `).
fn wrong_urls(
    redis_port: u16,
    password: &str,
    good: &Urls,
) -> Vec<(&'static str, Urls, Vec<String>)> {
    vec![
        (
            "unparsed-and-scheme",
            Urls {
                redis: format!("redis://:{password}@127.0.0.1:port/0"),
                database: format!("mysql://tollgate:{PG_SECRET}@127.0.0.1/q?password={PG_SECRET}"),
                quotas_as_string: false,
            },
            vec![
                "store.url: not a Redis URL: it does not parse as a URL (invalid port number); \
                 it is not shown, as it may hold a password"
                    .to_string(),
                "quotas.database: \"mysql://tollgate:***@127.0.0.1/q?password=***\" is not a \
                 PostgreSQL or SQLite URL (postgres://user@host/db, sqlite://PATH)"
                    .to_string(),
            ],
        ),
        (
            "redis-refuses",
            Urls {
                redis: format!(
                    "redis://:{password}@127.0.0.1:{redis_port}/db?password={PG_SECRET}"
                ),
                database: good.database.clone(),
                quotas_as_string: false,
            },
            vec![format!(
                "store.url: \"redis://:***@127.0.0.1:{redis_port}/db?password=***\" is not a \
                 Redis URL: Invalid database number - InvalidClientConfig"
            )],
        ),
        (
            "quotas-as-a-string",
            Urls {
                redis: good.redis.clone(),
                database: good.database.clone(),
                quotas_as_string: true,
            },
            vec![format!(
                "quotas: invalid type: string \"{}\", expected struct Quotas",
                good.database.replace(PG_SECRET, "***")
            )],
        ),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn no_secret_shows_in_any_output() {
    clear_of_window_boundary(HOUR, 30).await;
    let redis = RedisServer::start();
    let password = format!("{}@{}", REDIS_PW.0, REDIS_PW.1);
    assert_eq!(
        redis.cli(&["CONFIG", "SET", "requirepass", &password]),
        "OK"
    );
    let pg = Postgres::start();
    let up = Upstream::start().await;
    let dead = free_port();
    let good = Urls {
        redis: format!("redis://:{password}@127.0.0.1:{}/0", redis.port),
        database: format!("{}?password={PG_SECRET}", pg.url()),
        quotas_as_string: false,
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("access.log");
    let yaml = config(&up, dead, &good, &log);
    let env = [(ENV_JWT, JWT_SECRET), (ENV_ADMIN, ADMIN_TOKEN)];
    let gw = Gateway::start_with_env(&yaml, &env).await;
    let token = jwt();
    let mut seen = Seen::default();

    // The store and the quota database answer with those passwords.
    let ready = eventually("the quota overrides are loaded", Duration::from_secs(20))
        .holds_on(|| gw.readyz(), |r| r["quotas"]["state"] == "loaded")
        .await;
    assert_eq!(ready["store"], "ok", "{ready}");

    // Traffic with a secret in every place: first to the upstream that refuses connections
    // (Pingora logs its ERROR line), then to the one that answers, up to the per-key limit.
    let mut statuses = vec![request(&gw, "broken", &token).await];
    for _ in 0..3 {
        statuses.push(request(&gw, "orders", &token).await);
    }
    assert_eq!(statuses, [502, 200, 200, 429]);
    gw.wait_output("Fail to proxy", Duration::from_secs(5))
        .await;
    // Pingora's ERROR line names the request by method, logged path and route only.
    let fp = tollgate::fingerprint::fingerprint(API_KEY).to_string();
    let summary = format!("GET /broken/{fp}/[token] route=broken");
    let error_line = gw
        .output()
        .lines()
        .find(|l| l.contains("Fail to proxy"))
        .map(str::to_string);
    seen.expect(
        "the ERROR line ends with the summary",
        error_line.as_ref().map(|l| l.ends_with(&summary)),
        Some(true),
    );

    // The admin listener's pages.
    for path in ["/readyz", "/admin/v1/config", "/metrics", "/top", "/stats"] {
        let r = admin(&gw, Method::GET, path).await;
        assert_eq!(r.status.as_u16(), 200, "GET {path}: {}", r.text());
        seen.output(format!("GET {path}"), r.text());
    }
    let cfg = admin(&gw, Method::GET, "/admin/v1/config").await.json();
    let redis_shown = format!("redis://:***@127.0.0.1:{}/0", redis.port);
    seen.expect(
        "config store.redis.url",
        cfg["store"]["redis"]["url"].clone(),
        json!(redis_shown),
    );
    let db_shown = format!("{}?password=***", pg.url());
    seen.expect(
        "config quotas.database",
        cfg["quotas"]["database"].clone(),
        json!(db_shown),
    );
    let ready = gw.readyz().await;
    seen.expect(
        "/readyz quotas.database",
        ready["quotas"]["database"].clone(),
        json!(db_shown),
    );
    let top = admin(&gw, Method::GET, "/top").await.json();
    assert_eq!(top["callers"][0]["caller"], fp, "{top}");

    // `tollgate check` and the reload answer, on the good file and on files whose URLs are
    // wrong. A refused reload is logged too (SIGHUP).
    let good_file = dir.path().join("good.yaml");
    std::fs::write(&good_file, &yaml).expect("write");
    assert_eq!(check(&good_file), (Some(0), "ok\n".to_string()));
    let r = admin(&gw, Method::POST, "/admin/v1/reload").await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    seen.output("the reload answer (accepted)", r.text());
    for (name, urls, errors) in wrong_urls(redis.port, &password, &good) {
        let file = dir.path().join(format!("{name}.yaml"));
        let text = config(&up, dead, &urls, &log);
        std::fs::write(&file, &text).expect("write");
        let (code, out) = check(&file);
        assert_eq!(code, Some(1), "{name}: {out}");
        let want: String = errors
            .iter()
            .map(|e| format!("{}: {e}\n", file.display()))
            .collect();
        seen.expect(&format!("tollgate check ({name})"), out.clone(), want);
        seen.output(format!("tollgate check ({name})"), out);

        gw.replace_config(&text);
        let r = admin(&gw, Method::POST, "/admin/v1/reload").await;
        assert_eq!(r.status.as_u16(), 400, "{}", r.text());
        let label = gw.config_path().display().to_string();
        let want: Vec<String> = errors.iter().map(|e| format!("{label}: {e}")).collect();
        seen.expect(
            &format!("the reload answer ({name})"),
            r.json()["errors"].clone(),
            json!(want),
        );
        seen.output(format!("the reload answer ({name})"), r.text());
        let refused = || count(&gw.output(), "config reload rejected (SIGHUP)");
        let before = refused();
        gw.sighup();
        eventually("the SIGHUP reload is refused", Duration::from_secs(5))
            .holds(|| refused() > before)
            .await;
    }
    gw.replace_config(&yaml);
    let r = admin(&gw, Method::POST, "/admin/v1/reload").await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());

    // The access log has the four requests' lines; then everything the process wrote.
    let lines = eventually("4 access-log lines", Duration::from_secs(10))
        .holds(|| {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if count(&text, "\n") >= 4 {
                Ok(text)
            } else {
                Err(text)
            }
        })
        .await;
    seen.output("the access log", lines);
    seen.output("the process log", gw.output());

    let found = seen.leaks(&needles(&token));
    assert!(found.is_empty(), "secrets shown:\n{}", found.join("\n"));
    assert!(seen.unexpected.is_empty(), "{}", seen.unexpected.join("\n"));
}
