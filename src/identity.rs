//! Who is calling: API key, JWT-named user and tier, and the client IP.
//!
//! A JWT is verified (HS256 signature, then [`check_times`]: `exp` and `nbf` must be numbers
//! and `exp` is required unless `identity.jwt.require_exp: false`; `aud` and `iss` when
//! configured), and a token whose header names a `crit` extension is refused: none is
//! implemented. A token that fails any check is refused with 401, as an invalid one always was;
//! the caller never falls back to being anonymous or counted by IP.
//!
//! Phase: first step of `request_filter`. Reads request headers and the peer address only.
//! `X-Forwarded-For` is believed only when the peer is a trusted proxy, and then only as far
//! as the chain of trusted proxies goes: the client is the rightmost address that is not one.

use std::net::{IpAddr, SocketAddr};

use http::HeaderMap;
use ipnet::IpNet;

use crate::config::{Config, JwtSettings, RateSpec, TierId};
use crate::fingerprint::KeyHash;
use crate::quota::table::Resolved;
use crate::quota::{Lookup, Quotas};
use std::sync::Arc;

/// The longest API key accepted, in bytes.
pub const MAX_API_KEY_LEN: usize = 256;

/// The caller of one request. The API key is borrowed from the request's headers.
#[derive(Debug, Clone)]
pub struct Caller<'a> {
    pub api_key: Option<&'a str>,
    /// BLAKE3 of the API key: what counter keys and the quota store use.
    pub key_hash: Option<KeyHash>,
    /// From a verified JWT.
    pub user: Option<String>,
    pub tier: Option<TierId>,
    pub client_ip: IpAddr,
    /// The key's override from the quota store, when one is in force.
    pub overrides: Option<Arc<Resolved>>,
}

impl Caller<'_> {
    /// Apply the key's override from the quota store: its tier, and its new limit parameters
    /// (the rate checks read them).
    pub fn apply_override(&mut self, o: Arc<Resolved>) {
        if o.tier.is_some() {
            self.tier = o.tier;
        }
        self.overrides = Some(o);
    }

    /// The parameters of rate limit `id` for this caller: its override's, or the config's.
    pub fn rate_spec<'c>(&'c self, cfg: &'c Config, id: crate::config::LimitId) -> &'c RateSpec {
        match self.override_spec(id) {
            Some(s) => s,
            None => cfg.limit(id).rate(),
        }
    }

    /// The override's parameters of rate limit `id`, if it has any.
    pub fn override_spec(&self, id: crate::config::LimitId) -> Option<&Arc<RateSpec>> {
        self.overrides.as_deref().and_then(|o| o.rate(id))
    }

    /// Neither an API key nor a verified user.
    pub fn is_anonymous(&self) -> bool {
        self.key_hash.is_none() && self.user.is_none()
    }
}

/// A request whose credentials cannot be used. Becomes 400 or 401 at the edge.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error("the {header} header must be sent once, with 1 to {MAX_API_KEY_LEN} visible ASCII characters")]
    InvalidApiKey { header: String },
    #[error("the bearer token is invalid: {0}")]
    InvalidToken(String),
    /// The quota store disabled this key.
    #[error("this API key is revoked")]
    Revoked,
    /// `identity.require_known_keys`: neither in `api_keys` nor in the quota store.
    #[error("this API key is not known")]
    UnknownKey,
}

/// Identify the caller from the request headers and the TCP peer.
pub fn identify<'h>(
    cfg: &Config,
    headers: &'h HeaderMap,
    peer: IpAddr,
) -> Result<Caller<'h>, IdentityError> {
    let id = &cfg.identity;
    let api_key = single_header(headers, &id.api_key_header)
        .map(|v| match v {
            Some(v)
                if !v.is_empty()
                    && v.len() <= MAX_API_KEY_LEN
                    && v.iter().all(|b| b.is_ascii_graphic()) =>
            {
                // Visible ASCII is valid UTF-8.
                std::str::from_utf8(v).map_err(|_| ())
            }
            _ => Err(()),
        })
        .transpose()
        .map_err(|()| IdentityError::InvalidApiKey {
            header: id.api_key_header.to_string(),
        })?;

    let (user, mut tier) = match &id.jwt {
        Some(jwt) => match headers.get(&jwt.header) {
            Some(value) => verify_jwt(cfg, jwt, value)?,
            None => (None, None),
        },
        None => (None, None),
    };
    if tier.is_none() {
        tier = api_key.and_then(|k| cfg.api_keys.get(k).copied());
    }
    if tier.is_none() && (api_key.is_some() || user.is_some()) {
        tier = cfg.default_tier;
    }
    Ok(Caller {
        api_key,
        key_hash: api_key.map(KeyHash::of),
        user,
        tier,
        client_ip: client_ip(peer, headers, &id.trusted_proxies),
        overrides: None,
    })
}

