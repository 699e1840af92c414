//! The `boxd-host` command line, parsed and nothing else: what the user asked for, as
//! types. `session` turns the grants into a policy; `commands` runs the command.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// boxd-host: run the opencode-boxd component outside OpenCode (unofficial; not affiliated
/// with boxd).
#[derive(Debug, Parser)]
#[command(
    name = "boxd-host",
    version,
    about,
    // A flag given twice takes the last value, as a script that adds one expects.
    args_override_self = true,
    after_help = "exit codes: 0 ok, 1 the tool returned an error, 2 usage or host failure"
)]
pub struct Cli {
    #[command(flatten)]
    pub grants: Grants,
    #[command(subcommand)]
    pub command: Command,
}

/// What the component may reach, and where this host keeps its own records. Each flag is
/// one grant (deny by default); they may stand before or after the command.
#[derive(Clone, Debug, Default, Args)]
pub struct Grants {
    /// The component (default: the one built into this binary)
    #[arg(long, global = true, value_name = "PATH")]
    pub component: Option<PathBuf>,
    /// The project folder (default: the current directory)
    #[arg(long, global = true, value_name = "DIR")]
    pub project: Option<PathBuf>,
    /// The ledger folder (default: ~/.local/share/opencode-boxd)
    #[arg(long, global = true, value_name = "DIR")]
    pub ledger: Option<PathBuf>,
    /// The boxd CLI (default: boxd on PATH)
    #[arg(long, global = true, value_name = "PATH")]
    pub boxd: Option<PathBuf>,
    /// The laptop's opencode (default: opencode on PATH)
    #[arg(long, global = true, value_name = "PATH")]
    pub opencode: Option<PathBuf>,
    /// Another folder the plugin may read and write (repeatable)
    #[arg(long = "allow-root", global = true, value_name = "DIR")]
    pub allow_roots: Vec<PathBuf>,
    /// Plugin options, as in opencode.json (see docs/configuration.md)
    #[arg(long, global = true, value_name = "JSON")]
    pub options: Option<String>,
    /// Append one JSON line per call: the spawns and paths it touched
    #[arg(long = "audit-log", global = true, value_name = "FILE")]
    pub audit_log: Option<PathBuf>,
    /// Do not use the compiled-component cache
    #[arg(long = "no-cache", global = true)]
    pub no_cache: bool,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// The manifest (tools, schemas, read/change), as JSON
    Describe,
    /// One tool call; prints its JSON result. On a tool error prints {"error","message","next"} and exits 1
    Call {
        /// The tool's name (describe lists them)
        tool: String,
        /// The arguments as one JSON object; '-' reads them from stdin
        #[arg(default_value = "{}", allow_hyphen_values = true)]
        args: String,
    },
    /// What the plugin can touch: the component's imports and exports, the programs it may run, the folders it may open
    Audit {
        /// Print it as JSON
        #[arg(long)]
        json: bool,
    },
    /// Serve every tool over MCP on stdio (for Claude Code, Codex, …)
    Mcp,
    /// The whole product on boxd-local with a scripted model: golden image, ensure, submit (with a file), job, harvest, drop, audit
    Tour {
        /// Keep the tour's folders here (a new or empty folder), wired for OpenCode
        #[arg(long, value_name = "DIR")]
        keep: Option<PathBuf>,
        /// The plugin the kept project's OpenCode loads: a tarball from `npm pack`, a plugin
        /// folder, or an npm spec (default: opencode-boxd at this version, from npm)
        #[arg(long, value_name = "SPEC", requires = "keep")]
        plugin: Option<String>,
    },
    /// Build the golden image: a machine with this laptop's OpenCode, snapshotted
    Golden(GoldenArgs),
    /// Check the boxd behaviours the plugin relies on against this boxd CLI, with one throwaway machine (docs/live-check.md)
    LiveCheck(LiveCheckArgs),
}

#[derive(Clone, Debug, Args)]
#[command(after_help = "exit codes: 0 every check held or could not be made, 1 a check differs or something is left, 2 could not start, 130 interrupted")]
pub struct LiveCheckArgs {
    /// The snapshot the throwaway machine starts from (check 3)
    #[arg(long, default_value = "opencode-golden")]
    pub snapshot: String,
    /// Also run the sign-out check: signs this CLI out, then runs `boxd auth login`
    #[arg(long = "sign-out")]
    pub sign_out: bool,
    /// Seconds one boxd call may take (a snapshot save five times this)
    #[arg(long = "call-timeout", value_name = "S", default_value_t = 120)]
    pub call_timeout: u64,
    /// Print the contract as docs/live-check.md's table, and run nothing
    #[arg(long)]
    pub contract: bool,
}

#[derive(Clone, Debug, Args)]
pub struct GoldenArgs {
    /// The snapshot to save
    #[arg(long, default_value = "opencode-golden")]
    pub name: String,
    /// The OpenCode version to install (default: this laptop's `opencode --version`)
    #[arg(long = "opencode-version", value_name = "V")]
    pub opencode_version: Option<String>,
    /// The guest's opencode.json (keys as {env:NAME}, never literal)
    #[arg(long, value_name = "FILE", conflicts_with = "model")]
    pub config: Option<PathBuf>,
    /// Instead of --config: a minimal config with this model
    #[arg(long, value_name = "P/M")]
    pub model: Option<String>,
    /// A boxd env name the config reads; checked present, never read (repeatable)
    #[arg(long = "key-env", value_name = "NAME")]
    pub key_env: Vec<String>,
    /// The release URL ({version} and {target} filled in)
    #[arg(long, value_name = "TEMPLATE")]
    pub url: Option<String>,
    /// Download attempts
    #[arg(long)]
    pub attempts: Option<u32>,
    /// Seconds between attempts (growing: n × this)
    #[arg(long = "retry-delay", value_name = "S")]
    pub retry_delay: Option<u32>,
}
