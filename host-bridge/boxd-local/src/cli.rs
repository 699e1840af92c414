//! The command line, parsed by clap: the boxd 0.2.x noun-verb commands, their flat
//! aliases (`ls` → `machine list`), global flags anywhere before `--`, help for every
//! command, suggestions for typos, and shell completions (`boxd-local completions bash`).
//! The result is an `Invocation`: the canonical verb plus its arguments and flags, which
//! the commands read. Usage errors keep the boxd dialect: one `error:` line, one `hint:`
//! line, exit 1. Parsing only: nothing here touches state.

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::fail::{Fail, Res};
use crate::help;

#[derive(Default, Debug, Clone, Args)]
pub struct Global {
    /// Print JSON
    #[arg(long, global = true)]
    pub json: bool,
    /// Organisation (only echoed by `auth`)
    #[arg(long, global = true, value_name = "O")]
    pub org: Option<String>,
    /// API URL (accepted, unused)
    #[arg(long = "api-url", global = true, value_name = "U")]
    pub api_url: Option<String>,
    /// Token: counts as signed in (as env BOXD_TOKEN does)
    #[arg(long, global = true, value_name = "T")]
    pub token: Option<String>,
}

#[derive(Debug)]
pub struct Invocation {
    /// Canonical verb, e.g. `machine list`.
    pub verb: &'static str,
    pub args: Vec<String>,
    /// (flag as the docs spell it, value)
    pub flags: Vec<(&'static str, Option<String>)>,
    /// exec: the command words, joined later into one `sh -c` line.
    pub command: Vec<String>,
    pub global: Global,
}

impl Invocation {
    pub fn has(&self, flag: &str) -> bool {
        self.flags.iter().any(|(f, _)| *f == flag)
    }

    pub fn value(&self, flag: &str) -> Option<&str> {
        self.flags.iter().rev().find(|(f, _)| *f == flag).and_then(|(_, v)| v.as_deref())
    }

    pub fn values(&self, flag: &str) -> Vec<&str> {
        self.flags.iter().filter(|(f, _)| *f == flag).filter_map(|(_, v)| v.as_deref()).collect()
    }

    pub fn confirmed(&self) -> bool {
        self.has("-y")
    }

    /// The machine this invocation names, for fault rules (`machine` filter, lose_machine).
    pub fn target_machine(&self) -> Option<String> {
        match self.verb {
            "machine new" => self.value("--name").map(str::to_string).or_else(|| self.args.first().cloned()),
            "machine cp" => self
                .args
                .iter()
                .find_map(|a| crate::copy::split_remote(a).map(|(vm, _)| vm.to_string())),
            v if v.starts_with("machine ") || v == "snapshots save" => self.args.first().cloned(),
            _ => None,
        }
    }
}

/// What the command line asks for: a command, or text to print (help, completions).
pub enum Parsed {
    Run(Invocation),
    Print(String),
}

#[derive(Debug, Parser)]
#[command(
    name = "boxd",
    bin_name = "boxd",
    about = "boxd-local 0.2.20-local — a boxd-compatible CLI whose \"machines\" live on this computer",
    before_help = help::NOT_A_VM,
    after_help = help::AFTER_TOP,
    disable_version_flag = true,
    subcommand_required = true,
    args_override_self = true,
    max_term_width = 100
)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Top,
}