/// The end of step 1: the API key's override from the quota store, if one is in force at
/// `now()` (Unix seconds), applied to the caller. `Err` when the store revoked the key, or when
/// `identity.require_known_keys` is set and the key is neither in `api_keys` nor in the store.
/// The clock is read only when there is a key to look up in a quota store.
pub fn apply_quotas(
    cfg: &Arc<Config>,
    quotas: Option<&Quotas>,
    caller: &mut Caller<'_>,
    now: impl FnOnce() -> i64,
) -> Result<(), IdentityError> {
    let (Some(key), Some(hash)) = (caller.api_key, caller.key_hash) else {
        return Ok(());
    };
    if let Some(Lookup::Some(o)) = quotas.map(|q| q.lookup_hash(cfg, hash, now())) {
        if o.disabled {
            return Err(IdentityError::Revoked);
        }
        caller.apply_override(o);
        return Ok(());
    }
    if cfg.identity.require_known_keys && !cfg.api_keys.contains_key(key) {
        return Err(IdentityError::UnknownKey);
    }
    Ok(())
}

/// The user and tier named by a JWT, verified with the settings built at config load.
fn verify_jwt(
    cfg: &Config,
    jwt: &JwtSettings,
    value: &http::HeaderValue,
) -> Result<(Option<String>, Option<TierId>), IdentityError> {
    let token = value
        .to_str()
        .map_err(|_| IdentityError::InvalidToken("not ASCII".into()))?;
    let token = strip_bearer(token);
    refuse_crit(token).map_err(|e| IdentityError::InvalidToken(e.into()))?;
    let data = jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(
        token,
        &jwt.key,
        &jwt.validation,
    )
    .map_err(|e| IdentityError::InvalidToken(e.to_string()))?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    check_times(
        &data.claims,
        now,
        jwt.validation.leeway as f64,
        jwt.require_exp,
    )
    .map_err(IdentityError::InvalidToken)?;
    let Some(user) = data.claims.get(&jwt.user_claim).and_then(claim_string) else {
        return Err(IdentityError::InvalidToken(format!(
            "claim {:?} is missing",
            jwt.user_claim
        )));
    };
    let tier = data
        .claims
        .get(&jwt.tier_claim)
        .and_then(|t| t.as_str())
        .and_then(|t| cfg.tiers.iter().position(|x| x.name == t));
    Ok((Some(user), tier))
}

/// A header that names critical extensions (`crit`, RFC 7515 §4.1.11) is refused: tollgate
/// implements none, and a recipient must refuse what it does not understand.
fn refuse_crit(token: &str) -> Result<(), &'static str> {
    use base64::Engine as _;
    let header = token.split('.').next().unwrap_or("");
    let Ok(bytes) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(header) else {
        return Err("the header is not base64url");
    };
    match serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&bytes) {
        Err(_) => Err("the header is not a JSON object"),
        Ok(h) if h.contains_key("crit") => {
            Err("the header names critical extensions (crit), and none is supported")
        }
        Ok(_) => Ok(()),
    }
}

/// `exp` and `nbf` against `now` (Unix seconds) with `leeway`: each, when present, must be a
/// number (RFC 7519's NumericDate; a string is refused, not ignored), and `exp` must be present
/// when `require_exp`.
fn check_times(
    claims: &serde_json::Map<String, serde_json::Value>,
    now: f64,
    leeway: f64,
    require_exp: bool,
) -> Result<(), String> {
    let time = |name: &str| match claims.get(name) {
        None => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| format!("claim {name:?} is not a number")),
    };
    match time("exp")? {
        None if require_exp => return Err("claim \"exp\" is missing".into()),
        Some(exp) if exp < now - leeway => return Err("the token has expired".into()),
        _ => {}
    }
    match time("nbf")? {
        Some(nbf) if nbf > now + leeway => Err("the token is not valid yet (nbf)".into()),
        _ => Ok(()),
    }
}

