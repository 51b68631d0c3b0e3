//! The `tollgate` binary: cli → config → server.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use tollgate::cli::{Cli, Command, LogFormat, QuotasArgs, RunArgs};
use tollgate::config::reload::ConfigHandle;
use tollgate::config::{self, defaults, from_yaml, Overrides};
use tollgate::quota::client;

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,pingora_core=warn,pingora_proxy=warn".into());
    // Colour escapes only for a person at a terminal, never in a file or a log collector.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn run(args: RunArgs) -> ExitCode {
    init_logging(args.log_format);
    let overrides = Overrides {
        listen: args.listen,
        admin_listen: args.admin_listen,
        upstream: args.upstream,
        redis_url: args.redis_url,
        json_logs: args.log_format == LogFormat::Json,
    };
    let path = match args.config {
        Some(p) => Some(p),
        None if overrides.upstream.is_empty() => {
            let p = PathBuf::from("gateway.yaml");
            if !p.exists() {
                eprintln!("tollgate: no configuration: pass --config FILE, or --upstream HOST:PORT to run a catch-all proxy");
                return ExitCode::from(2);
            }
            Some(p)
        }
        None => None,
    };
    let loaded = match &path {
        Some(p) => config::load(p, &overrides),
        None => from_yaml(
            "<flags>",
            &format!("limits: [ {} ]", defaults::CATCH_ALL_LIMIT),
            &overrides,
        ),
    };
    let cfg = match loaded {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let handle = Arc::new(ConfigHandle::new(cfg, path, overrides));
    if let Err(e) = handle.catch_sighup() {
        eprintln!("tollgate: cannot catch SIGHUP: {e}");
        return ExitCode::FAILURE;
    }
    let opts = tollgate::server::StartOptions {
        upgrade: args.upgrade,
    };
    match tollgate::server::run(handle, opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tollgate: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `tollgate health`: GET the URL (by default the config's admin `/healthz`), exit 0 on 200.
fn health(url: Option<String>, config: Option<PathBuf>, timeout: Duration) -> ExitCode {
    let config = config.or_else(|| Some(PathBuf::from("gateway.yaml")).filter(|p| p.exists()));
    let url = match (url, config) {
        (Some(url), _) => url,
        (None, Some(path)) => match config::admin_endpoint_of(&path) {
            Ok(admin) => tollgate::health::healthz_url(admin.listen),
            Err(e) => {
                eprintln!("unhealthy: cannot tell the admin listener from the config:\n{e}");
                return ExitCode::FAILURE;
            }
        },
        (None, None) => {
            tollgate::health::healthz_url(defaults::ADMIN_LISTEN.parse().expect("default"))
        }
    };
    match tollgate::health::probe(&url, timeout) {
        Ok(200) => {
            println!("healthy: GET {url}: 200");
            ExitCode::SUCCESS
        }
        Ok(status) => {
            eprintln!("unhealthy: GET {url}: {status}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("unhealthy: GET {url}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `tollgate quotas …`: one call of a gateway's admin API, printed as a table or as JSON. Exit
/// 0 on success, 1 when the API refuses or cannot be reached, 2 on a usage error.
fn quotas(mut args: QuotasArgs) -> ExitCode {
    let fail = |code: u8, msg: String| {
        eprintln!("tollgate quotas: {msg}");
        ExitCode::from(code)
    };
    let env = |v: &str| std::env::var(v).ok();
    if let Err(e) = client::resolve_key(&mut args.action, std::io::stdin().lock(), env) {
        return fail(2, e);
    }
    let call = match client::call_of(&args.action) {
        Ok(c) => c,
        Err(e) => return fail(2, e),
    };
    let config = args
        .config
        .or_else(|| Some(PathBuf::from("gateway.yaml")).filter(|p| p.exists()));
    let endpoint = match config.as_deref().map(config::admin_endpoint_of).transpose() {
        Ok(e) => e,
        Err(e) => {
            return fail(
                2,
                format!("cannot tell the admin listener from the config:\n{e}"),
            )
        }
    };
    let admin_url = args.admin_url.unwrap_or_else(|| {
        let listen = endpoint.as_ref().map_or_else(
            || defaults::ADMIN_LISTEN.parse().expect("default"),
            |e| e.listen,
        );
        tollgate::health::admin_url(listen)
    });
    let token = match args
        .token_env
        .or_else(|| endpoint.and_then(|e| e.token_env))
    {
        None => None,
        Some(var) => match std::env::var(&var) {
            Ok(t) if !t.is_empty() => Some(t),
            _ => return fail(2, format!("the admin token's variable {var} is not set")),
        },
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(1, format!("cannot start a runtime: {e}")),
    };
    match rt.block_on(client::run(&admin_url, token.as_deref(), call)) {
        Ok(v) if args.json => {
            println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            ExitCode::SUCCESS
        }
        Ok(v) => {
            print!("{}", client::table(&v));
            ExitCode::SUCCESS
        }
        Err(e) => fail(1, e.to_string()),
    }
}

/// The allocator, as a measured choice (`loadtest/log/2026-11-24-mimalloc.md`): built with
/// `--features mimalloc` (the default), every allocation goes to mimalloc instead of glibc's
/// malloc.
#[cfg(feature = "mimalloc")]
#[allow(unsafe_code)] // a `GlobalAlloc` is an unsafe trait; the library itself forbids unsafe
mod alloc;

#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: alloc::MiMalloc = alloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        None => run(cli.run),
        Some(Command::Check { file }) => match config::load(&file, &Overrides::default()) {
            Ok(_) => {
                println!("ok");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        },
        Some(Command::Health {
            url,
            config,
            timeout,
        }) => health(url, config, timeout),
        Some(Command::Quotas(args)) => quotas(*args),
        Some(Command::DemoUpstream { listen }) => {
            init_logging(LogFormat::Text);
            match tollgate::server::run_demo_upstream(listen) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("tollgate: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
