//! `admin`: who may read the admin listener's pages. `token_env` names an environment
//! variable holding a bearer token, read when the config is loaded; only its hash is kept.
//! `allowed_hosts` names the host names the admin listener answers to besides IP literals and
//! `localhost` (a DNS-rebinding defence: a page on another name gets 421).
//! `max_connections` caps the admin listener's connections (read at start).

use super::defaults;
use super::errors::{secret_from_env, Errors};
use super::raw;

/// `admin`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminSettings {
    /// BLAKE3 of the admin token (compared in constant time), or `None`: no token configured.
    pub token_hash: Option<blake3::Hash>,
    /// The environment variable it came from, for messages.
    pub token_env: Option<String>,
    /// `allowed_hosts`, lowercase and without a trailing dot.
    pub allowed_hosts: Vec<String>,
    /// Connections the admin listener holds at most, so that it cannot take the file
    /// descriptors the proxy needs. Read at start; a reload's value applies on restart.
    pub max_connections: usize,
}

impl Default for AdminSettings {
    fn default() -> AdminSettings {
        AdminSettings {
            token_hash: None,
            token_env: None,
            allowed_hosts: Vec::new(),
            max_connections: defaults::ADMIN_MAX_CONNECTIONS,
        }
    }
}

pub(super) fn validate(errs: &mut Errors, r: raw::Admin) -> AdminSettings {
    let allowed_hosts = allowed_hosts(errs, r.allowed_hosts.unwrap_or_default());
    let max_connections = r
        .max_connections
        .map_or(defaults::ADMIN_MAX_CONNECTIONS, |n| {
            errs.at_least_one("admin.max_connections", n, defaults::ADMIN_MAX_CONNECTIONS)
        });
    let Some(var) = r.token_env else {
        return AdminSettings {
            allowed_hosts,
            max_connections,
            ..AdminSettings::default()
        };
    };
    let token = secret_from_env(errs, "admin.token_env", &var, "the admin bearer token");
    AdminSettings {
        token_hash: token.map(|t| blake3::hash(t.as_bytes())),
        token_env: Some(var),
        allowed_hosts,
        max_connections,
    }
}

/// Each a DNS name: letters, digits, `-` and `.`, without scheme, port or path.
fn allowed_hosts(errs: &mut Errors, hosts: Vec<String>) -> Vec<String> {
    let mut out = Vec::with_capacity(hosts.len());
    for (i, h) in hosts.into_iter().enumerate() {
        let name = h.strip_suffix('.').unwrap_or(&h).to_ascii_lowercase();
        let ok = !name.is_empty()
            && name.len() <= 253
            && name.split('.').all(|l| {
                !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            });
        if ok {
            out.push(name);
        } else {
            errs.at(
                &format!("admin.allowed_hosts[{i}]"),
                format!("{h:?} must be a host name without scheme, port or path"),
            );
        }
    }
    out
}
