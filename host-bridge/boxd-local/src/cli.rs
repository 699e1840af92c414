//! The command line: global flags anywhere (before `--`), verb aliases normalised to the
//! canonical noun-verb form (`ls` → `machine list`), per-verb flags and positional counts,
//! and usage errors that end with a hint. Parsing only: nothing here touches state.

use crate::fail::{Fail, Res};

#[derive(Default, Debug)]
pub struct Global {
    pub json: bool,
    pub org: Option<String>,
    pub api_url: Option<String>,
    pub token: Option<String>,
}

#[derive(Debug)]
pub struct Invocation {
    /// Canonical verb, e.g. `machine list`; `help` for help requests.
    pub verb: &'static str,
    pub args: Vec<String>,
    /// (flag as spelled in the spec, value)
    pub flags: Vec<(&'static str, Option<String>)>,
    /// exec: the command words, joined later into one `sh -c` line.
    pub command: Vec<String>,
    pub global: Global,
    /// `--help`/`-h` was given: `verb` says which help.
    pub help: bool,
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
        self.has("-y") || self.has("--yes") || self.has("--confirm")
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

pub struct Spec {
    pub verb: &'static str,
    /// Usage after `boxd `.
    pub usage: &'static str,
    pub about: &'static str,
    /// (flag, takes a value)
    pub flags: &'static [(&'static str, bool)],
    pub min: usize,
    pub max: usize,
}

const BOUNDS: [(&str, bool); 3] =
    [("--auto-suspend-timeout", true), ("--auto-hibernate-timeout", true), ("--auto-destroy-timeout", true)];
const NEW_FLAGS: &[(&str, bool)] = &[
    ("--name", true),
    ("--from-snapshot", true),
    ("--isolated", false),
    ("--shared", false),
    BOUNDS[0],
    BOUNDS[1],
    BOUNDS[2],
    ("--vcpu", true),
    ("--memory", true),
];
const FORK_FLAGS: &[(&str, bool)] =
    &[("--name", true), ("--isolated", false), ("--shared", false), BOUNDS[0], BOUNDS[1], BOUNDS[2]];
const CONFIRM: &[(&str, bool)] = &[("-y", false), ("--yes", false), ("--confirm", false)];

const fn spec(verb: &'static str, usage: &'static str, about: &'static str, min: usize, max: usize) -> Spec {
    Spec { verb, usage, about, flags: &[], min, max }
}