#[derive(Debug, Subcommand)]
enum Top {
    /// Show who is signed in; `auth login` / `auth logout`
    Auth {
        #[command(subcommand)]
        action: Option<AuthAction>,
    },
    /// Print the version
    Version,
    /// Machines: new, list, get, exec, cp, remove, power, fork, config
    #[command(subcommand, after_help = help::NOT_A_VM_SHORT)]
    Machine(MachineCmd),
    /// Snapshots of a machine's home
    #[command(subcommand, after_help = help::NOT_A_VM_SHORT)]
    Snapshots(SnapshotsCmd),
    /// Account env vars, given to every exec session
    #[command(subcommand)]
    Env(EnvCmd),
    /// Print a shell completion script (boxd-local only)
    Completions {
        shell: clap_complete::Shell,
    },
    // The flat aliases of boxd CLI 0.2.x: hidden, listed in the top help's after_help.
    #[command(hide = true)]
    Login,
    #[command(hide = true)]
    Logout,
    #[command(hide = true)]
    Whoami,
    #[command(hide = true)]
    New(NewArgs),
    #[command(hide = true, alias = "ls")]
    List,
    #[command(hide = true)]
    Info(Named),
    #[command(hide = true)]
    Exec(ExecArgs),
    #[command(hide = true)]
    Cp(CpArgs),
    #[command(hide = true, alias = "destroy")]
    Rm(RemoveArgs),
    #[command(hide = true)]
    Pause(Named),
    #[command(hide = true)]
    Resume(Named),
    #[command(hide = true)]
    Reboot(Named),
    #[command(hide = true)]
    Fork(ForkArgs),
}

#[derive(Debug, Subcommand)]
enum AuthAction {
    /// Sign in (local: no account, no browser)
    Login,
    /// Sign out
    Logout,
}

#[derive(Debug, Subcommand)]
enum MachineCmd {
    /// Create a machine (a home folder here) and start it
    New(NewArgs),
    /// List machines, one per line
    #[command(visible_alias = "ls")]
    List,
    /// Show one machine
    Get(Named),
    /// Run CMD (words joined, run by sh -c) in the machine's home
    #[command(after_help = help::EXEC)]
    Exec(ExecArgs),
    /// Copy files; one side is VM:path, '-' is stdin/stdout
    Cp(CpArgs),
    /// Destroy a machine: kill its processes, delete its home
    #[command(visible_alias = "rm")]
    Remove(RemoveArgs),
    /// Start a stopped machine
    Start(Named),
    /// Power off: kill its processes, keep its home
    Stop(Named),
    /// Kill its processes and come back running
    Reboot(Named),
    /// Suspend to standby (processes stopped)
    Pause(Named),
    /// Resume from standby
    Resume(Named),
    /// Hibernate (processes stopped)
    Hibernate(Named),
    /// Wake a hibernated machine
    Wake(Named),
    /// Copy a machine's home and settings into a new machine
    Fork(ForkArgs),
    /// Change an idle bound (0 = off)
    #[command(subcommand)]
    Config(ConfigCmd),
}

#[derive(Debug, Subcommand)]
enum ConfigCmd {
    /// Set auto-suspend.timeout, auto-hibernate.timeout or auto-destroy.timeout (seconds)
    Set { name: String, key: String, secs: String },
}

#[derive(Debug, Subcommand)]
enum SnapshotsCmd {
    /// Save the machine's home as a new version of snapshot NAME
    Save { vm: String, name: String },
    /// List snapshots (latest version of each)
    List,
    /// Delete a snapshot and all its versions
    Remove(RemoveArgs),
}

#[derive(Debug, Subcommand)]
enum EnvCmd {
    /// Set an account env var for every exec session
    Set {
        name: String,
        value: String,
        /// A secret: listed as (sealed)
        #[arg(long)]
        secret: bool,
        /// shared, private or all
        #[arg(long)]
        scope: Option<String>,
        /// Domains a secret is substituted for (recorded only)
        #[arg(long)]
        domains: Option<String>,
    },
    /// List env vars (secrets sealed)
    #[command(visible_alias = "ls")]
    List,
    /// Remove an env var
    #[command(visible_alias = "remove")]
    Rm { name: String },
    /// Change an env var's scope
    Scope { name: String, scope: String },
}

#[derive(Debug, Args)]
struct Named {
    name: String,
}

