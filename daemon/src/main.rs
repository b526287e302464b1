//! `scopefs`: the host daemon and its command-line interface (argument parsing and dispatch).

use scopefs_daemon::datadir_lock::{DataDirLock, Holder};
use scopefs_daemon::{
    bench, doctor, node_cmd, ops_cmd, restore_cmd, scope_cmd, serve, service_stop, setup, supervisor,
};

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
    /// Mounts outlive the process: under systemd their connections go to the fd store;
    /// otherwise this process is a supervisor that keeps them and runs the daemon as its
    /// worker (SIGHUP: graceful restart keeping every mount; SIGTERM/SIGINT: stop).
    Serve {
        /// Print the effective configuration (file + environment) as TOML, secrets redacted, and exit.
        #[arg(long)]
        print_config: bool,
    },
    /// Manage scopes directly in the registry, without the daemon (`create` refuses while a
    /// daemon runs on the data directory; `ls` works beside it).
    Scope {
        #[command(subcommand)]
        command: ScopeCommand,
    },
    /// Check the host and the configuration: /dev/fuse, mount permission, mount root,
    /// registry and migrations, object store probe, Docker and the sandbox image, the default
    /// plan. Exits non-zero if a check fails (a WARN line does not).
    Doctor,
    /// Run file-system benchmarks against a directory.
    Bench(bench::BenchArgs),
    /// Check every block of a scope against the object store; reports damaged files by virtual
    /// path and orphan objects. Exits non-zero when problems were found. Refuses while a daemon
    /// runs on the data directory (stop it first).
    Fsck {
        /// Scope id.
        scope: String,
        /// Delete orphan objects (damaged files are reported; their reads fail, never return wrong bytes).
        #[arg(long)]
        repair: bool,
    },
    /// Delete a scope's blocks that no file refers to any more. Refuses while a daemon runs on the
    /// data directory: the daemon collects online itself (`[gc]`, and
    /// `POST /internal/workspace-scopes/{scope_id}/gc`).
    Gc {
        /// Scope id.
        scope: String,
        /// Only blocks unreferenced for at least this many seconds.
        #[arg(long, default_value_t = 0)]
        grace_secs: u64,
    },
    /// Rebuild the data directory from the object store alone: the registry when there is none on
    /// disk, then each named scope's metadata from its shipped snapshot and logs (a scope with a
    /// local database is left as it is). Refuses while a daemon runs on the data directory.
    Restore {
        /// One scope's id.
        #[arg(long, value_name = "ID", conflicts_with = "all", required_unless_present = "all")]
        scope: Option<String>,
        /// Every draft and active scope of the deployment (as the registry lists them).
        #[arg(long)]
        all: bool,
    },
    /// Copy a local directory tree into a thread's scope (created if needed), with a progress bar.
    /// Refuses while a daemon runs on the data directory (stop it first).
    Import {
        /// Directory to import (regular files and directories; symlinks are skipped).
        dir: PathBuf,
        /// Primary thread id of the target scope.
        #[arg(long, value_name = "ID")]
        thread: String,
    },
    /// The systemd unit's `ExecStop=`: when systemd stops the unit (not a restart), asks the
    /// daemon (`$MAINPID`) to end its environments and unmount its scopes, and waits for it to exit;
    /// otherwise does nothing, and the `SIGTERM` that follows keeps the mounts for the next process.
    ServiceStop {
        /// The unit's name (`%n`).
        #[arg(long)]
        unit: String,
    },
    /// The nodes of a deployment of several daemons (`[node]`, a PostgreSQL registry).
    Node {
        #[command(subcommand)]
        command: NodeCommand,
    },
    /// Show or rotate the generated secrets in <data_dir>/control.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
}

#[derive(Subcommand, Debug)]
enum TokenCommand {
    /// Print a secret (generated if absent).
    Show {
        #[arg(value_enum, default_value = "service")]
        kind: ops_cmd::TokenKind,
    },
    /// Replace a generated secret with a new random one; restart the daemon afterwards.
    Rotate {
        #[arg(value_enum, default_value = "service")]
        kind: ops_cmd::TokenKind,
    },
}