/// `None` when absent, `Some(Some(bytes))` when sent once, `Some(None)` when sent twice.
fn single_header<'a>(headers: &'a HeaderMap, name: &http::HeaderName) -> Option<Option<&'a [u8]>> {
    let mut it = headers.get_all(name).iter();
    let first = it.next()?;
    if it.next().is_some() {
        return Some(None);
    }
    Some(Some(first.as_bytes()))
}

fn strip_bearer(v: &str) -> &str {
    let v = v.trim();
    match v.split_once(' ') {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("bearer") => rest.trim(),
        _ => v,
    }
}

fn claim_string(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) if !s.is_empty() => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`) are the IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

fn parse_hop(s: &str) -> Option<IpAddr> {
    let s = s.trim();
    s.parse::<IpAddr>()
        .ok()
        .or_else(|| s.parse::<SocketAddr>().ok().map(|a| a.ip()))
        .map(canonical)
}

/// The client address: the peer, unless the peer is a trusted proxy, in which case walk
/// `X-Forwarded-For` from the right past trusted proxies. An unparseable hop ends the walk
/// at the last address that was trustworthy.
pub fn client_ip(peer: IpAddr, headers: &HeaderMap, trusted: &[IpNet]) -> IpAddr {
    let peer = canonical(peer);
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|n| n.contains(ip));
    if !is_trusted(&peer) {
        return peer;
    }
    let mut client = peer;
    let lines = headers
        .get_all("x-forwarded-for")
        .iter()
        .rev()
        .filter_map(|v| v.to_str().ok());
    for hop in lines.flat_map(|l| l.rsplit(',')) {
        if hop.trim().is_empty() {
            continue;
        }
        let Some(ip) = parse_hop(hop) else {
            return client;
        };
        client = ip;
        if !is_trusted(&ip) {
            return ip;
        }
    }
    client
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(xff: &[&str]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for v in xff {
            m.append("x-forwarded-for", v.parse().unwrap());
        }
        m
    }

    fn nets(s: &[&str]) -> Vec<IpNet> {
        s.iter().map(|n| n.parse().unwrap()).collect()
    }

    #[test]
    fn untrusted_peer_ignores_forwarded_for() {
        let ip = client_ip(
            "203.0.113.9".parse().unwrap(),
            &h(&["1.2.3.4"]),
            &nets(&["127.0.0.1/32"]),
        );
        assert_eq!(ip.to_string(), "203.0.113.9");
    }

    #[test]
    fn trusted_chain_takes_rightmost_untrusted() {
        let t = nets(&["127.0.0.1/32", "10.0.0.0/8"]);
        let ip = client_ip(
            "127.0.0.1".parse().unwrap(),
            &h(&["6.6.6.6, 1.2.3.4, 10.1.1.1"]),
            &t,
        );
        assert_eq!(ip.to_string(), "1.2.3.4");
        // Several header lines are one list.
        let ip = client_ip(
            "127.0.0.1".parse().unwrap(),
            &h(&["6.6.6.6", "1.2.3.4", "10.1.1.1"]),
            &t,
        );
        assert_eq!(ip.to_string(), "1.2.3.4");
    }

    #[test]
    fn garbage_hop_stops_at_last_trusted() {
        let t = nets(&["127.0.0.1/32", "10.0.0.0/8"]);
        let ip = client_ip(
            "127.0.0.1".parse().unwrap(),
            &h(&["1.2.3.4, nonsense, 10.1.1.1"]),
            &t,
        );
        assert_eq!(ip.to_string(), "10.1.1.1");
        let ip = client_ip("127.0.0.1".parse().unwrap(), &h(&[]), &t);
        assert_eq!(ip.to_string(), "127.0.0.1");
    }

    #[test]
    fn mapped_ipv6_and_ports() {
        let t = nets(&["127.0.0.1/32"]);
        let ip = client_ip(
            "::ffff:127.0.0.1".parse().unwrap(),
            &h(&["[2001:db8::1]:443"]),
            &t,
        );
        assert_eq!(ip.to_string(), "2001:db8::1");
        let ip = client_ip("127.0.0.1".parse().unwrap(), &h(&["9.9.9.9:1234"]), &t);
        assert_eq!(ip.to_string(), "9.9.9.9");
    }

    /// A config whose JWT secret is the value of `PATH` (set wherever tests run, and never
    /// changed by one), with `jwt` added to the `identity.jwt` mapping.
    fn jwt_config(jwt: &str) -> Config {
        let yaml = format!(
            "upstreams: {{ backend: [\"127.0.0.1:9000\"] }}\n\
             routes: [ {{ name: default, match: {{ path_prefix: / }}, upstream: backend }} ]\n\
             identity: {{ jwt: {{ hs256_secret_env: PATH{jwt} }} }}\n"
        );
        crate::config::from_yaml("gateway.yaml", &yaml, &Default::default()).expect("valid")
    }

    /// Sign `header` and `claims` (JSON texts) with the secret of [`jwt_config`].
    fn token(header: &str, claims: &serde_json::Value) -> String {
        use base64::Engine as _;
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        let msg = format!(
            "{}.{}",
            b64(header.as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let secret = std::env::var("PATH").expect("PATH");
        let key = jsonwebtoken::EncodingKey::from_secret(secret.as_bytes());
        let sig = jsonwebtoken::crypto::sign(msg.as_bytes(), &key, jsonwebtoken::Algorithm::HS256)
            .expect("sign");
        format!("{msg}.{sig}")
    }

    const HS256: &str = r#"{"alg":"HS256","typ":"JWT"}"#;

    /// The user a token names, or why it is refused.
    fn verify(cfg: &Config, header: &str, claims: serde_json::Value) -> Result<String, String> {
        let mut h = HeaderMap::new();
        let bearer = format!("Bearer {}", token(header, &claims));
        h.insert("authorization", bearer.parse().unwrap());
        match identify(cfg, &h, "127.0.0.1".parse().unwrap()) {
            Ok(c) => Ok(c.user.expect("a user")),
            Err(IdentityError::InvalidToken(why)) => Err(why),
            Err(e) => panic!("not a token error: {e}"),
        }
    }

    fn now() -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    }

    #[test]
    fn exp_and_nbf_must_be_numbers_and_exp_is_required_by_default() {
        let cfg = jwt_config("");
        let (past, future) = (now() - 60, now() + 3600);
        let ok = |c| verify(&cfg, HS256, c);
        assert_eq!(
            ok(serde_json::json!({"sub": "a", "exp": future})),
            Ok("a".into())
        );
        // A fractional NumericDate is a number like any other.
        assert_eq!(
            ok(serde_json::json!({"sub": "a", "exp": future as f64 + 0.5})),
            Ok("a".into())
        );
        for (claims, why) in [
            (
                serde_json::json!({"sub": "a", "exp": past}),
                "the token has expired",
            ),
            (
                serde_json::json!({"sub": "a", "exp": past as f64 + 0.5}),
                "the token has expired",
            ),
            (
                serde_json::json!({"sub": "a", "exp": -1}),
                "the token has expired",
            ),
            (
                serde_json::json!({"sub": "a", "exp": future.to_string()}),
                "claim \"exp\" is not a number",
            ),
            (
                serde_json::json!({"sub": "a", "exp": null}),
                "claim \"exp\" is not a number",
            ),
            (serde_json::json!({"sub": "a"}), "claim \"exp\" is missing"),
            (
                serde_json::json!({"sub": "a", "exp": future, "nbf": "0"}),
                "claim \"nbf\" is not a number",
            ),
            (
                serde_json::json!({"sub": "a", "exp": future, "nbf": future}),
                "the token is not valid yet (nbf)",
            ),
        ] {
            assert_eq!(ok(claims.clone()), Err(why.to_string()), "{claims}");
        }
        // `require_exp: false`: a token without `exp` lives until it is revoked elsewhere, but
        // an `exp` it has is still checked.
        let lax = jwt_config(", require_exp: false");
        assert_eq!(
            verify(&lax, HS256, serde_json::json!({"sub": "b"})),
            Ok("b".into())
        );
        assert_eq!(
            verify(&lax, HS256, serde_json::json!({"sub": "b", "exp": "soon"})),
            Err("claim \"exp\" is not a number".into())
        );
    }

    #[test]
    fn a_crit_header_is_refused_whatever_it_names() {
        let cfg = jwt_config("");
        let claims = serde_json::json!({"sub": "a", "exp": now() + 60});
        assert_eq!(verify(&cfg, HS256, claims.clone()), Ok("a".into()));
        for header in [
            r#"{"alg":"HS256","typ":"JWT","crit":["exp"]}"#,
            r#"{"alg":"HS256","crit":["http://example.com/ext"],"http://example.com/ext":true}"#,
            r#"{"alg":"HS256","crit":[]}"#,
            r#"{"alg":"HS256","crit":null}"#,
        ] {
            assert_eq!(
                verify(&cfg, header, claims.clone()),
                Err("the header names critical extensions (crit), and none is supported".into()),
                "{header}"
            );
        }
    }

    #[test]
    fn aud_is_checked_only_when_an_audience_is_configured() {
        let exp = now() + 60;
        let any = jwt_config("");
        let with_aud = serde_json::json!({"sub": "a", "exp": exp, "aud": "billing"});
        assert_eq!(verify(&any, HS256, with_aud.clone()), Ok("a".into()));
        let cfg = jwt_config(", audience: [orders, shipping]");
        for aud in [
            serde_json::json!("orders"),
            serde_json::json!(["x", "shipping"]),
        ] {
            let claims = serde_json::json!({"sub": "a", "exp": exp, "aud": aud});
            assert_eq!(verify(&cfg, HS256, claims), Ok("a".into()), "{aud}");
        }
        assert_eq!(verify(&cfg, HS256, with_aud), Err("InvalidAudience".into()));
        assert_eq!(
            verify(&cfg, HS256, serde_json::json!({"sub": "a", "exp": exp})),
            Err("Missing required claim: aud".into())
        );
        let one = jwt_config(", audience: orders");
        let claims = serde_json::json!({"sub": "a", "exp": exp, "aud": "orders"});
        assert_eq!(verify(&one, HS256, claims), Ok("a".into()));
    }

    #[test]
    fn iss_is_checked_when_an_issuer_is_configured() {
        let exp = now() + 60;
        let cfg = jwt_config(", issuer: \"https://idp.example.com/\"");
        let iss = |i: serde_json::Value| serde_json::json!({"sub": "a", "exp": exp, "iss": i});
        assert_eq!(
            verify(&cfg, HS256, iss("https://idp.example.com/".into())),
            Ok("a".into())
        );
        assert_eq!(
            verify(&cfg, HS256, iss("https://evil.example.com/".into())),
            Err("InvalidIssuer".into())
        );
        assert_eq!(
            verify(&cfg, HS256, serde_json::json!({"sub": "a", "exp": exp})),
            Err("Missing required claim: iss".into())
        );
        assert_eq!(
            verify(&cfg, HS256, iss(7.into())),
            Err("Missing required claim: iss".into())
        );
    }

    /// The fleet's balancer (127.0.0.2) in front of a client on 127.0.0.1 that claims to be
    /// 198.51.100.7: trusting only the balancer's address, the client is the balancer's
    /// own entry whether the balancer overwrote the header (`docker/haproxy.cfg`) or appended
    /// to the client's; trusting the client's address too (a whole range), an appended
    /// header hands the choice to the client.
    #[test]
    fn only_the_balancers_own_entry_counts_when_only_the_balancer_is_trusted() {
        let lb: IpAddr = "127.0.0.2".parse().unwrap();
        let narrow = nets(&["127.0.0.2/32"]);
        let overwritten = h(&["127.0.0.1"]);
        let appended = h(&["198.51.100.7, 127.0.0.1"]);
        assert_eq!(
            client_ip(lb, &overwritten, &narrow).to_string(),
            "127.0.0.1"
        );
        assert_eq!(client_ip(lb, &appended, &narrow).to_string(), "127.0.0.1");
        let wide = nets(&["127.0.0.0/8"]);
        assert_eq!(client_ip(lb, &overwritten, &wide).to_string(), "127.0.0.1");
        assert_eq!(client_ip(lb, &appended, &wide).to_string(), "198.51.100.7");
        // Straight to the gateway, not through the balancer: the header is not read.
        let client: IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(client_ip(client, &appended, &narrow), client);
    }

    #[test]
    fn bearer_prefix_is_optional_and_case_insensitive() {
        assert_eq!(strip_bearer("Bearer abc"), "abc");
        assert_eq!(strip_bearer("bearer  abc "), "abc");
        assert_eq!(strip_bearer("abc"), "abc");
    }
}
