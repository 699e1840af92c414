//! Help text beyond what clap derives from the commands. The first thing `--help` says is
//! what boxd-local is not: a VM.

pub const NOT_A_VM: &str = "\
THIS IS NOT A VM. A boxd-local machine is a folder (its home) plus the processes
started in it. They run as you, on this computer, with your files, your network
and your permissions: there is no isolation. Use it for first tries and tests,
never to contain code you do not trust. Snapshots and forks copy the home folder,
not memory or running processes.";

pub const NOT_A_VM_SHORT: &str = "boxd-local: not a VM — processes run as you on this computer (see 'boxd --help').";

pub const EXEC: &str = "\
The words after -- are joined with spaces into one command line and run by sh -c
in the machine home: quote shell metacharacters for the remote side.

boxd-local: not a VM — processes run as you on this computer (see 'boxd --help').";

pub const AFTER_TOP: &str = "\
Aliases: login, logout, whoami, new --name=N, list, ls, info, exec, cp,
  fork SRC --name=NEW, destroy, rm, pause, resume, reboot;
  machine ls, machine rm, env ls, env remove.

Environment:
  BOXD_LOCAL_HOME     state folder (default $XDG_DATA_HOME/boxd-local,
                      else ~/.local/share/boxd-local)
  BOXD_LOCAL_FAULTS   fault rules as JSON, on top of $BOXD_LOCAL_HOME/faults.json
  BOXD_LOCAL_NOISE=1  print the real CLI's update notice and stray stdout line
  BOXD_TOKEN          counts as signed in (so does --token)

Every invocation is logged to $BOXD_LOCAL_HOME/calls.jsonl. See docs/boxd-local.md.";