#[derive(Debug, Args)]
struct Bounds {
    #[arg(long = "auto-suspend-timeout", value_name = "SECS")]
    suspend: Option<String>,
    #[arg(long = "auto-hibernate-timeout", value_name = "SECS")]
    hibernate: Option<String>,
    #[arg(long = "auto-destroy-timeout", value_name = "SECS")]
    destroy: Option<String>,
}

/// What `new` and `fork` both set: isolation, sharing, idle bounds.
#[derive(Debug, Args)]
struct Settings {
    /// Recorded and shown (isolated: yes)
    #[arg(long)]
    isolated: bool,
    /// Recorded and shown (sharing: shared)
    #[arg(long)]
    shared: bool,
    #[command(flatten)]
    bounds: Bounds,
}

#[derive(Debug, Args)]
struct NewArgs {
    name: Option<String>,
    /// The name (flat form: `new --name=N`)
    #[arg(long = "name", value_name = "NAME")]
    name_flag: Option<String>,
    /// Restore the snapshot's latest version
    #[arg(long = "from-snapshot", value_name = "S")]
    from_snapshot: Option<String>,
    #[command(flatten)]
    settings: Settings,
    /// 1, 2, 4 or 8 (recorded only)
    #[arg(long)]
    vcpu: Option<String>,
    /// Recorded only
    #[arg(long)]
    memory: Option<String>,
}

#[derive(Debug, Args)]
struct ForkArgs {
    src: String,
    new: Option<String>,
    /// The new machine's name (flat form: `fork SRC --name=NEW`)
    #[arg(long = "name", value_name = "NEW")]
    name_flag: Option<String>,
    #[command(flatten)]
    settings: Settings,
}

#[derive(Debug, Args)]
struct ExecArgs {
    name: String,
    /// K=V for this session (repeatable)
    #[arg(short = 'e', long = "env", value_name = "K=V")]
    env: Vec<String>,
    /// Seconds (fractions allowed); then exit 124
    #[arg(long, value_name = "SECS")]
    timeout: Option<String>,
    /// Merge stderr into stdout (there is no pty)
    #[arg(short = 't', long)]
    tty: bool,
    /// The command: the words after `--` (or after NAME), joined with spaces
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "CMD")]
    command: Vec<String>,
}

#[derive(Debug, Args)]
struct CpArgs {
    src: String,
    dst: String,
    /// Copy a folder
    #[arg(short = 'r', long)]
    recursive: bool,
}

#[derive(Debug, Args)]
struct RemoveArgs {
    name: String,
    /// Do not ask
    #[arg(short = 'y', long = "yes", visible_alias = "confirm")]
    yes: bool,
}

/// An invocation being built: the verb, then its arguments and flags in the docs' spelling.
struct Build(Invocation);

impl Build {
    fn new(verb: &'static str, global: Global) -> Build {
        Build(Invocation { verb, args: Vec::new(), flags: Vec::new(), command: Vec::new(), global })
    }
    fn arg(mut self, a: impl Into<Option<String>>) -> Build {
        self.0.args.extend(a.into());
        self
    }
    fn flag(mut self, name: &'static str, on: bool) -> Build {
        if on {
            self.0.flags.push((name, None));
        }
        self
    }
    fn value(mut self, name: &'static str, v: Option<String>) -> Build {
        if v.is_some() {
            self.0.flags.push((name, v));
        }
        self
    }
    fn settings(self, s: Settings) -> Build {
        self.flag("--isolated", s.isolated)
            .flag("--shared", s.shared)
            .value("--auto-suspend-timeout", s.bounds.suspend)
            .value("--auto-hibernate-timeout", s.bounds.hibernate)
            .value("--auto-destroy-timeout", s.bounds.destroy)
    }
}

fn new(g: Global, a: NewArgs) -> Build {
    Build::new("machine new", g)
        .arg(a.name)
        .value("--name", a.name_flag)
        .value("--from-snapshot", a.from_snapshot)
        .settings(a.settings)
        .value("--vcpu", a.vcpu)
        .value("--memory", a.memory)
}

