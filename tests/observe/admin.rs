//! The admin listener: its endpoints never answer on the proxy port, and the admin token
//! guards `/`, `/stats` and `/top` while `/healthz`, `/readyz` and `/metrics` stay open. A
//! browser signs in with a login form for a session cookie the proxy never forwards, and the
//! listener answers only to its own host names and refuses to be framed.

use serde_json::Value;

use reqwest::Method;

use crate::common::gateway::Gateway;
use crate::common::http::{client, get, send};
use crate::common::raw::RawConn;
use crate::common::upstream::Upstream;

const ADMIN_PATHS: [&str; 6] = ["/metrics", "/top", "/", "/stats", "/healthz", "/readyz"];

#[tokio::test(flavor = "multi_thread")]
async fn admin_endpoints_are_not_served_on_the_proxy_port() {
    let up = Upstream::start().await;
    // Behind a "trusted" proxy on loopback, so a forged X-Forwarded-For: 127.0.0.1 is believed
    // for identity, and still opens nothing.
    let trusted = "identity: { trusted_proxies: [\"127.0.0.0/8\"] }\n";
    let routes = |prefix: &str| {
        format!(
            "{}routes:\n  - {{ name: r, match: {{ path_prefix: {prefix} }}, upstream: backend }}\n{trusted}",
            up.upstreams_yaml()
        )
    };
    let catch_all = Gateway::start(&routes("/")).await;
    let c = client();
    for path in ADMIN_PATHS {
        for forged in [&[][..], &[("x-forwarded-for", "127.0.0.1")][..]] {
            let r = get(&c, &catch_all.url(path), forged).await;
            // The catch-all route proxies it: the demo upstream's echo, not an admin answer.
            let echo: Value = r.json();
            assert_eq!(echo["path"], path, "{path} {forged:?}: {}", r.text());
            assert!(!r.text().contains("tollgate_"), "{path}: {}", r.text());
        }
    }
    // Without a route for them, they are 404 problems.
    let gw = Gateway::start(&routes("/api")).await;
    for path in ADMIN_PATHS {
        let r = get(&c, &gw.url(path), &[("x-forwarded-for", "127.0.0.1")]).await;
        assert_eq!(r.status.as_u16(), 404, "{path}: {}", r.text());
        assert_eq!(r.header("content-type"), "application/problem+json");
    }
    assert_eq!(up.requests().await, (ADMIN_PATHS.len() * 2) as u64);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_admin_token_guards_the_pages_that_show_callers() {
    let up = Upstream::start().await;
    let token = "admin-token-for-observe-tests";
    let gw = Gateway::start_with_env(
        &crate::config(&up, "admin: { token_env: OBSERVE_ADMIN_TOKEN }\n"),
        &[("OBSERVE_ADMIN_TOKEN", token)],
    )
    .await;
    for open in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(gw.admin_get(open, &[]).await.status.as_u16(), 200, "{open}");
    }
    let bearer = format!("Bearer {token}");
    for guarded in ["/stats", "/top"] {
        let r = gw.admin_get(guarded, &[]).await;
        assert_eq!(r.status.as_u16(), 401, "{guarded}");
        assert_eq!(
            r.header("www-authenticate"),
            "Bearer realm=\"tollgate admin\""
        );
        let wrong = gw
            .admin_get(guarded, &[("authorization", "Bearer nope")])
            .await;
        assert_eq!(wrong.status.as_u16(), 403, "{guarded}");
        let ok = gw.admin_get(guarded, &[("authorization", &bearer)]).await;
        assert_eq!(ok.status.as_u16(), 200, "{guarded}");
        ok.json();
    }
    // The live page: a login form without the token. The token itself in the cookie (what
    // the page's script used to set) opens nothing: only a session from `POST /login` does.
    let login = gw.admin_get("/", &[]).await;
    assert_eq!(login.status.as_u16(), 401);
    assert!(login.text().contains("id=\"token\"") && !login.text().contains("id=\"top-body\""));
    assert!(login
        .text()
        .contains("<form id=\"login\" method=\"post\" action=\"/login\">"));
    let raw = format!("tollgate_admin={}", token.replace('-', "%2D"));
    assert_eq!(
        gw.admin_get("/", &[("cookie", &raw)]).await.status.as_u16(),
        401
    );
    let cookie = sign_in(&gw, token).await;
    let page = gw.admin_get("/", &[("cookie", &cookie)]).await;
    assert_eq!(page.status.as_u16(), 200);
    assert!(page.text().contains("id=\"top-body\""));
    let stale = gw
        .admin_get("/", &[("cookie", "tollgate_admin=0123456789abcdef")])
        .await;
    assert_eq!(stale.status.as_u16(), 401);
    assert!(!gw.output().contains(token), "the token is never logged");
}

