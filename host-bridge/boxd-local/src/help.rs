//! Help text. The first thing it says is what boxd-local is not: a VM.

use crate::cli::{Invocation, NOUNS, SPECS, spec_of};
use crate::output::Out;

const NOT_A_VM: &str = "\
THIS IS NOT A VM. A boxd-local machine is a folder (its home) plus the processes
started in it. They run as you, on this computer, with your files, your network
and your permissions: there is no isolation. Use it for first tries and tests,
never to contain code you do not trust. Snapshots and forks copy the home folder,
not memory or running processes.";

const ENVIRONMENT: &str = "\
Environment:
  BOXD_LOCAL_HOME     state folder (default $XDG_DATA_HOME/boxd-local,
                      else ~/.local/share/boxd-local)
  BOXD_LOCAL_FAULTS   fault rules as JSON, on top of $BOXD_LOCAL_HOME/faults.json
  BOXD_LOCAL_NOISE=1  print the real CLI's update notice and stray stdout line
  BOXD_TOKEN          counts as signed in (so does --token)

Every invocation is logged to $BOXD_LOCAL_HOME/calls.jsonl. See docs/boxd-local.md.";

const ALIASES: &str = "\
Aliases: login, logout, whoami, new --name=N, list, ls, info, exec, cp,
  fork SRC --name=NEW, destroy, rm, pause, resume, reboot;
  machine ls, machine rm, env ls, env remove.";

pub fn print(inv: &Invocation, out: &Out) {
    let topic: Vec<&str> = inv.args.iter().map(String::as_str).collect();
    let text = if inv.verb != "help" {
        verb_help(inv.verb)
    } else if let Some(verb) = SPECS.iter().map(|s| s.verb).find(|v| *v == topic.join(" ")) {
        verb_help(verb)
    } else if let Some(noun) = topic.first().filter(|n| NOUNS.contains(n)) {
        let mut t = format!("boxd {noun} commands (boxd-local: not a VM, see 'boxd --help'):\n\n");
        for s in SPECS.iter().filter(|s| s.verb.split(' ').next() == Some(noun)) {
            t.push_str(&format!("  boxd {}\n      {}\n", s.usage, s.about));
        }
        t
    } else {
        top()
    };
    out.line(text.trim_end());
}

fn top() -> String {
    let mut t = String::from(
        "boxd-local 0.2.20-local — a boxd-compatible CLI whose \"machines\" live on this computer\n\n",
    );
    t.push_str(NOT_A_VM);
    t.push_str("\n\nUsage: boxd [--json] [--org O] [--api-url U] [--token T] COMMAND ...\n\nCommands:\n");
    for s in SPECS.iter().filter(|s| s.verb != "help") {
        t.push_str(&format!("  {:<20} {}\n", s.verb, s.about));
    }
    t.push('\n');
    t.push_str(ALIASES);
    t.push_str("\n\n");
    t.push_str(ENVIRONMENT);
    t
}

fn verb_help(verb: &str) -> String {
    let s = spec_of(verb);
    let mut t = format!("Usage: boxd {}\n\n{}.\n", s.usage, s.about);
    if verb.starts_with("machine ") || verb.starts_with("snapshots ") {
        t.push_str("\nboxd-local: not a VM — processes run as you on this computer (see 'boxd --help').\n");
    }
    if verb == "machine exec" {
        t.push_str(
            "\nThe words after -- are joined with spaces into one command line and run by sh -c\n\
             in the machine home: quote shell metacharacters for the remote side.\n",
        );
    }
    t
}
