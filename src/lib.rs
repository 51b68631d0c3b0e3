//! tollgate: an API gateway on Pingora that enforces distributed rate limits before a request
//! reaches any backend.
//!
//! A request walks the modules in this order: [`identity`] (who is calling) →
//! [`path`] (the request path in normal form, before routing) → [`route`] (where it goes) →
//! [`shed`] (refused when the gateway is near capacity, by priority) → [`admission`] (a slot of
//! each concurrency limit, then every rate limit in one [`store`] call, with the [`limit`]
//! algorithms) → [`refusal`] and [`headers`] (the outcome as HTTP). [`proxy`] is the Pingora
//! glue that runs them in `request_filter`; [`config`] holds the validated, hot-reloaded
//! configuration, and imports nothing of the crate but [`limit`]; [`observe`] counts what was
//! decided (Prometheus metrics, the top limited callers, the access log) and [`admin`] serves
//! it on its own listener; [`server`] wires everything together.
#![forbid(unsafe_code)]

pub mod admin;
pub mod admission;
pub mod cli;
pub mod config;
pub mod conn;
pub mod demo;
pub mod fingerprint;
pub mod head;
pub mod headers;
pub mod health;
pub mod identity;
pub mod lifecycle;
pub mod limit;
pub mod observe;
pub mod path;
pub mod pingora_patches;
pub mod proxy;
pub mod quota;
pub mod redact;
pub mod refusal;
pub mod route;
pub mod server;
pub mod shed;
pub mod store;
pub mod upgrade;