/// A client that does not follow redirects, to see the login's own answer.
fn no_redirects() -> reqwest::Client {
    crate::common::http::client_builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// `POST /login` with `token` as the login form sends it: its `Set-Cookie` must be a session
/// (64 hex digits, `HttpOnly; SameSite=Strict; Path=/`, 12 hours); the `Cookie` to send.
async fn sign_in(gw: &Gateway, token: &str) -> String {
    let body = format!("token={}", token.replace(' ', "+"));
    let r = send(
        &no_redirects(),
        Method::POST,
        &format!("http://{}/login", gw.admin),
        &[("content-type", "application/x-www-form-urlencoded")],
        Some(body.into_bytes()),
    )
    .await;
    assert_eq!(r.status.as_u16(), 303, "{}", r.text());
    assert_eq!(r.header("location"), "/");
    let set = r.header("set-cookie");
    let id = set
        .strip_prefix("tollgate_admin=")
        .and_then(|v| v.split(';').next())
        .unwrap_or_else(|| panic!("not a session cookie: {set}"));
    assert_eq!(id.len(), 64, "{set}");
    assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{set}");
    assert!(!set.contains(token), "{set}");
    assert_eq!(
        set,
        format!("tollgate_admin={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age=43200")
    );
    format!("tollgate_admin={id}")
}

/// A login posts the token once and gets a random session id in an `HttpOnly` cookie, which
/// opens the pages (for `GET` only) and never reaches an upstream through the proxy port,
/// where the browser sends it too: the proxy cuts it out of `Cookie` and keeps the rest.
#[tokio::test(flavor = "multi_thread")]
async fn a_login_opens_a_session_whose_cookie_never_reaches_the_upstream() {
    let up = Upstream::start().await;
    let token = "admin token with spaces & symbols";
    let gw = Gateway::start_with_env(
        &crate::config(&up, "admin: { token_env: OBSERVE_ADMIN_TOKEN }\n"),
        &[("OBSERVE_ADMIN_TOKEN", token)],
    )
    .await;
    // A wrong token: the form again, 403, and no cookie.
    let wrong = send(
        &no_redirects(),
        Method::POST,
        &format!("http://{}/login", gw.admin),
        &[("content-type", "application/x-www-form-urlencoded")],
        Some(b"token=nope".to_vec()),
    )
    .await;
    assert_eq!(wrong.status.as_u16(), 403);
    assert!(wrong.opt_header("set-cookie").is_none());
    assert!(wrong.text().contains("That token is wrong."));
    let encoded = token.replace('&', "%26");
    let cookie = sign_in(&gw, &encoded).await;
    let other = sign_in(&gw, &encoded).await;
    assert_ne!(cookie, other, "every login gets its own session");
    for page in ["/", "/stats", "/top"] {
        let r = gw.admin_get(page, &[("cookie", &cookie)]).await;
        assert_eq!(r.status.as_u16(), 200, "{page}");
    }
    // Not for a change: the API takes the bearer token only.
    let c = client();
    let reload = send(
        &c,
        Method::POST,
        &format!("http://{}/admin/v1/reload", gw.admin),
        &[("cookie", &cookie)],
        None,
    )
    .await;
    assert_eq!(reload.status.as_u16(), 401, "{}", reload.text());

    // Through the proxy port: the session is cut out of Cookie, every other cookie kept.
    let url = gw.url("/echo");
    let mixed = format!("theme=dark; {cookie}; cart=3");
    let echo = get(&c, &url, &[("cookie", &mixed)]).await.json();
    assert_eq!(
        echo["headers"]["cookie"],
        serde_json::json!(["theme=dark; cart=3"]),
        "{echo}"
    );
    let echo = get(&c, &url, &[("cookie", &cookie)]).await.json();
    assert_eq!(echo["headers"]["cookie"], Value::Null, "{echo}");
    let echo = get(&c, &url, &[("cookie", "a=1"), ("cookie", &cookie)])
        .await
        .json();
    assert_eq!(
        echo["headers"]["cookie"],
        serde_json::json!(["a=1"]),
        "{echo}"
    );
    let id = cookie.trim_start_matches("tollgate_admin=");
    assert!(!gw.output().contains(id), "the session id is never logged");
    assert_eq!(up.requests().await, 3);
}

/// DNS rebinding: a page on an attacker's name that resolves to the admin listener sends that
/// name as `Host`; the listener answers 421 to any name but `localhost` and
/// `admin.allowed_hosts`, and to IP literals. The probes answer whatever the `Host`, and so does
/// a request without one. Every admin answer forbids framing and sniffing.
#[tokio::test(flavor = "multi_thread")]
async fn the_admin_listener_answers_only_its_own_host_names_and_is_never_framed() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&crate::config(
        &up,
        "admin: { allowed_hosts: [admin.internal, Gateway-1] }\n",
    ))
    .await;
    let port = gw.admin.port();
    let with_port = |h: &str| format!("{h}:{port}");
    for host in [
        with_port("127.0.0.1"),
        with_port("[::1]"),
        with_port("localhost"),
        "LOCALHOST".to_string(),
        with_port("admin.internal"),
        "admin.internal.".to_string(),
        with_port("gateway-1"),
    ] {
        for page in ["/", "/stats", "/top"] {
            let r = gw.admin_get(page, &[("host", &host)]).await;
            assert_eq!(r.status.as_u16(), 200, "{host} {page}: {}", r.text());
        }
    }
    for host in [
        with_port("rebind.attacker.example"),
        "attacker.example".to_string(),
        with_port("localhost.attacker.example"),
        with_port("admin.internal.attacker.example"),
    ] {
        for page in ["/", "/stats", "/top", "/admin/v1/config", "/nope"] {
            let r = gw.admin_get(page, &[("host", &host)]).await;
            assert_eq!(r.status.as_u16(), 421, "{host} {page}: {}", r.text());
            assert_eq!(r.header("content-type"), "application/problem+json");
            let detail = r.json()["detail"].as_str().unwrap().to_string();
            assert!(detail.contains("admin.allowed_hosts"), "{detail}");
        }
        for probe in ["/healthz", "/readyz", "/metrics"] {
            let r = gw.admin_get(probe, &[("host", &host)]).await;
            assert_eq!(r.status.as_u16(), 200, "{host} {probe}");
        }
    }
    // No Host at all (HTTP/1.0, as HAProxy's health checks): served.
    let mut conn = RawConn::connect(gw.admin).await;
    conn.send(b"GET /stats HTTP/1.0\r\n\r\n").await.unwrap();
    let r = conn.read_response().await.expect("an answer");
    assert_eq!(r.status, 200, "{r:?}");

    // Every admin answer: the page, JSON, the probes, a refusal.
    for (page, host) in [
        ("/", with_port("127.0.0.1")),
        ("/stats", with_port("localhost")),
        ("/metrics", with_port("localhost")),
        ("/stats", "attacker.example".to_string()),
    ] {
        let r = gw.admin_get(page, &[("host", &host)]).await;
        let csp = r.header("content-security-policy");
        assert!(csp.contains("frame-ancestors 'none'"), "{page}: {csp}");
        assert_eq!(r.header("x-frame-options"), "DENY", "{page}");
        assert_eq!(r.header("x-content-type-options"), "nosniff", "{page}");
    }
}

