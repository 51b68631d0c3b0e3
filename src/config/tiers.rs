//! `tiers`, `api_keys` and `default_tier`: the limits every request of a caller's tier gets,
//! and which tier a static API key belongs to.

use std::collections::HashMap;

use serde_yaml::Value;

use super::errors::Errors;
use super::limits::{LimitBuilder, LimitIds};
use super::{defaults, raw};

pub type TierId = usize;

#[derive(Debug)]
pub struct Tier {
    pub name: String,
    pub limits: LimitIds,
}

/// `tiers`, with their ids by name. Their limits are added to `b`.
pub(super) fn tiers(
    errs: &mut Errors,
    entries: Vec<(String, Value)>,
    b: &mut LimitBuilder,
) -> (Vec<Tier>, HashMap<String, TierId>) {
    let mut tiers = Vec::new();
    let mut ids = HashMap::new();
    for (name, items) in entries {
        let items: Vec<Value> = errs
            .parse(&format!("tiers.{name}"), items)
            .unwrap_or_default();
        let mut limits = LimitIds::default();
        for (i, item) in items.into_iter().enumerate() {
            let path = format!("tiers.{name}[{i}]");
            let Some(l) = errs.parse::<raw::Limit>(&path, item) else {
                continue;
            };
            if l.routes.is_some() {
                errs.at(
                    &format!("{path}.routes"),
                    "only top-level limits can name routes",
                );
            }
            if let Some(id) = b.add(errs, &path, l, defaults::TIER_LIMIT_KEY) {
                limits.push(id, &b.limits);
            }
        }
        ids.insert(name.clone(), tiers.len());
        tiers.push(Tier { name, limits });
    }
    (tiers, ids)
}

/// API keys are secrets: an error message shows only their first characters.
fn redact_key(key: &str) -> String {
    let shown: String = key.chars().take(4).collect();
    if shown.len() < key.len() {
        format!("{shown}…")
    } else {
        shown
    }
}

/// `api_keys`: static key → tier.
pub(super) fn api_keys(
    errs: &mut Errors,
    entries: Vec<(String, Value)>,
    tier_ids: &HashMap<String, TierId>,
) -> HashMap<String, TierId> {
    let mut api_keys = HashMap::new();
    for (key, tier) in entries {
        let path = format!("api_keys.{}", redact_key(&key));
        let Some(tier) = errs.parse::<String>(&path, tier) else {
            continue;
        };
        match tier_ids.get(&tier) {
            Some(&t) => {
                api_keys.insert(key, t);
            }
            None => errs.at(&path, format!("tier {tier:?} is not defined under tiers")),
        }
    }
    api_keys
}

/// `default_tier`, the tier of API keys not listed.
pub(super) fn default_tier(
    errs: &mut Errors,
    name: Option<String>,
    tier_ids: &HashMap<String, TierId>,
) -> Option<TierId> {
    let name = name?;
    let id = tier_ids.get(&name).copied();
    if id.is_none() {
        errs.at(
            "default_tier",
            format!("tier {name:?} is not defined under tiers"),
        );
    }
    id
}
