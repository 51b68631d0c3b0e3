//! The live page at `GET /` of the admin listener: one self-contained HTML file (no external
//! scripts, fonts or stylesheets) that polls `/stats` and `/top` every second. With an admin
//! token configured, a browser without a session gets a small login form instead, which posts
//! the token to `POST /login`; the answer sets the session cookie (see [`super::auth`]), which
//! no script can read.
//!
//! Phase: the admin listener.

use http::Response;

/// The live page.
pub const PAGE: &str = include_str!("page.html");

/// The login form: a plain form post, so the token never passes through a script.
const LOGIN: &str = r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>tollgate admin: sign in</title>
<style>body{font:15px system-ui,sans-serif;background:#10151c;color:#e6edf3;display:flex;justify-content:center;margin-top:15vh}
form{background:#18202a;padding:2em;border-radius:8px}input{font:inherit;padding:.4em;margin:.5em 0;width:22em}
button{font:inherit;padding:.4em 1.2em}.msg{color:#f0883e}</style></head>
<body><form id="login" method="post" action="/login"><h2>tollgate admin</h2><p class="msg">MESSAGE</p>
<label>Admin token<br><input id="token" name="token" type="password" autocomplete="current-password" autofocus></label><br>
<button type="submit">Open</button></form>
</body></html>
"#;

fn html(status: u16, body: String) -> Response<Vec<u8>> {
    super::response(status, "text/html; charset=utf-8", body.into_bytes())
}

/// `GET /` with the right token or a session (or none configured).
pub fn live() -> Response<Vec<u8>> {
    html(200, PAGE.to_string())
}

/// `GET /` without the token or a session (401), or a login with a wrong token (403).
pub fn login(status: u16) -> Response<Vec<u8>> {
    let msg = if status == 401 {
        "This page needs the admin token (the environment variable named by admin.token_env)."
    } else {
        "That token is wrong."
    };
    html(status, LOGIN.replace("MESSAGE", msg))
}

/// A successful login: the session cookie, and back to the page.
pub fn signed_in(cookie: &str) -> Response<Vec<u8>> {
    let mut r = super::response(303, "text/plain; charset=utf-8", b"signed in\n".to_vec());
    let h = r.headers_mut();
    h.insert(http::header::LOCATION, http::HeaderValue::from_static("/"));
    if let Ok(v) = http::HeaderValue::from_str(cookie) {
        h.insert(http::header::SET_COOKIE, v);
    }
    r
}