fn fork(g: Global, a: ForkArgs) -> Build {
    Build::new("machine fork", g)
        .arg(a.src)
        .arg(a.new)
        .value("--name", a.name_flag)
        .settings(a.settings)
}

fn exec(g: Global, a: ExecArgs) -> Build {
    let mut b = Build::new("machine exec", g).arg(a.name).value("--timeout", a.timeout).flag("-t", a.tty);
    for pair in a.env {
        b = b.value("-e", Some(pair));
    }
    b.0.command = a.command;
    b
}

fn cp(g: Global, a: CpArgs) -> Build {
    Build::new("machine cp", g).arg(a.src).arg(a.dst).flag("--recursive", a.recursive)
}

fn remove(verb: &'static str, g: Global, a: RemoveArgs) -> Build {
    Build::new(verb, g).arg(a.name).flag("-y", a.yes)
}

fn named(verb: &'static str, g: Global, a: Named) -> Build {
    Build::new(verb, g).arg(a.name)
}

fn machine(g: Global, cmd: MachineCmd) -> Build {
    use MachineCmd as M;
    match cmd {
        M::New(a) => new(g, a),
        M::List => Build::new("machine list", g),
        M::Get(a) => named("machine get", g, a),
        M::Exec(a) => exec(g, a),
        M::Cp(a) => cp(g, a),
        M::Remove(a) => remove("machine remove", g, a),
        M::Start(a) => named("machine start", g, a),
        M::Stop(a) => named("machine stop", g, a),
        M::Reboot(a) => named("machine reboot", g, a),
        M::Pause(a) => named("machine pause", g, a),
        M::Resume(a) => named("machine resume", g, a),
        M::Hibernate(a) => named("machine hibernate", g, a),
        M::Wake(a) => named("machine wake", g, a),
        M::Fork(a) => fork(g, a),
        M::Config(ConfigCmd::Set { name, key, secs }) => Build::new("machine config set", g).arg(name).arg(key).arg(secs),
    }
}

fn invocation(cli: Cli) -> Build {
    let g = cli.global;
    match cli.command {
        Top::Auth { action: None } | Top::Whoami => Build::new("auth", g),
        Top::Auth { action: Some(AuthAction::Login) } | Top::Login => Build::new("auth login", g),
        Top::Auth { action: Some(AuthAction::Logout) } | Top::Logout => Build::new("auth logout", g),
        Top::Version => Build::new("version", g),
        Top::Machine(cmd) => machine(g, cmd),
        Top::Snapshots(SnapshotsCmd::Save { vm, name }) => Build::new("snapshots save", g).arg(vm).arg(name),
        Top::Snapshots(SnapshotsCmd::List) => Build::new("snapshots list", g),
        Top::Snapshots(SnapshotsCmd::Remove(a)) => remove("snapshots remove", g, a),
        Top::Env(EnvCmd::Set { name, value, secret, scope, domains }) => Build::new("env set", g)
            .arg(name)
            .arg(value)
            .flag("--secret", secret)
            .value("--scope", scope)
            .value("--domains", domains),
        Top::Env(EnvCmd::List) => Build::new("env list", g),
        Top::Env(EnvCmd::Rm { name }) => Build::new("env rm", g).arg(name),
        Top::Env(EnvCmd::Scope { name, scope }) => Build::new("env scope", g).arg(name).arg(scope),
        Top::Completions { .. } => unreachable!("answered by parse"),
        Top::New(a) => new(g, a),
        Top::List => Build::new("machine list", g),
        Top::Info(a) => named("machine get", g, a),
        Top::Exec(a) => exec(g, a),
        Top::Cp(a) => cp(g, a),
        Top::Rm(a) => remove("machine remove", g, a),
        Top::Pause(a) => named("machine pause", g, a),
        Top::Resume(a) => named("machine resume", g, a),
        Top::Reboot(a) => named("machine reboot", g, a),
        Top::Fork(a) => fork(g, a),
    }
}

