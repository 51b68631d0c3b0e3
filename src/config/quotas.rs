//! `quotas`: where per-key overrides are kept (PostgreSQL, or an embedded SQLite file) and how
//! often every gateway reloads them. Without the section nothing changes and the quota admin
//! API answers 404. Read once at start.

use std::time::Duration;

use super::errors::Errors;
use super::{defaults, raw};
use crate::redact;

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

    /// The database URL with its password and credential query values hidden
    /// ([`crate::redact::url`]), for logs, `/readyz` and `/admin/v1/config`.
    pub fn database_redacted(&self) -> String {
        redact::url_shown(&self.database)
    }
}

pub(super) fn validate(errs: &mut Errors, r: raw::Quotas) -> QuotaSettings {
    let postgres = ["postgres://", "postgresql://"]
        .iter()
        .any(|p| r.database.starts_with(p));
    let what = "a PostgreSQL or SQLite URL (postgres://user@host/db, sqlite://PATH)";
    match redact::url(&r.database) {
        // sqlx reads a SQLite path itself; a PostgreSQL URL must parse.
        Err(e) if postgres || !r.database.starts_with("sqlite:") => {
            errs.at("quotas.database", format!("not {what}: {e}"));
        }
        Ok(shown) if !postgres && !r.database.starts_with("sqlite:") => {
            errs.at("quotas.database", format!("{shown:?} is not {what}"));
        }
        _ => {}
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

    fn errors(database: &str) -> Vec<String> {
        let mut errs = Errors::new("g.yaml");
        let raw = raw::Quotas {
            database: database.into(),
            refresh: None,
        };
        let shown = validate(&mut errs, raw).database_redacted();
        assert!(!shown.contains("s3cret"), "{shown}");
        errs.finish().err().map_or(Vec::new(), |e| e.0)
    }

    #[test]
    fn a_database_url_error_never_shows_its_password() {
        assert_eq!(
            errors("postgres://app:s3cret@db/q?sslmode=require"),
            Vec::<String>::new()
        );
        assert_eq!(errors("sqlite:///var/lib/q.db"), Vec::<String>::new());
        assert_eq!(
            errors("mysql://app:s3cret@db/q?password=s3cret"),
            ["g.yaml: quotas.database: \"mysql://app:***@db/q?password=***\" is not a PostgreSQL or SQLite URL (postgres://user@host/db, sqlite://PATH)"]
        );
        assert_eq!(
            errors("postgres://app:s3cret@db:port/q"),
            ["g.yaml: quotas.database: not a PostgreSQL or SQLite URL (postgres://user@host/db, sqlite://PATH): it does not parse as a URL (invalid port number); it is not shown, as it may hold a password"]
        );
        assert_eq!(
            errors("app:s3cret@db"),
            ["g.yaml: quotas.database: \"app:***\" is not a PostgreSQL or SQLite URL (postgres://user@host/db, sqlite://PATH)"]
        );
    }
}
