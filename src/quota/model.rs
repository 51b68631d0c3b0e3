//! What an override says, as stored and as the admin API reads and writes it. A key is named by
//! its hash (stored) and its fingerprint (shown); the raw key is never stored, logged or echoed.
//!
//! Phase: the admin API and the refresh task, never a request.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::config::{Config, Spec};

pub use crate::fingerprint::KeyHash;

/// Whether a key may be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Active,
    /// Revoked: its requests get 401.
    Disabled,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Active => "active",
            Status::Disabled => "disabled",
        }
    }

    pub fn parse(s: &str) -> Option<Status> {
        match s {
            "active" => Some(Status::Active),
            "disabled" => Some(Status::Disabled),
            _ => None,
        }
    }
}

/// New parameters of one rate limit for one key; what is absent keeps the configured value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitOverride {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
}

/// One key's override, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Override {
    pub key_hash: KeyHash,
    /// The 8 hex digits of the key's fingerprint.
    pub fingerprint: String,
    pub label: Option<String>,
    pub tier: Option<String>,
    pub status: Status,
    /// By limit name.
    pub limits: BTreeMap<String, LimitOverride>,
    /// Unix seconds; before it the override does not apply yet.
    pub effective_at: Option<i64>,
    /// Unix seconds; from it on the override no longer applies.
    pub expires_at: Option<i64>,
    pub created_at: i64,
    pub updated_at: i64,
}

impl Override {
    /// Whether it applies at `now` (Unix seconds).
    pub fn in_force(&self, now: i64) -> bool {
        self.effective_at.is_none_or(|t| now >= t) && self.expires_at.is_none_or(|t| now < t)
    }

    /// The document the admin API shows: by fingerprint, never the key.
    pub fn to_json(&self, now: i64) -> Value {
        json!({
            // No key: a change of the whole gateway (a reload).
            "key": (!self.fingerprint.is_empty()).then(|| format!("fp:{}", self.fingerprint)),
            "label": self.label,
            "tier": self.tier,
            "status": self.status.as_str(),
            "limits": self.limits,
            "effective_at": self.effective_at.map(rfc3339),
            "expires_at": self.expires_at.map(rfc3339),
            "in_force": self.in_force(now),
            "created_at": rfc3339(self.created_at),
            "updated_at": rfc3339(self.updated_at),
        })
    }
}

/// One change, as the audit trail keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEntry {
    /// Sortable: when, then a random part.
    pub id: String,
    pub at: i64,
    pub fingerprint: String,
    /// `put`, `delete`, `reset`, `reload`, `reload_refused`; a reload has no fingerprint.
    pub action: String,
    /// The override before and after, as the admin API shows them (JSON text).
    pub before: Option<String>,
    pub after: Option<String>,
    /// The address of the admin call.
    pub client: String,
}

impl AuditEntry {
    pub fn to_json(&self) -> Value {
        let doc = |d: &Option<String>| {
            d.as_deref()
                .and_then(|s| serde_json::from_str::<Value>(s).ok())
        };
        json!({
            "id": self.id,
            "at": rfc3339(self.at),
            // No key: a change of the whole gateway (a reload).
            "key": (!self.fingerprint.is_empty()).then(|| format!("fp:{}", self.fingerprint)),
            "action": self.action,
            "before": doc(&self.before),
            "after": doc(&self.after),
            "client": self.client,
        })
    }
}

/// `2026-12-01T00:00:00Z`.
pub fn rfc3339(unix: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(unix.max(0) as u64);
    humantime::format_rfc3339_seconds(t).to_string()
}

fn parse_time(s: &str) -> Option<i64> {
    let t = humantime::parse_rfc3339_weak(s).ok()?;
    Some(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs() as i64)
}

/// The body of `PUT /admin/v1/quotas/{key}`: every field optional, at least one present. A
/// field present replaces the stored value (`null` clears it); a field absent keeps it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutBody {
    #[serde(default, with = "present")]
    pub tier: Option<Option<String>>,
    #[serde(default, with = "present")]
    pub label: Option<Option<String>>,
    pub status: Option<String>,
    pub limits: Option<BTreeMap<String, LimitOverride>>,
    #[serde(default, with = "present")]
    pub effective_at: Option<Option<String>>,
    #[serde(default, with = "present")]
    pub expires_at: Option<Option<String>>,
}