pub const SPECS: &[Spec] = &[
    spec("auth", "auth [--json]", "show who is signed in", 0, 0),
    spec("auth login", "auth login", "sign in (local: no account, no browser)", 0, 0),
    spec("auth logout", "auth logout", "sign out", 0, 0),
    spec("version", "version", "print the version", 0, 0),
    Spec { flags: NEW_FLAGS, ..spec("machine new", "machine new NAME [--from-snapshot S] [--isolated] [--shared] [--auto-suspend-timeout SECS] [--auto-hibernate-timeout SECS] [--auto-destroy-timeout SECS] [--vcpu N] [--memory M]", "create a machine (a home folder here) and start it", 0, 1) },
    spec("machine list", "machine list [--json]", "list machines, one per line", 0, 0),
    spec("machine get", "machine get NAME [--json]", "show one machine", 1, 1),
    Spec {
        flags: &[("-e", true), ("--env", true), ("--timeout", true), ("--tty", false), ("-t", false)],
        ..spec("machine exec", "machine exec NAME [-e K=V]... [--timeout SECS] [--tty] -- CMD...", "run CMD (words joined, run by sh -c) in the machine's home", 1, 1)
    },
    Spec { flags: &[("-r", false), ("--recursive", false)], ..spec("machine cp", "machine cp SRC DST [-r]", "copy files; one side is VM:path, '-' is stdin/stdout", 2, 2) },
    Spec { flags: CONFIRM, ..spec("machine remove", "machine remove NAME -y|--confirm", "destroy a machine: kill its processes, delete its home", 1, 1) },
    spec("machine start", "machine start NAME", "start a stopped machine", 1, 1),
    spec("machine stop", "machine stop NAME", "power off: kill its processes, keep its home", 1, 1),
    spec("machine reboot", "machine reboot NAME", "kill its processes and come back running", 1, 1),
    spec("machine pause", "machine pause NAME", "suspend to standby (processes stopped)", 1, 1),
    spec("machine resume", "machine resume NAME", "resume from standby", 1, 1),
    spec("machine hibernate", "machine hibernate NAME", "hibernate (processes stopped)", 1, 1),
    spec("machine wake", "machine wake NAME", "wake a hibernated machine", 1, 1),
    Spec { flags: FORK_FLAGS, ..spec("machine fork", "machine fork SRC [NEW] [--isolated] [--shared] [--auto-*-timeout SECS]", "copy a machine's home and settings into a new machine", 1, 2) },
    spec("machine config set", "machine config set NAME auto-suspend.timeout|auto-hibernate.timeout|auto-destroy.timeout SECS", "change an idle bound (0 = off)", 3, 3),
    spec("snapshots save", "snapshots save VM NAME", "save the machine's home as a new version of snapshot NAME", 2, 2),
    spec("snapshots list", "snapshots list [--json]", "list snapshots (latest version of each)", 0, 0),
    Spec { flags: CONFIRM, ..spec("snapshots remove", "snapshots remove NAME -y", "delete a snapshot and all its versions", 1, 1) },
    Spec { flags: &[("--secret", false), ("--scope", true), ("--domains", true)], ..spec("env set", "env set NAME VALUE [--secret] [--scope shared|private|all] [--domains D]", "set an account env var for every exec session", 2, 2) },
    spec("env list", "env list [--json]", "list env vars (secrets sealed)", 0, 0),
    spec("env rm", "env rm NAME", "remove an env var", 1, 1),
    spec("env scope", "env scope NAME shared|private|all", "change an env var's scope", 2, 2),
    spec("help", "help [COMMAND]", "show help", 0, 3),
];

/// Every accepted spelling, longest first where one is a prefix of another.
const ALIASES: &[(&[&str], &str)] = &[
    (&["machine", "config", "set"], "machine config set"),
    (&["auth", "login"], "auth login"),
    (&["auth", "logout"], "auth logout"),
    (&["auth"], "auth"),
    (&["login"], "auth login"),
    (&["logout"], "auth logout"),
    (&["whoami"], "auth"),
    (&["version"], "version"),
    (&["help"], "help"),
    (&["machine", "new"], "machine new"),
    (&["new"], "machine new"),
    (&["machine", "list"], "machine list"),
    (&["machine", "ls"], "machine list"),
    (&["list"], "machine list"),
    (&["ls"], "machine list"),
    (&["machine", "get"], "machine get"),
    (&["info"], "machine get"),
    (&["machine", "exec"], "machine exec"),
    (&["exec"], "machine exec"),
    (&["machine", "cp"], "machine cp"),
    (&["cp"], "machine cp"),
    (&["machine", "remove"], "machine remove"),
    (&["machine", "rm"], "machine remove"),
    (&["destroy"], "machine remove"),
    (&["rm"], "machine remove"),
    (&["machine", "start"], "machine start"),
    (&["machine", "stop"], "machine stop"),
    (&["machine", "reboot"], "machine reboot"),
    (&["reboot"], "machine reboot"),
    (&["machine", "pause"], "machine pause"),
    (&["pause"], "machine pause"),
    (&["machine", "resume"], "machine resume"),
    (&["resume"], "machine resume"),
    (&["machine", "hibernate"], "machine hibernate"),
    (&["machine", "wake"], "machine wake"),
    (&["machine", "fork"], "machine fork"),
    (&["fork"], "machine fork"),
    (&["snapshots", "save"], "snapshots save"),
    (&["snapshots", "list"], "snapshots list"),
    (&["snapshots", "remove"], "snapshots remove"),
    (&["env", "set"], "env set"),
    (&["env", "list"], "env list"),
    (&["env", "ls"], "env list"),
    (&["env", "rm"], "env rm"),
    (&["env", "remove"], "env rm"),
    (&["env", "scope"], "env scope"),
];

pub const NOUNS: &[&str] = &["machine", "auth", "snapshots", "env"];