/// The image binds the admin listener to `0.0.0.0` so the balancer, Prometheus and the kubelet
/// reach it. Without an admin token, the gateway says so at start, `/healthz`, `/readyz` and
/// `/metrics` stay open, and every page that shows callers (and the admin API) is 403.
#[tokio::test(flavor = "multi_thread")]
async fn an_admin_listener_off_loopback_without_a_token_warns_and_opens_only_the_probes() {
    let up = Upstream::start().await;
    let gw = Gateway::start_admin_on_every_interface(&crate::config(&up, ""), &[]).await;
    let warning = "the admin listener is not on loopback and no admin token is set";
    let line = gw
        .output()
        .lines()
        .find(|l| l.contains(warning))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no start-up warning in:\n{}", gw.output()));
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("admin.token_env"), "{line}");
    for open in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(gw.admin_get(open, &[]).await.status.as_u16(), 200, "{open}");
    }
    for guarded in ["/stats", "/top", "/", "/admin/v1/quotas"] {
        let r = gw.admin_get(guarded, &[]).await;
        assert_eq!(r.status.as_u16(), 403, "{guarded}: {}", r.text());
        assert_eq!(
            r.header("content-type"),
            "application/problem+json",
            "{guarded}"
        );
        let body: Value = r.json();
        assert_eq!(body["status"], 403, "{guarded}");
    }

    // On loopback (the default) without a token: no warning, and the pages are served.
    let local = Gateway::start(&crate::config(&up, "")).await;
    assert!(!local.output().contains(warning), "{}", local.output());
    for page in ["/stats", "/top", "/"] {
        assert_eq!(
            local.admin_get(page, &[]).await.status.as_u16(),
            200,
            "{page}"
        );
    }
}
