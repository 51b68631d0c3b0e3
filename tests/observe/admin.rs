//! The admin listener: its endpoints never answer on the proxy port, and the admin token
//! guards `/`, `/stats` and `/top` while `/healthz`, `/readyz` and `/metrics` stay open.

use serde_json::Value;

use crate::common::gateway::Gateway;
use crate::common::http::{client, get};
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
    // The live page: a login form without the token, the page with its session cookie.
    let login = gw.admin_get("/", &[]).await;
    assert_eq!(login.status.as_u16(), 401);
    assert!(login.text().contains("id=\"token\"") && !login.text().contains("id=\"top-body\""));
    let cookie = format!("tollgate_admin={}", token.replace('-', "%2D"));
    let page = gw.admin_get("/", &[("cookie", &cookie)]).await;
    assert_eq!(page.status.as_u16(), 200);
    assert!(page.text().contains("id=\"top-body\""));
    let wrong = gw
        .admin_get("/", &[("cookie", "tollgate_admin=nope")])
        .await;
    assert_eq!(wrong.status.as_u16(), 403);
    assert!(!gw.output().contains(token), "the token is never logged");
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