pub fn spec_of(verb: &str) -> &'static Spec {
    SPECS.iter().find(|s| s.verb == verb).unwrap_or(&SPECS[SPECS.len() - 1])
}

const VALUE_GLOBALS: [&str; 3] = ["--org", "--api-url", "--token"];

/// How many tokens a global flag at `argv[i]` takes (0 = not a global flag).
fn global_width(argv: &[String], i: usize) -> usize {
    let a = argv[i].as_str();
    if a == "--json" || VALUE_GLOBALS.iter().any(|g| a.strip_prefix(g).is_some_and(|r| r.starts_with('='))) {
        1
    } else if VALUE_GLOBALS.contains(&a) {
        2
    } else {
        0
    }
}

fn take_global(argv: &[String], i: usize, g: &mut Global) -> Res<usize> {
    let width = global_width(argv, i);
    if width == 0 {
        return Ok(0);
    }
    let a = argv[i].as_str();
    if a == "--json" {
        g.json = true;
        return Ok(1);
    }
    let (name, value) = match a.split_once('=') {
        Some((n, v)) => (n, v.to_string()),
        None => match argv.get(i + 1) {
            Some(v) => (a, v.clone()),
            None => return Err(Fail::usage(format!("'{a}' needs a value"), "hint: see 'boxd --help'")),
        },
    };
    match name {
        "--org" => g.org = Some(value),
        "--api-url" => g.api_url = Some(value),
        _ => g.token = Some(value),
    }
    Ok(width)
}

fn hint_for(spec: &Spec) -> String {
    format!("hint: usage: boxd {} (see 'boxd {} --help')", spec.usage, spec.verb)
}

fn is_help(a: &str) -> bool {
    a == "-h" || a == "--help"
}

pub fn parse(argv: &[String]) -> Res<Invocation> {
    // 1. The verb words: leading non-flag tokens, skipping global and help flags.
    let mut words: Vec<usize> = Vec::new();
    let mut i = 0;
    while i < argv.len() && words.len() < 3 {
        let a = argv[i].as_str();
        if a == "--" {
            break;
        }
        let w = global_width(argv, i);
        if w > 0 {
            i += w;
            continue;
        }
        if is_help(a) {
            i += 1;
            continue;
        }
        if a.starts_with('-') {
            break;
        }
        words.push(i);
        i += 1;
    }
    let wanted_help = argv.iter().take_while(|a| *a != "--").any(|a| is_help(a));
    let (verb, used) = resolve(argv, &words, wanted_help)?;
    let spec = spec_of(verb);

    // 2. Everything else, in order.
    let mut inv = Invocation {
        verb,
        args: Vec::new(),
        flags: Vec::new(),
        command: Vec::new(),
        global: Global::default(),
        help: false,
    };
    let exec = verb == "machine exec";
    let mut i = 0;
    while i < argv.len() {
        if words[..used].contains(&i) {
            i += 1;
            continue;
        }
        let a = argv[i].as_str();
        if a == "--" {
            let rest = argv[i + 1..].iter().cloned();
            if exec { inv.command.extend(rest) } else { inv.args.extend(rest) }
            break;
        }
        let w = take_global(argv, i, &mut inv.global)?;
        if w > 0 {
            i += w;
            continue;
        }
        if is_help(a) {
            inv.help = true;
            i += 1;
            continue;
        }
        if a == "--version" {
            // The real 0.2.x CLI rejects it too; `version` is the command.
            return Err(Fail::usage("unexpected argument '--version' found", "hint: use 'boxd version'"));
        }
        if a.starts_with('-') && a.len() > 1 {
            let (name, inline) = match a.split_once('=') {
                Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
                _ => (a, None),
            };
            let Some(&(flag, takes)) = spec.flags.iter().find(|(f, _)| *f == name) else {
                return Err(Fail::usage(
                    format!("unexpected argument '{name}' for 'boxd {verb}'"),
                    hint_for(spec),
                ));
            };
            let value = if takes {
                match inline {
                    Some(v) => Some(v),
                    None => {
                        i += 1;
                        Some(argv.get(i).cloned().ok_or_else(|| {
                            Fail::usage(format!("'{name}' needs a value"), hint_for(spec))
                        })?)
                    }
                }
            } else if inline.is_some() {
                return Err(Fail::usage(format!("'{name}' takes no value"), hint_for(spec)));
            } else {
                None
            };
            inv.flags.push((flag, value));
            i += 1;
            continue;
        }
        // Without `--`, exec's command starts at the first word after NAME.
        if exec && inv.args.len() == 1 {
            inv.command.extend(argv[i..].iter().cloned());
            break;
        }
        inv.args.push(a.to_string());
        i += 1;
    }
    if inv.help {
        return Ok(inv);
    }
    if inv.args.len() < spec.min {
        return Err(Fail::usage(format!("missing arguments for 'boxd {verb}'"), hint_for(spec)));
    }
    if inv.args.len() > spec.max {
        return Err(Fail::usage(
            format!("unexpected argument '{}' for 'boxd {verb}'", inv.args[spec.max]),
            hint_for(spec),
        ));
    }
    if exec && inv.command.is_empty() {
        return Err(Fail::usage("missing command: nothing to run", hint_for(spec)));
    }
    Ok(inv)
}

