//! What every output shows in place of a secret, in one place: the access log and Pingora's
//! own error lines (through the proxy's `request_summary`), config errors (`tollgate check`,
//! the reload answer, the log), `/readyz`, `/admin/v1/config` and the log lines naming a
//! database.
//!
//! - [`url`]: a URL with the password of its userinfo and the value of every credential-looking
//!   query parameter ([`is_credential`]) replaced by [`HIDDEN`]. A URL that does not parse is
//!   never shown, not even in part: only why it does not parse.
//! - [`urls_in`]: every URL inside a message (a config error quoting a value) as [`url`]
//!   shows it.
//! - [`scrub`]: client-chosen text (a path, a user agent) with the caller's API key and bearer
//!   token replaced by what stands for them, and anything shaped like a JWT by `[jwt]`.
//!
//! Pure: imports nothing of the crate, so [`crate::config`] can use it too.
//!
//! Phase: [`scrub`] at the end of a request (its access-log line) and when Pingora logs a
//! failed request; [`url`] at startup, on reload and on admin requests.

use std::borrow::Cow;

/// What stands for a hidden password or credential value.
pub const HIDDEN: &str = "***";

/// A query parameter whose name holds one of these (ASCII case ignored) is a credential:
/// `password`, `sslpassword`, `passwd`, `pwd`, `secret`, `token`, `api_key`, `sslkey`, `auth`,
/// `authSource`... Hiding a harmless one costs nothing.
const CREDENTIAL_WORDS: &[&str] = &[
    "pass",
    "pwd",
    "secret",
    "token",
    "key",
    "auth",
    "cred",
    "signature",
    "session",
];

/// Secrets shorter than this are not searched for by [`scrub`] (they would match ordinary
/// text).
const MIN_SECRET: usize = 6;

/// Why a URL is not shown.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("it does not parse as a URL ({0}); it is not shown, as it may hold a password")]
pub struct UnparsedUrl(url::ParseError);

/// `text` as a URL with its secrets replaced by [`HIDDEN`]: the userinfo's password and every
/// credential-looking query value (`redis://:***@host:6379/0`,
/// `postgres://app@db/q?sslmode=require&password=***`). A password holding `@` is hidden
/// whole (the last `@` ends the userinfo). A URL without `//` whose rest holds `@`
/// (`user:secret@host`) shows its scheme alone. A URL with nothing to hide is shown as
/// written.
pub fn url(text: &str) -> Result<String, UnparsedUrl> {
    let mut u = url::Url::parse(text).map_err(UnparsedUrl)?;
    if u.cannot_be_a_base() && u.path().contains('@') {
        // `user:secret@host` without `//` parses as a scheme and an opaque path.
        return Ok(format!("{}:{HIDDEN}", u.scheme()));
    }
    let mut hid = u.password().is_some();
    if hid && u.set_password(Some(HIDDEN)).is_err() {
        return Ok(format!("{}://{HIDDEN}", u.scheme()));
    }
    if let Some(q) = u.query() {
        let pairs: Vec<Cow<'_, str>> = q
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((k, v)) if !v.is_empty() && is_credential(k) => {
                    Cow::Owned(format!("{k}={HIDDEN}"))
                }
                _ => Cow::Borrowed(pair),
            })
            .collect();
        if pairs.iter().any(|p| matches!(p, Cow::Owned(_))) {
            hid = true;
            let q = pairs.join("&");
            u.set_query(Some(&q));
        }
    }
    // Nothing hidden: the text as written, not as the parser would write it.
    Ok(if hid { u.into() } else { text.to_string() })
}

/// [`url`], or a sentence saying the URL is not shown: for outputs that show a URL already
/// validated (and so never unparsed there).
pub fn url_shown(text: &str) -> String {
    url(text).unwrap_or_else(|e| format!("<not shown: {e}>"))
}

/// `text` (an error message) with every URL in it (`scheme://` up to a space or a quote)
/// shown as [`url_shown`] shows it: a config error that quotes a value, such as serde's
/// `invalid type: string "redis://:secret@host"`, never shows a password.
pub fn urls_in(text: &str) -> Cow<'_, str> {
    if !text.contains("://") {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let start = rest[..at]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
            .map_or(0, |i| i + 1);
        let end = rest[at..]
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '`'))
            .map_or(rest.len(), |i| at + i);
        out.push_str(&rest[..start]);
        out.push_str(&url_shown(&rest[start..end]));
        rest = &rest[end..];
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// Whether a query parameter named `name` (percent-encoded as in the URL) holds a credential.
pub fn is_credential(name: &str) -> bool {
    let name = percent_encoding::percent_decode_str(name)
        .decode_utf8_lossy()
        .to_ascii_lowercase();
    CREDENTIAL_WORDS.iter().any(|w| name.contains(w))
}

