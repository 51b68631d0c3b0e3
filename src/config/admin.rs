//! `admin`: who may read the admin listener's pages. `token_env` names an environment
//! variable holding a bearer token, read when the config is loaded; only its hash is kept.

use super::errors::{secret_from_env, Errors};
use super::raw;

/// `admin`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdminSettings {
    /// BLAKE3 of the admin token (compared in constant time), or `None`: no token configured.
    pub token_hash: Option<blake3::Hash>,
    /// The environment variable it came from, for messages.
    pub token_env: Option<String>,
}

pub(super) fn validate(errs: &mut Errors, r: raw::Admin) -> AdminSettings {
    let Some(var) = r.token_env else {
        return AdminSettings::default();
    };
    let token = secret_from_env(errs, "admin.token_env", &var, "the admin bearer token");
    AdminSettings {
        token_hash: token.map(|t| blake3::hash(t.as_bytes())),
        token_env: Some(var),
    }
}