/// The longest alias made of the leading words, and how many words it used.
fn resolve(argv: &[String], words: &[usize], wanted_help: bool) -> Res<(&'static str, usize)> {
    let ws: Vec<&str> = words.iter().map(|&k| argv[k].as_str()).collect();
    for n in (1..=ws.len()).rev() {
        if let Some((_, verb)) = ALIASES.iter().find(|(w, _)| *w == &ws[..n]) {
            return Ok((verb, n));
        }
    }
    let top = "hint: see 'boxd --help' for the commands";
    match ws.first() {
        None if wanted_help => Ok(("help", 0)),
        None => Err(Fail::usage("no command given", top)),
        // `boxd machine --help` shows the noun's commands.
        Some(noun) if NOUNS.contains(noun) && (wanted_help || ws.len() == 1) => {
            if wanted_help {
                Ok(("help", 0))
            } else {
                Err(Fail::usage(format!("'boxd {noun}' needs a subcommand"), format!("hint: see 'boxd {noun} --help'")))
            }
        }
        Some(noun) if NOUNS.contains(noun) => Err(Fail::usage(
            format!("unrecognized subcommand '{}' for 'boxd {noun}'", ws[1]),
            format!("hint: see 'boxd {noun} --help'"),
        )),
        Some(w) => Err(Fail::usage(format!("unrecognized subcommand '{w}'"), top)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Res<Invocation> {
        parse(&s.split_whitespace().map(String::from).collect::<Vec<_>>())
    }

    #[test]
    fn aliases_normalise() {
        assert_eq!(p("ls").unwrap().verb, "machine list");
        assert_eq!(p("machine ls --json").unwrap().verb, "machine list");
        assert_eq!(p("--json info a").unwrap().verb, "machine get");
        assert_eq!(p("whoami").unwrap().verb, "auth");
        assert_eq!(p("auth --json").unwrap().verb, "auth");
        assert_eq!(p("env remove X").unwrap().verb, "env rm");
        assert_eq!(p("machine config set a auto-suspend.timeout 0").unwrap().args.len(), 3);
        let n = p("new --name=box").unwrap();
        assert_eq!((n.verb, n.value("--name")), ("machine new", Some("box")));
    }

    #[test]
    fn globals_anywhere_but_not_after_dashdash() {
        let e = p("machine exec --org o vm --json -- echo --json").unwrap();
        assert!(e.global.json);
        assert_eq!(e.global.org.as_deref(), Some("o"));
        assert_eq!(e.command, vec!["echo", "--json"]);
        let e = p("exec vm ls -la").unwrap();
        assert_eq!(e.command, vec!["ls", "-la"]);
    }

    #[test]
    fn usage_errors() {
        assert!(p("machine new a --bogus").is_err());
        assert!(p("machine get").is_err());
        assert!(p("machine get a b").is_err());
        assert!(p("machine exec a").is_err());
        assert!(p("frobnicate").is_err());
        assert!(p("machine").is_err());
        assert!(p("--version").is_err());
        assert!(p("machine --help").unwrap().help);
    }
}