#[derive(Subcommand, Debug)]
enum NodeCommand {
    /// List the nodes: state, lease, scopes placed, load.
    Ls,
    /// Move every scope away from NODE (an upgrade, a host taken out of service): the node hands
    /// them, a batch per heartbeat, to the nodes placement chooses; each scope's containers stop
    /// there only once the new node serves it.
    Drain {
        node: String,
        /// Wait until no scope is placed on the node.
        #[arg(long)]
        wait: bool,
        /// Bound on --wait, in seconds.
        #[arg(long, default_value_t = 600)]
        timeout_secs: u64,
    },
    /// Take a draining node back into placement.
    Undrain { node: String },
    /// Remove a node that serves no scope (drain it first).
    Remove { node: String },
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

fn run_node(config: Option<&std::path::Path>, command: NodeCommand) -> anyhow::Result<ExitCode> {
    setup::init_logging("warn");
    let cfg = &setup::load_config(config)?;
    match command {
        NodeCommand::Ls => node_cmd::ls(cfg)?,
        NodeCommand::Drain { node, wait, timeout_secs } => {
            node_cmd::drain(cfg, &node, wait, std::time::Duration::from_secs(timeout_secs))?
        }
        NodeCommand::Undrain { node } => node_cmd::undrain(cfg, &node)?,
        NodeCommand::Remove { node } => node_cmd::remove(cfg, &node)?,
    }
    Ok(ExitCode::SUCCESS)
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Bench(args) => {
            setup::init_logging("warn");
            bench::run(args)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Serve { print_config } => {
            let cfg = setup::load_config(cli.config.as_deref())?;
            if print_config {
                ops_cmd::print_config(&cfg)?;
                return Ok(ExitCode::SUCCESS);
            }
            setup::init_logging("info,fuser=warn");
            // Outside systemd, this process keeps the mounts' descriptors and runs the daemon as
            // its worker (see `supervisor`); under systemd the fd store keeps them.
            // The supervisor holds the data directory's lock for its whole life and hands it to
            // each worker; under systemd the daemon takes it itself (`serve::run`).
            if !supervisor::is_worker() && std::env::var_os("NOTIFY_SOCKET").is_none() {
                let lock = DataDirLock::acquire(&cfg.data_dir, &Holder::Daemon)?;
                return supervisor::run(lock);
            }
            serve::run(cfg)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Fsck { scope, repair } => {
            setup::init_logging("warn");
            let cfg = setup::load_config(cli.config.as_deref())?;
            Ok(if ops_cmd::fsck(&cfg, &scope, repair)? { ExitCode::SUCCESS } else { ExitCode::FAILURE })
        }
        Command::Gc { scope, grace_secs } => {
            setup::init_logging("warn");
            let cfg = setup::load_config(cli.config.as_deref())?;
            ops_cmd::gc(&cfg, &scope, std::time::Duration::from_secs(grace_secs))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Restore { scope, all } => {
            setup::init_logging("warn");
            let cfg = setup::load_config(cli.config.as_deref())?;
            restore_cmd::run(&cfg, scope.as_deref(), all)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Import { dir, thread } => {
            setup::init_logging("warn");
            let cfg = setup::load_config(cli.config.as_deref())?;
            ops_cmd::import(&cfg, &dir, &thread)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Node { command } => run_node(cli.config.as_deref(), command),
        Command::Token { command } => {
            setup::init_logging("warn");
            let cfg = setup::load_config(cli.config.as_deref())?;
            match command {
                TokenCommand::Show { kind } => ops_cmd::token_show(&cfg, kind)?,
                TokenCommand::Rotate { kind } => ops_cmd::token_rotate(&cfg, kind)?,
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::ServiceStop { unit } => {
            setup::init_logging("info");
            service_stop::run(&unit)?;
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
