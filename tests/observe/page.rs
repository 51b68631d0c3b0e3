//! The live page in headless Chromium: its panels fill with numbers from a gateway under
//! load, and a screenshot is neither blank nor an error.

use std::time::Duration;

use crate::common::browser::{dump_dom, screenshot};
use crate::common::http::client;
use crate::common::load::Load;
use crate::start;

/// The text of the element with `id` in `dom`, tags stripped and spaces collapsed. (The
/// page never nests an element in one of its own kind.)
fn text_of(dom: &str, id: &str) -> String {
    let at = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id} in the page:\n{dom}"));
    let open = dom[..at].rfind('<').expect("tag start");
    let tag: String = dom[open + 1..]
        .chars()
        .take_while(char::is_ascii_alphanumeric)
        .collect();
    let inner_start = at + dom[at..].find('>').expect("tag end") + 1;
    let inner_end = inner_start
        + dom[inner_start..]
            .find(&format!("</{tag}>"))
            .expect("closing tag");
    let mut out = String::new();
    let mut in_tag = false;
    for c in dom[inner_start..inner_end].chars() {
        match c {
            '<' => {
                in_tag = true;
                out.push(' ');
            }
            '>' => in_tag = false,
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn number(dom: &str, id: &str) -> f64 {
    let t = text_of(dom, id);
    let digits: String = t.split_whitespace().next().unwrap_or("").replace(',', "");
    digits
        .parse()
        .unwrap_or_else(|_| panic!("#{id} is not a number: {t:?}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_live_page_shows_decisions_callers_store_and_shedding_under_load() {
    let (_up, gw) = start("shedding: { max_in_flight: 1000 }\n").await;
    // Load in the background: 7 admitted, then denials, from one client IP.
    let driver = Load::new(&gw.url("/busy"))
        .conns(2)
        .pace(Duration::from_millis(20))
        .start();
    driver
        .wait("some denials", Duration::from_secs(20), |r| {
            r.iter().filter(|x| x.status() == 429).count() >= 5
        })
        .await;
    let page = format!("http://{}/", gw.admin);
    let html = client()
        .get(&page)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for external in ["src=\"http", "href=\"http", "url(http", "@import", "//cdn"] {
        assert!(
            !html.contains(external),
            "the page loads nothing from outside: {external}"
        );
    }

    let dom = tokio::task::spawn_blocking(move || dump_dom(&page, 4_000))
        .await
        .unwrap();
    assert!(
        dom.contains("data-state=\"ok\""),
        "the page shows an error:\n{dom}"
    );
    assert_eq!(text_of(&dom, "status"), "live");
    assert_eq!(number(&dom, "allow-total"), 7.0);
    assert!(number(&dom, "deny-total") >= 5.0);
    number(&dom, "allow-rate");
    number(&dom, "in-flight");
    assert_eq!(text_of(&dom, "backend"), "memory");
    let top = text_of(&dom, "top-body");
    assert!(
        top.contains("ip:127.0.0.1") && top.contains("per-ip"),
        "top callers: {top:?}"
    );
    let shed = text_of(&dom, "shed-body");
    assert!(shed.contains("get"), "shedding: {shed:?}");
    let limits = text_of(&dom, "limits-body");
    assert!(limits.contains("per-ip"), "limits: {limits:?}");
    drop(driver);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_screenshot_of_the_live_page_is_neither_blank_nor_an_error() {
    let (_up, gw) = start("").await;
    Load::new(&gw.url("/shot")).run(10).await;
    let dir = tempfile::tempdir().unwrap();
    let (page, blank) = (dir.path().join("page.png"), dir.path().join("blank.png"));
    let url = format!("http://{}/", gw.admin);
    let (p, b) = (page.clone(), blank.clone());
    let (page_size, blank_size) = tokio::task::spawn_blocking(move || {
        let page_size = screenshot(&url, 3_000, &p);
        // The same browser on an empty page, for scale.
        let blank_size = screenshot("data:text/html,<html><body></body></html>", 500, &b);
        (page_size, blank_size)
    })
    .await
    .unwrap();
    assert!(
        page_size > 10 * blank_size && page_size > 20_000,
        "the page's screenshot ({page_size} bytes) looks blank next to an empty page's ({blank_size} bytes)"
    );
    // And what was shot is the working page, not its error banner.
    let url = format!("http://{}/", gw.admin);
    let dom = tokio::task::spawn_blocking(move || dump_dom(&url, 3_000))
        .await
        .unwrap();
    assert!(dom.contains("data-state=\"ok\""), "{dom}");
    assert_eq!(number(&dom, "allow-total"), 7.0);
}

/// A page on another port of the same host (so the same site, as cookies see it) that posts
/// `token` to the admin listener's login form at once, as a person submitting the form would.
async fn serve_login_poster(admin: std::net::SocketAddr, token: &str) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let html = format!(
        "<!doctype html><html><body><form method=\"post\" action=\"http://{admin}/login\">\
         <input name=\"token\" value=\"{token}\"></form>\
         <script>document.forms[0].submit()</script></body></html>"
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        // Bounded: the browser asks for the page and perhaps a favicon.
        for _ in 0..8 {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            let resp = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{html}",
                html.len()
            );
            let _ = s.write_all(resp.as_bytes()).await;
        }
    });
    addr
}

/// With an admin token, a browser signs in through the login form's POST: the answer's
/// session cookie (HttpOnly, so no script ever holds it) brings it back to the live page,
/// whose own requests to `/stats` and `/top` then carry the session and fill the panels.
#[tokio::test(flavor = "multi_thread")]
async fn a_browser_signs_in_with_the_login_form_and_the_live_page_fills() {
    let token = "browser-login-token-5150";
    let up = crate::common::upstream::Upstream::start().await;
    let gw = crate::common::gateway::Gateway::start_with_env(
        &crate::config(&up, "admin: { token_env: OBSERVE_PAGE_TOKEN }\n"),
        &[("OBSERVE_PAGE_TOKEN", token)],
    )
    .await;
    Load::new(&gw.url("/signed-in")).run(9).await;
    // Without signing in, the browser gets the login form.
    let page = format!("http://{}/", gw.admin);
    let dom = tokio::task::spawn_blocking(move || dump_dom(&page, 2_000))
        .await
        .unwrap();
    assert!(
        dom.contains("id=\"token\"") && !dom.contains("id=\"top-body\""),
        "{dom}"
    );
    let poster = serve_login_poster(gw.admin, token).await;
    let dom = tokio::task::spawn_blocking(move || dump_dom(&format!("http://{poster}/"), 4_000))
        .await
        .unwrap();
    assert!(
        dom.contains("data-state=\"ok\""),
        "the page after the login:\n{dom}"
    );
    assert_eq!(number(&dom, "allow-total"), 7.0);
    assert_eq!(number(&dom, "deny-total"), 2.0);
    let top = text_of(&dom, "top-body");
    assert!(top.contains("ip:127.0.0.1"), "top callers: {top:?}");
}
