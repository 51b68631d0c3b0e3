//! `identity`: which header carries the API key, which peers may forward a client address,
//! how IPv6 clients are grouped, and how JWTs are verified.

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
    /// HS256 with `exp` and `nbf` checked with the configured leeway; built once.
    pub validation: jsonwebtoken::Validation,
    pub user_claim: String,
    pub tier_claim: String,
}

impl std::fmt::Debug for JwtSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtSettings")
            .field("header", &self.header)
            .field("key", &"<redacted>")
            .field("user_claim", &self.user_claim)
            .field("tier_claim", &self.tier_claim)
            .field("leeway_s", &self.validation.leeway)
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
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::HS256);
    validation.required_spec_claims.clear();
    validation.validate_exp = true;
    validation.validate_nbf = true;
    validation.leeway = leeway.as_secs();
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
    })
}
