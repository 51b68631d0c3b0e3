//! Who is calling: API key, JWT-named user and tier, and the client IP.
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
    let data = jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(
        strip_bearer(token),
        &jwt.key,
        &jwt.validation,
    )
    .map_err(|e| IdentityError::InvalidToken(e.to_string()))?;
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

    #[test]
    fn bearer_prefix_is_optional_and_case_insensitive() {
        assert_eq!(strip_bearer("Bearer abc"), "abc");
        assert_eq!(strip_bearer("bearer  abc "), "abc");
        assert_eq!(strip_bearer("abc"), "abc");
    }
}
