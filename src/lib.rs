//! tollgate: an API gateway on Pingora that enforces distributed rate limits before a request
//! reaches any backend.
//!
//! A request walks the modules in this order: [`identity`] (who is calling) → [`route`]
//! (where it goes) → [`shed`] (refused when the gateway is near capacity, by priority) →
//! [`concurrency`] (a slot of each concurrent-request limit, held until the request ends) →
//! [`evaluate`] (every matching rate limit, checked in one [`store`] call with the [`limit`]
//! algorithms) → [`headers`] (the decision as HTTP). [`proxy`] is the Pingora
//! glue that runs them in `request_filter`; [`config`] holds the validated, hot-reloaded
//! configuration; [`server`] wires everything together. [`path`] puts a request path in
//! normal form, for use before routing.
#![forbid(unsafe_code)]

pub mod admin;
pub mod cli;
pub mod concurrency;
pub mod config;
pub mod demo;
pub mod evaluate;
pub mod headers;
pub mod identity;
pub mod limit;
pub mod path;
pub mod proxy;
pub mod route;
pub mod server;
pub mod shed;
pub mod store;