/// `Some(None)` for an explicit `null`, `None` for an absent field.
mod present {
    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
    where
        D: Deserializer<'de>,
        T: Deserialize<'de>,
    {
        Option::<T>::deserialize(d).map(Some)
    }
}

/// A body the admin API refuses with 400: the field, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyError {
    pub field: String,
    pub message: String,
}

fn err(field: impl Into<String>, message: impl Into<String>) -> BodyError {
    BodyError {
        field: field.into(),
        message: message.into(),
    }
}

impl PutBody {
    /// Parse a body; the error names the field (serde's path) where it can.
    pub fn parse(bytes: &[u8]) -> Result<PutBody, BodyError> {
        let de = &mut serde_json::Deserializer::from_slice(bytes);
        let body: PutBody = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            err(
                if path == "." { "body".into() } else { path },
                e.into_inner().to_string(),
            )
        })?;
        let any = body.tier.is_some()
            || body.label.is_some()
            || body.status.is_some()
            || body.limits.is_some()
            || body.effective_at.is_some()
            || body.expires_at.is_some();
        if !any {
            return Err(err(
                "body",
                "set at least one of tier, label, status, limits, effective_at, expires_at",
            ));
        }
        Ok(body)
    }

    /// Apply the body to `current` (or a new override of `key`), checking names against `cfg`.
    pub fn apply(
        self,
        cfg: &Config,
        current: Option<Override>,
        key: KeyHash,
        fingerprint: &str,
        now: i64,
    ) -> Result<Override, BodyError> {
        let mut o = current.unwrap_or(Override {
            key_hash: key,
            fingerprint: fingerprint.to_string(),
            label: None,
            tier: None,
            status: Status::Active,
            limits: BTreeMap::new(),
            effective_at: None,
            expires_at: None,
            created_at: now,
            updated_at: now,
        });
        if let Some(tier) = self.tier {
            if let Some(t) = &tier {
                if !cfg.tiers.iter().any(|x| &x.name == t) {
                    return Err(err(
                        "tier",
                        format!("tier {t:?} is not defined in the config"),
                    ));
                }
            }
            o.tier = tier;
        }
        if let Some(label) = self.label {
            if label.as_ref().is_some_and(|l| l.len() > 200) {
                return Err(err("label", "at most 200 characters"));
            }
            o.label = label;
        }
        if let Some(s) = self.status {
            o.status = Status::parse(&s).ok_or_else(|| {
                err(
                    "status",
                    format!("{s:?} is not a status (active, disabled)"),
                )
            })?;
        }
        if let Some(limits) = self.limits {
            check_limits(cfg, &limits)?;
            o.limits = limits;
        }
        if let Some(t) = self.effective_at {
            o.effective_at = t.map(|s| time_field("effective_at", &s)).transpose()?;
        }
        if let Some(t) = self.expires_at {
            o.expires_at = t.map(|s| time_field("expires_at", &s)).transpose()?;
        }
        if let (Some(a), Some(b)) = (o.effective_at, o.expires_at) {
            if b <= a {
                return Err(err("expires_at", "must be after effective_at"));
            }
        }
        o.updated_at = now;
        Ok(o)
    }
}

fn time_field(field: &str, s: &str) -> Result<i64, BodyError> {
    parse_time(s).ok_or_else(|| {
        err(
            field,
            format!("{s:?} is not an RFC 3339 time (2026-12-01T00:00:00Z)"),
        )
    })
}

/// Every named limit exists, is a rate limit, and takes the new parameters.
fn check_limits(cfg: &Config, limits: &BTreeMap<String, LimitOverride>) -> Result<(), BodyError> {
    for (name, p) in limits {
        let field = format!("limits.{name}");
        let Some(limit) = cfg.limits.iter().find(|l| &*l.name == name) else {
            return Err(err(
                &field,
                format!("limit {name:?} is not defined in the config"),
            ));
        };
        let Spec::Rate(rate) = &limit.spec else {
            return Err(err(
                &field,
                format!("limit {name:?} is a concurrency limit; only rate limits take overrides"),
            ));
        };
        if p.limit.is_none() && p.window.is_none() && p.burst.is_none() {
            return Err(err(&field, "set limit, window or burst"));
        }
        rate.with_params(
            &limit.name,
            p.limit,
            p.window.as_deref(),
            p.burst,
            cfg.failure.local_share,
        )
        .map_err(|(sub, message)| err(format!("{field}.{sub}"), message))?;
    }
    Ok(())
}
