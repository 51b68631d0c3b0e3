//! Command line: run the gateway, check a config, probe a gateway's health, or run the demo
//! upstream.

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
#[derive(Debug, Parser)]
#[command(name = "tollgate", version, args_conflicts_with_subcommands = true)]
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}
