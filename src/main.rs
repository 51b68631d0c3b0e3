//! The `tollgate` binary: cli → config → server.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use tollgate::cli::{Cli, Command, LogFormat, RunArgs};
use tollgate::config::reload::ConfigHandle;
use tollgate::config::{self, defaults, from_yaml, Overrides};

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,pingora_core=warn,pingora_proxy=warn".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
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
    match tollgate::server::run(handle) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tollgate: {e}");
            ExitCode::FAILURE
        }
    }
}

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
                println!("{e}");
                ExitCode::FAILURE
            }
        },
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