/// `v` with every copy of a secret replaced by what stands for it (the API key by its
/// fingerprint, a bearer token by `[token]`), and anything shaped like a JWT (`eyJ…` with two
/// dots) by `[jwt]`. Borrowed when there is nothing to replace.
pub fn scrub<'v>(v: &'v str, secrets: &[(&str, &str)]) -> Cow<'v, str> {
    let mut out = Cow::Borrowed(v);
    for (secret, replacement) in secrets.iter().filter(|(s, _)| s.len() >= MIN_SECRET) {
        if out.contains(secret) {
            out = Cow::Owned(out.replace(secret, replacement));
        }
    }
    while let Some((start, end)) = find_jwt(&out) {
        out.to_mut().replace_range(start..end, "[jwt]");
    }
    out
}

/// The byte range of the first JWT-shaped run: `eyJ` followed by base64url characters with
/// two dots or more inside.
fn find_jwt(s: &str) -> Option<(usize, usize)> {
    let is_b64 = |c: u8| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'.';
    let b = s.as_bytes();
    let mut from = 0;
    // A byte scan: most strings here are short, and `str::find` prepares a searcher first.
    let start = |from: usize| {
        b[from..]
            .windows(3)
            .position(|w| w == b"eyJ")
            .map(|i| i + from)
    };
    while let Some(i) = start(from) {
        let end = b[i..]
            .iter()
            .position(|&c| !is_b64(c))
            .map_or(b.len(), |n| i + n);
        if b[i..end].iter().filter(|&&c| c == b'.').count() >= 2 {
            return Some((i, end));
        }
        from = i + 3;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_and_credential_values_are_hidden() {
        for (given, shown) in [
            (
                "postgres://app:s3cret@db:5432/quotas",
                "postgres://app:***@db:5432/quotas",
            ),
            ("postgres://app@db/quotas", "postgres://app@db/quotas"),
            ("sqlite:///var/lib/q.db", "sqlite:///var/lib/q.db"),
            ("sqlite::memory:", "sqlite::memory:"),
            ("app:s3cret@db:5432", "app:***"),
            ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
            // The last `@` ends the userinfo: a password holding `@` is hidden whole.
            (
                "redis://:pa@ss@word@10.0.0.1:6379/0",
                "redis://:***@10.0.0.1:6379/0",
            ),
            (
                "rediss://u:p@h:6380/1#insecure",
                "rediss://u:***@h:6380/1#insecure",
            ),
            (
                "postgres://app@db/q?sslmode=require&password=s3cret&PassWord=x&sslpassword=y",
                "postgres://app@db/q?sslmode=require&password=***&PassWord=***&sslpassword=***",
            ),
            (
                "postgres://db/q?user=app&pa%73sword=s3cret&api_key=k&token=t&auth=a&empty=",
                "postgres://db/q?user=app&pa%73sword=***&api_key=***&token=***&auth=***&empty=",
            ),
        ] {
            assert_eq!(url(given).as_deref(), Ok(shown), "{given}");
        }
    }

    #[test]
    fn a_url_that_does_not_parse_is_never_shown() {
        for bad in [
            "redis://:s3cret@10.0.0.1:notaport/0",
            "no scheme s3cret",
            "postgres://app:s3cret@/db",
        ] {
            let e = url(bad).unwrap_err().to_string();
            assert!(!e.contains("s3cret"), "{e}");
            assert!(e.starts_with("it does not parse as a URL ("), "{e}");
            assert!(!url_shown(bad).contains("s3cret"));
        }
        assert_eq!(
            url("redis://:s3cret@10.0.0.1:notaport/0")
                .unwrap_err()
                .to_string(),
            "it does not parse as a URL (invalid port number); it is not shown, as it may hold a password"
        );
    }

    #[test]
    fn urls_inside_a_message_are_shown_redacted() {
        assert_eq!(
            urls_in("quotas: invalid type: string \"postgres://a:s3cret@db/q?password=s3cret\", expected struct Quotas"),
            "quotas: invalid type: string \"postgres://a:***@db/q?password=***\", expected struct Quotas"
        );
        assert_eq!(
            urls_in("x: \"redis://:s3cret@h:port/0\" and redis://h:1/0, sqlite://PATH)"),
            "x: \"<not shown: it does not parse as a URL (invalid port number); it is not shown, as it may hold a password>\" and redis://h:1/0, sqlite://PATH)"
        );
        assert!(matches!(urls_in("no url: 5"), Cow::Borrowed("no url: 5")));
    }

    #[test]
    fn secrets_and_jwts_are_scrubbed() {
        let jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhIn0.c2ln";
        assert_eq!(scrub(&format!("agent {jwt} x"), &[]), "agent [jwt] x");
        let key = [("sk_live_123", "fp:1")];
        assert_eq!(scrub("curl key=sk_live_123", &key), "curl key=fp:1");
        assert!(matches!(scrub("eyJ only", &key), Cow::Borrowed("eyJ only")));
    }
}
