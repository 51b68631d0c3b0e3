//! `quotas`: where per-key overrides are kept (PostgreSQL, or an embedded SQLite file) and how
//! often every gateway reloads them. Without the section nothing changes and the quota admin
//! API answers 404. Read once at start.

use std::time::Duration;

use super::errors::Errors;
use super::{defaults, raw};

/// `quotas`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaSettings {
    /// `postgres://user@host/db` or `sqlite://PATH` (created if missing).
    pub database: String,
    /// Every gateway reloads the overrides this often (and at once on a PostgreSQL NOTIFY).
    pub refresh: Duration,
}

impl QuotaSettings {
    /// `postgresql` or `sqlite`, for logs.
    pub fn backend_name(&self) -> &'static str {
        if self.database.starts_with("sqlite:") {
            "sqlite"
        } else {
            "postgresql"
        }
    }

    /// The database URL with any password replaced, for logs and `/readyz`.
    pub fn database_redacted(&self) -> String {
        redact_password(&self.database)
    }
}

/// `scheme://user:secret@host` → `scheme://user:***@host`.
pub fn redact_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    match rest.split_once('@') {
        Some((userinfo, host)) if userinfo.contains(':') => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            format!("{scheme}://{user}:***@{host}")
        }
        _ => url.to_string(),
    }
}

pub(super) fn validate(errs: &mut Errors, r: raw::Quotas) -> QuotaSettings {
    let ok = ["postgres://", "postgresql://", "sqlite:"]
        .iter()
        .any(|p| r.database.starts_with(p));
    if !ok {
        errs.at(
            "quotas.database",
            format!(
                "{:?} is not a PostgreSQL or SQLite URL (postgres://user@host/db, sqlite://PATH)",
                redact_password(&r.database)
            ),
        );
    }
    let refresh = r
        .refresh
        .as_deref()
        .and_then(|s| errs.duration("quotas.refresh", s))
        .unwrap_or(defaults::QUOTA_REFRESH);
    if refresh.is_zero() {
        errs.at("quotas.refresh", "must be greater than zero");
    }
    QuotaSettings {
        database: r.database,
        refresh,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact_password("postgres://app:s3cret@db:5432/quotas"),
            "postgres://app:***@db:5432/quotas"
        );
        assert_eq!(
            redact_password("postgres://app@db/quotas"),
            "postgres://app@db/quotas"
        );
        assert_eq!(
            redact_password("sqlite:///var/lib/q.db"),
            "sqlite:///var/lib/q.db"
        );
    }
}
