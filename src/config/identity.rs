//! `identity`: which header carries the API key, which peers may forward a client address,
//! how IPv6 clients are grouped, and how JWTs are verified: HS256, `exp` required unless
//! `require_exp: false`, and `aud` and `iss` checked against `audience` and `issuer` when set.

use std::net::IpAddr;

use http::header::HeaderName;
use ipnet::IpNet;

use super::errors::{secret_from_env, Errors};
use super::{defaults, raw};

#[derive(Debug, Clone)]
pub struct IdentitySettings {
    pub api_key_header: HeaderName,
    pub trusted_proxies: Vec<IpNet>,
    /// `client_ip` keys of IPv6 clients keep this many leading bits (1-128): one counter per
    /// network, because a single client commonly holds a whole /64.
    pub ipv6_prefix: u8,
    pub jwt: Option<JwtSettings>,
    /// Keys neither in `api_keys` nor in the quota store get 401 instead of `default_tier`.
    pub require_known_keys: bool,
}

#[derive(Clone)]
pub struct JwtSettings {
    pub header: HeaderName,
    pub key: jsonwebtoken::DecodingKey,
    /// HS256, with `aud` and `iss` required and checked when configured; built once. `exp`
    /// and `nbf` are checked by [`crate::identity`] (a number, compared with `leeway`), not by
    /// the crate, which lets a claim that is not an integer pass.
    pub validation: jsonwebtoken::Validation,
    pub user_claim: String,
    pub tier_claim: String,
    /// A token without `exp` is refused (default).
    pub require_exp: bool,
    /// The accepted `aud` values; empty: `aud` is not checked.
    pub audience: Vec<String>,
    /// The accepted `iss` values; empty: `iss` is not checked.
    pub issuer: Vec<String>,
}

impl std::fmt::Debug for JwtSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtSettings")
            .field("header", &self.header)
            .field("key", &"<redacted>")
            .field("user_claim", &self.user_claim)
            .field("tier_claim", &self.tier_claim)
            .field("leeway_s", &self.validation.leeway)
            .field("require_exp", &self.require_exp)
            .field("audience", &self.audience)
            .field("issuer", &self.issuer)
            .finish()
    }
}

pub(super) fn header_name(errs: &mut Errors, path: &str, s: &str) -> Option<HeaderName> {
    HeaderName::from_bytes(s.as_bytes())
        .map_err(|_| errs.at(path, format!("{s:?} is not a valid header name")))
        .ok()
}

pub(super) fn validate(errs: &mut Errors, r: raw::Identity) -> IdentitySettings {
    let api_key_header = r
        .api_key_header
        .and_then(|h| header_name(errs, "identity.api_key_header", &h))
        .unwrap_or(HeaderName::from_static(defaults::API_KEY_HEADER));
    let mut trusted_proxies = Vec::new();
    for (i, p) in r.trusted_proxies.unwrap_or_default().iter().enumerate() {
        let net = p
            .parse::<IpNet>()
            .or_else(|_| p.parse::<IpAddr>().map(IpNet::from));
        match net {
            Ok(n) => trusted_proxies.push(n),
            Err(_) => errs.at(
                &format!("identity.trusted_proxies[{i}]"),
                format!("{p:?} is not an IP address or CIDR network"),
            ),
        }
    }
    let ipv6_prefix = match r.ipv6_prefix {
        None => defaults::IPV6_PREFIX,
        Some(p @ 1..=128) => p as u8,
        Some(p) => {
            errs.at(
                "identity.ipv6_prefix",
                format!("{p} is not a prefix length from 1 to 128"),
            );
            defaults::IPV6_PREFIX
        }
    };
    IdentitySettings {
        api_key_header,
        trusted_proxies,
        ipv6_prefix,
        jwt: r.jwt.and_then(|j| jwt(errs, j)),
        require_known_keys: r.require_known_keys.unwrap_or(false),
    }
}

fn jwt(errs: &mut Errors, j: raw::Jwt) -> Option<JwtSettings> {
    let leeway = j
        .leeway
        .as_deref()
        .and_then(|l| errs.duration("identity.jwt.leeway", l))
        .unwrap_or(defaults::JWT_LEEWAY);
    let header = j
        .header
        .and_then(|h| header_name(errs, "identity.jwt.header", &h))
        .unwrap_or(HeaderName::from_static(defaults::JWT_HEADER));
    let secret = secret_from_env(
        errs,
        "identity.jwt.hs256_secret_env",
        &j.hs256_secret_env,
        "the HS256 secret",
    )?;
    let audience = strings(errs, "identity.jwt.audience", j.audience);
    let issuer = strings(errs, "identity.jwt.issuer", j.issuer);
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::HS256);
    validation.required_spec_claims.clear();
    // Checked in `identity`, where a claim that is not a number is refused.
    validation.validate_exp = false;
    validation.validate_nbf = false;
    validation.leeway = leeway.as_secs();
    // Without an audience configured, `aud` is not ours to check (the crate would refuse every
    // token that has one); with one, a token must name it.
    validation.validate_aud = !audience.is_empty();
    if !audience.is_empty() {
        validation.set_audience(&audience);
        validation.required_spec_claims.insert("aud".into());
    }
    if !issuer.is_empty() {
        validation.set_issuer(&issuer);
        validation.required_spec_claims.insert("iss".into());
    }
    Some(JwtSettings {
        header,
        key: jsonwebtoken::DecodingKey::from_secret(secret.as_bytes()),
        validation,
        user_claim: j
            .user_claim
            .unwrap_or_else(|| defaults::JWT_USER_CLAIM.to_string()),
        tier_claim: j
            .tier_claim
            .unwrap_or_else(|| defaults::JWT_TIER_CLAIM.to_string()),
        require_exp: j.require_exp.unwrap_or(true),
        audience,
        issuer,
    })
}

/// A string or a list of strings, none empty; nothing when absent (or wrong: reported).
fn strings(errs: &mut Errors, path: &str, v: Option<serde_yaml::Value>) -> Vec<String> {
    use serde_yaml::Value;
    let one = |errs: &mut Errors, at: &str, v: &Value| match v {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::String(_) => {
            errs.at(at, "must not be empty");
            None
        }
        _ => {
            errs.at(at, "must be a string");
            None
        }
    };
    match v {
        None => Vec::new(),
        Some(Value::Sequence(items)) if items.is_empty() => {
            errs.at(path, "must name at least one value (or be left out)");
            Vec::new()
        }
        Some(Value::Sequence(items)) => items
            .iter()
            .enumerate()
            .filter_map(|(i, v)| one(errs, &format!("{path}[{i}]"), v))
            .collect(),
        Some(v @ Value::String(_)) => one(errs, path, &v).into_iter().collect(),
        Some(_) => {
            errs.at(path, "must be a string or a list of strings");
            Vec::new()
        }
    }
}
