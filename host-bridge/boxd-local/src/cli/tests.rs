//! The command line against the argument lists boxd-local's callers produce.

use super::*;

fn p(s: &str) -> Res<Invocation> {
    match parse(&s.split_whitespace().map(String::from).collect::<Vec<_>>())? {
        Parsed::Run(inv) => Ok(inv),
        Parsed::Print(_) => Err(Fail::new("printed")),
    }
}

#[test]
fn aliases_normalise() {
    assert_eq!(p("ls").unwrap().verb, "machine list");
    assert_eq!(p("machine ls --json").unwrap().verb, "machine list");
    assert_eq!(p("--json info a").unwrap().verb, "machine get");
    assert_eq!(p("whoami").unwrap().verb, "auth");
    assert_eq!(p("auth --json").unwrap().verb, "auth");
    assert_eq!(p("env remove X").unwrap().verb, "env rm");
    assert_eq!(p("destroy a -y").unwrap().verb, "machine remove");
    assert!(p("machine rm a --confirm").unwrap().confirmed());
    assert_eq!(p("machine config set a auto-suspend.timeout 0").unwrap().args.len(), 3);
    let n = p("new --name=box").unwrap();
    assert_eq!((n.verb, n.value("--name")), ("machine new", Some("box")));
    let f = p("fork a --name=b --auto-hibernate-timeout 5").unwrap();
    assert_eq!((f.verb, f.value("--name"), f.value("--auto-hibernate-timeout")), ("machine fork", Some("b"), Some("5")));
}

#[test]
fn globals_anywhere_but_not_after_dashdash() {
    let e = p("machine exec --org o vm --json -- echo --json").unwrap();
    assert!(e.global.json);
    assert_eq!(e.global.org.as_deref(), Some("o"));
    assert_eq!(e.command, vec!["echo", "--json"]);
    let e = p("exec vm ls -la").unwrap();
    assert_eq!(e.command, vec!["ls", "-la"]);
    let e = p("machine exec oc-w1 --timeout 60 -- sh -c 'x' sh status").unwrap();
    assert_eq!((e.value("--timeout"), e.command.len()), (Some("60"), 5));
    let e = p("machine exec a -e K=V --env L=W -t -- true").unwrap();
    assert_eq!((e.values("-e"), e.has("-t")), (vec!["K=V", "L=W"], true));
}

/// The argument lists the component's boxd adapter and golden build produce
/// (host-bridge/policy.json grants), parsed as the plugin means them.
#[test]
fn the_plugins_argument_lists_parse() {
    let v = |argv: &[&str]| match parse(&argv.iter().map(|a| a.to_string()).collect::<Vec<_>>()) {
        Ok(Parsed::Run(inv)) => inv,
        _ => panic!("{argv:?} parses"),
    };
    let inv = v(&["machine", "new", "oc-w1", "--from-snapshot", "opencode-golden", "--auto-hibernate-timeout", "3600", "--json"]);
    assert_eq!((inv.verb, inv.args.as_slice(), inv.value("--from-snapshot"), inv.global.json), ("machine new", &["oc-w1".to_string()][..], Some("opencode-golden"), true));
    let inv = v(&["machine", "fork", "oc-a", "oc-b", "--auto-hibernate-timeout", "60", "--json"]);
    assert_eq!((inv.verb, inv.args.len(), inv.value("--auto-hibernate-timeout")), ("machine fork", 2, Some("60")));
    let inv = v(&["machine", "exec", "oc-w1", "--timeout", "60", "--", "sh", "-c", "'python3 - \"$@\"'", "sh", "--json"]);
    assert_eq!((inv.verb, inv.global.json, inv.command.len()), ("machine exec", false, 5), "after -- everything is the command");
    let inv = v(&["machine", "remove", "oc-w1", "-y", "--json"]);
    assert!(inv.confirmed() && inv.global.json);
    assert_eq!(v(&["machine", "config", "set", "oc-w1", "auto-hibernate.timeout", "1800"]).args.len(), 3);
    assert_eq!(v(&["snapshots", "save", "golden-build-0a1b", "opencode-golden"]).args.len(), 2);
    for (argv, verb) in [
        (&["machine", "list", "--json"][..], "machine list"),
        (&["machine", "get", "oc-w1", "--json"], "machine get"),
        (&["machine", "hibernate", "oc-w1", "--json"], "machine hibernate"),
        (&["machine", "wake", "oc-w1", "--json"], "machine wake"),
        (&["machine", "resume", "oc-w1", "--json"], "machine resume"),
        (&["machine", "start", "oc-w1", "--json"], "machine start"),
        (&["snapshots", "list", "--json"], "snapshots list"),
        (&["env", "list", "--json"], "env list"),
    ] {
        assert_eq!(v(argv).verb, verb);
    }
}

#[test]
fn usage_errors_have_an_error_and_a_hint() {
    for bad in ["machine new a --bogus", "machine get", "machine get a b", "machine exec a", "frobnicate", "machine", "--version", ""] {
        let f = p(bad).unwrap_err();
        assert!(f.hint.as_deref().is_some_and(|h| h.starts_with("hint: ")) && f.code == 1, "{bad}: {f:?}");
        assert!(!f.message.contains('\n'), "{bad}: {f:?}");
    }
    assert!(p("machine lst").unwrap_err().hint.unwrap().contains("list"), "a typo gets a suggestion");
}

#[test]
fn help_and_completions_print() {
    for ask in ["--help", "machine --help", "machine exec --help", "help machine new", "completions bash"] {
        let argv: Vec<String> = ask.split_whitespace().map(String::from).collect();
        assert!(matches!(parse(&argv), Ok(Parsed::Print(t)) if !t.is_empty()), "{ask} prints");
    }
}
