//! Command line: run the gateway, check a config, probe a gateway's health, manage tenant
//! quotas through a gateway's admin API, or run the demo upstream.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// tollgate: an API gateway that enforces distributed rate limits before a request reaches
/// any backend.
///
/// Without a subcommand it runs the gateway. Flags override the config file. With
/// --upstream and no config file it runs as a catch-all proxy on the memory store with the
/// default per-IP limit of 600 requests per minute.
/// `tollgate --version`: the package version and the commit the binary was built from (a
/// 7-or-more hex prefix, `unknown` when built outside a git checkout; see build.rs).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("TOLLGATE_COMMIT"),
    ")"
);

#[derive(Debug, Parser)]
#[command(
    name = "tollgate",
    version = VERSION,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate a config file: print `ok` and exit 0, or print every error and exit 1.
    Check {
        /// The config file to validate.
        file: PathBuf,
    },
    /// Check that a gateway is healthy: GET its admin listener's /healthz (or --url), exit 0
    /// on 200 and 1 otherwise. The container image's HEALTHCHECK runs it (no curl needed).
    Health {
        /// The URL to GET (plain http). Default: /healthz on the config's
        /// server.admin_listen (0.0.0.0 is asked on 127.0.0.1), or
        /// http://127.0.0.1:9901/healthz when there is no config file.
        #[arg(long)]
        url: Option<String>,
        /// The config file whose admin listener is asked (default: ./gateway.yaml when it
        /// exists). Its ${VAR} references are expanded as the gateway expands them.
        #[arg(long, short = 'c', env = "TOLLGATE_CONFIG")]
        config: Option<PathBuf>,
        /// Give up after this long (500ms, 2s, ...).
        #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
        timeout: Duration,
    },
    /// Tenant quota overrides and usage, through a gateway's admin API (/admin/v1).
    ///
    /// KEY is the raw API key or its fingerprint `fp:xxxxxxxx` (as `list` shows it). The admin
    /// token is read from the environment variable the config's `admin.token_env` names (or
    /// --token-env).
    Quotas(Box<QuotasArgs>),
    /// Run the bundled demo upstream, which echoes requests as JSON.
    DemoUpstream {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:9000")]
        listen: SocketAddr,
    },
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The config file (default: ./gateway.yaml when it exists and no --upstream is given).
    #[arg(long, short = 'c', env = "TOLLGATE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address the proxy listens on (overrides server.listen).
    #[arg(long)]
    pub listen: Option<String>,
    /// An upstream server HOST:PORT; repeat for several. Defines the upstream named "default".
    #[arg(long = "upstream", value_name = "HOST:PORT")]
    pub upstream: Vec<String>,
    /// Redis URL (redis:// or rediss://); selects the Redis store.
    #[arg(long, env = "TOLLGATE_REDIS_URL")]
    pub redis_url: Option<String>,
    /// Address of the admin listener (overrides server.admin_listen).
    #[arg(long)]
    pub admin_listen: Option<String>,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Take the listening sockets over from a running gateway with the same config (through
    /// `server.upgrade_sock`); then send that gateway SIGQUIT within 5 seconds.
    #[arg(long)]
    pub upgrade: bool,
}

#[derive(Debug, Args)]
pub struct QuotasArgs {
    /// The admin listener's base URL. Default: http:// and the config's server.admin_listen
    /// (0.0.0.0 is asked on 127.0.0.1), or http://127.0.0.1:9901 with no config file.
    #[arg(long, global = true)]
    pub admin_url: Option<String>,
    /// The config file that names the admin listener and `admin.token_env` (default:
    /// ./gateway.yaml when it exists).
    #[arg(long, short = 'c', env = "TOLLGATE_CONFIG", global = true)]
    pub config: Option<PathBuf>,
    /// The environment variable holding the admin token (default: the config's
    /// `admin.token_env`).
    #[arg(long, global = true)]
    pub token_env: Option<String>,
    /// Print the API's JSON answer instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub action: QuotaAction,
}

#[derive(Debug, Clone, Subcommand)]
pub enum QuotaAction {
    /// Every override, a page at a time.
    List {
        /// Overrides per page (at most 1000).
        #[arg(long)]
        limit: Option<u32>,
        /// Where the previous page ended (its `next_cursor`).
        #[arg(long)]
        cursor: Option<String>,
    },
    /// One key's override.
    Get { key: String },
    /// Create or change a key's override; what is not given keeps its stored value.
    ///
    /// The key is KEY, or read from standard input (--key-stdin) or an environment variable
    /// (--key-env NAME), which keep a raw key out of the process list and the shell history.
    Set {
        #[arg(required_unless_present_any = ["key_stdin", "key_env"])]
        key: Option<String>,
        /// Read the key from standard input (one line; the line break is not part of it).
        #[arg(long, conflicts_with_all = ["key", "key_env"])]
        key_stdin: bool,
        /// Read the key from this environment variable.
        #[arg(long, value_name = "NAME", conflicts_with = "key")]
        key_env: Option<String>,
        /// The tier the key is in (a name under `tiers:`).
        #[arg(long)]
        tier: Option<String>,
        /// A label for people (a customer, an environment).
        #[arg(long)]
        label: Option<String>,
        /// `active`, or `disabled` to revoke the key (401 on every gateway).
        #[arg(long)]
        status: Option<String>,
        /// New parameters of one limit for this key: NAME=LIMIT[/WINDOW][,burst=N], for
        /// example `api=5000/1m,burst=100`. Repeat for several limits; the set given
        /// replaces the key's stored limit overrides.
        #[arg(long = "limit", value_name = "NAME=LIMIT[/WINDOW][,burst=N]")]
        limits: Vec<String>,
        /// From when the override applies (RFC 3339, e.g. 2026-12-01T00:00:00Z).
        #[arg(long)]
        effective_at: Option<String>,
        /// From when it no longer applies (RFC 3339).
        #[arg(long)]
        expires_at: Option<String>,
        /// Clear a field (tier, label, limits, effective_at, expires_at); repeatable.
        #[arg(long, value_name = "FIELD")]
        clear: Vec<String>,
    },
    /// Remove a key's override: the key is back to what the config file says.
    Delete { key: String },
    /// What a key has used and has left of every limit it is subject to (changes nothing).
    Usage { key: String },
    /// Reset a key's counters of every limit it is subject to.
    Reset { key: String },
    /// The audit trail of changes, newest first.
    Audit {
        #[arg(long)]
        limit: Option<u32>,
        #[arg(long)]
        cursor: Option<String>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}