/// The derived command, with the not-a-VM note on every machine and snapshots command's help.
fn command() -> clap::Command {
    fn note(noun: clap::Command) -> clap::Command {
        let verbs: Vec<String> = noun.get_subcommands().map(|v| v.get_name().to_string()).collect();
        verbs.iter().fold(noun, |noun, verb| {
            noun.mut_subcommand(verb, |v| if v.get_after_help().is_some() { v } else { v.after_help(help::NOT_A_VM_SHORT) })
        })
    }
    Cli::command().mut_subcommand("machine", note).mut_subcommand("snapshots", note)
}

pub fn parse(argv: &[String]) -> Res<Parsed> {
    if argv.iter().take_while(|a| *a != "--").any(|a| a == "--version") {
        // The real 0.2.x CLI rejects it too; `version` is the command.
        return Err(Fail::usage("unexpected argument '--version' found", "hint: use 'boxd version'"));
    }
    let matches = command().try_get_matches_from(std::iter::once("boxd").chain(argv.iter().map(String::as_str)));
    let cli = match matches.and_then(|m| Cli::from_arg_matches(&m)) {
        Ok(cli) => cli,
        Err(e) if matches!(e.kind(), clap::error::ErrorKind::DisplayHelp) => return Ok(Parsed::Print(e.render().to_string())),
        Err(e) => return Err(usage(e)),
    };
    if let Top::Completions { shell } = cli.command {
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut command(), "boxd-local", &mut script);
        return Ok(Parsed::Print(String::from_utf8_lossy(&script).into_owned()));
    }
    Ok(Parsed::Run(invocation(cli).0))
}

/// A clap usage error as the boxd dialect: one `error:` line (clap's message, with its
/// continuation lines) and one `hint:` line (clap's suggestion, else the usage and where
/// to read more).
fn usage(e: clap::Error) -> Fail {
    let text = e.render().to_string();
    let lines: Vec<&str> = text.lines().collect();
    let usage_line = lines.iter().find_map(|l| l.trim().strip_prefix("Usage: "));
    // The command path of the usage line ("boxd machine get"), without its arguments.
    let path = usage_line.map(|u| u.split_whitespace().take_while(|w| !w.starts_with(['[', '<', '-'])).collect::<Vec<_>>().join(" "));
    let path = path.unwrap_or_else(|| "boxd".to_string());
    if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        // clap would print the whole help; boxd says what is missing.
        let message = if path == "boxd" { "no command given".to_string() } else { format!("'{path}' needs a subcommand") };
        return Fail::usage(message, format!("hint: see '{path} --help' for the commands"));
    }
    let first = lines.first().copied().unwrap_or_default().trim_start_matches("error: ").to_string();
    let detail: Vec<&str> = lines.iter().skip(1).take_while(|l| !l.trim().is_empty()).map(|l| l.trim()).collect();
    let message = if detail.is_empty() { first } else { format!("{first} {}", detail.join(" ")) };
    // clap's "did you mean" tips help; its "to pass '--x' as a value, use '-- --x'" does not.
    let tip = lines.iter().filter_map(|l| l.trim().strip_prefix("tip: ")).find(|t| !t.starts_with("to pass"));
    let hint = match (tip, usage_line) {
        (Some(tip), _) => format!("hint: {tip}"),
        (None, Some(u)) => format!("hint: usage: {u} (see '{path} --help')"),
        (None, None) => "hint: see 'boxd --help'".to_string(),
    };
    Fail::usage(message, hint)
}

/// The hint for a usage mistake the commands find themselves (two names given).
pub fn usage_hint(verb: &str) -> String {
    format!("hint: see 'boxd {verb} --help'")
}

#[cfg(test)]
mod tests;
