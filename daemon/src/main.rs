//! `scopefs`: the host daemon and its command-line interface (argument parsing and dispatch).

mod api;
mod bench;
mod doctor;
mod executor;
mod lifecycle;
mod notify;
mod scope_cmd;
mod serve;
mod service;
mod setup;
mod tokens;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Per-conversation FUSE workspaces backed by object storage.
#[derive(Parser, Debug)]
#[command(name = "scopefs", version)]
struct Cli {
    /// Configuration file [default: /etc/scopefs/scopefs.toml if it exists, else embedded defaults].
    /// `SCOPEFS_*` environment variables override its values.
    #[arg(long, global = true, env = "SCOPEFS_CONFIG", value_name = "PATH")]
    config: Option<PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the daemon: mount every draft and active scope and serve the HTTP API until SIGTERM.
    ///
    /// Logs go to stderr; `SCOPEFS_LOG` sets the filter (default `info,fuser=warn`) and
    /// `SCOPEFS_LOG_FORMAT=json` switches to JSON lines. Under systemd
    /// (`Type=notify`) READY=1 is sent once scopes are mounted and the API is up.
    Serve,
    /// Manage scopes directly in the registry (no running daemon needed).
    Scope {
        #[command(subcommand)]
        command: ScopeCommand,
    },
    /// Check the host and the configuration: /dev/fuse, mount permission, mount root,
    /// registry and migrations, object store probe. Exits non-zero if a check fails.
    Doctor,
    /// Run file-system benchmarks against a directory.
    Bench(bench::BenchArgs),
}

#[derive(Subcommand, Debug)]
enum ScopeCommand {
    /// Create a scope for a thread and its filesystem (state `draft`).
    ///
    /// This does not mount the scope: a running daemon mounts it via
    /// `GET /internal/workspace-scopes/{scopeId}/mount`, and every draft or
    /// active scope is mounted when the daemon starts.
    Create {
        /// Primary thread id (1-128 characters of [A-Za-z0-9_.:-]).
        #[arg(long, value_name = "ID")]
        thread: String,
    },
    /// List the deployment's scopes.
    Ls,
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Bench(args) => {
            setup::init_logging("warn");
            bench::run(args)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Serve => {
            setup::init_logging("info,fuser=warn");
            let cfg = setup::load_config(cli.config.as_deref())?;
            serve::run(cfg)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Doctor => {
            setup::init_logging("warn");
            let cfg = setup::load_config(cli.config.as_deref())?;
            Ok(if doctor::run(&cfg) { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        Command::Scope { command } => {
            setup::init_logging("warn");
            let cfg = setup::load_config(cli.config.as_deref())?;
            match command {
                ScopeCommand::Create { thread } => scope_cmd::create(&cfg, &thread)?,
                ScopeCommand::Ls => scope_cmd::ls(&cfg)?,
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("scopefs: {e:#}");
            ExitCode::FAILURE
        }
    }
}
