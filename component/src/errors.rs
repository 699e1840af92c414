//! The one error type every tool returns: a documented code, what happened, and the one
//! next step. Each code's next step lives here, beside the code, so no tool invents its
//! own wording; docs/configuration.md lists the same table and a test keeps them equal.

use alloc::string::{String, ToString};

macro_rules! codes {
    ($($variant:ident = $code:literal => $next:literal;)*) => {
        /// Every error code the component can return.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Code { $($variant,)* }

        impl Code {
            pub const ALL: &'static [Code] = &[$(Code::$variant,)*];

            pub fn as_str(self) -> &'static str {
                match self { $(Code::$variant => $code,)* }
            }

            /// The code for its documented name (helpers on the guest report by name).
            pub fn parse(name: &str) -> Option<Code> {
                match name { $($code => Some(Code::$variant),)* _ => None }
            }

            /// The default next step; a tool may give a more specific one.
            pub fn next(self) -> &'static str {
                match self { $(Code::$variant => $next,)* }
            }
        }
    };
}

codes! {
    HostUntested = "HOST_UNTESTED" => "Run an OpenCode version inside the tested range that boxd_status shows, or set \"allowUntestedHost\": true in the plugin options.";
    OptionsInvalid = "OPTIONS_INVALID" => "Fix the named field in the plugin options, then restart the host.";
    StatusUnavailable = "STATUS_UNAVAILABLE" => "Restart the host, then run boxd_status again.";
    SkillsInvalid = "SKILLS_INVALID" => "Reinstall the plugin so skills/boxd/SKILL.md is present, then restart OpenCode.";
    NameInvalid = "NAME_INVALID" => "Use a short lowercase work id ([a-z0-9-], starting with a letter), a relative path inside the work tree with no '..', and a lowercase snapshot name.";
    NotOurs = "NOT_OURS" => "Call boxd_ensure for this work id, and act only on the machine the ledger records for it.";
    MachineGone = "MACHINE_GONE" => "Call boxd_resume for this work: it rebuilds the machine from the golden image and the proven transcript.";
    MachineStarting = "MACHINE_STARTING" => "Call boxd_status in a later turn; do not wait inside a call.";
    MachineShared = "MACHINE_SHARED" => "Recreate the machine without --shared: sharing deletes the guest's OpenCode sign-in.";
    MachineIsolated = "MACHINE_ISOLATED" => "Recreate the machine without --isolated, which drops git credentials and the in-VM boxd CLI.";
    SessionBusy = "SESSION_BUSY" => "Call boxd_job in a later turn until it reports idle, then harvest.";
    GuestVersion = "GUEST_VERSION" => "Boot the work from a golden image whose OpenCode is the same version as this laptop's (boxd-host golden).";
    PathRefused = "PATH_REFUSED" => "Use a regular file inside the project or a folder named in allowedRoots (no symlinks); to allow a folder, add it to allowedRoots and allow it with the external_directory rule.";
    FileTooLarge = "FILE_TOO_LARGE" => "Send files of at most 8 MiB each and 32 MiB per call; split the data or compress it.";
    FileConflict = "FILE_CONFLICT" => "The laptop file is not what this work last brought home there (another work's harvest or an edit wrote it; the message says which): move it aside or harvest to another folder with 'to', then harvest again.";
    GuestWorkspace = "GUEST_WORKSPACE" => "Boot the work from an image whose /home/boxd the boxd user can write, then call boxd_ensure again.";
    GuestRunFailed = "GUEST_RUN_FAILED" => "Read the transcript (boxd_harvest imports it), then boxd_submit again.";
    RunInterrupted = "RUN_INTERRUPTED" => "Harvest what exists with boxd_harvest, then boxd_submit the prompt again.";
    GuestAuthFailed = "GUEST_AUTH_FAILED" => "Fix the guest's model credential (boxd env, as docs/golden-image.md describes), then boxd_submit again.";
    GuestFailed = "GUEST_FAILED" => "Call boxd_status; if the guest keeps failing, rebuild the machine with boxd_resume.";
    GuestUnresponsive = "GUEST_UNRESPONSIVE" => "Tell the user: the machine is short of memory or overloaded (the message names the largest processes); waiting a turn will not help.";
    GuestServerDown = "GUEST_SERVER_DOWN" => "Call boxd_job in a later turn: it starts the guest's OpenCode server again.";
    GuestStateLost = "GUEST_STATE_LOST" => "Call boxd_ensure for this work (boxd_resume if it sleeps): it prepares the work on its machine again and finds its OpenCode session, so it harvests as before; prompts that had not started when the state went do not run: submit them again.";
    BoxdFailed = "BOXD_FAILED" => "Read the boxd CLI's own message above, then run boxd_status before trying again.";
    BoxdMissing = "BOXD_MISSING" => "Install the boxd CLI on this laptop, sign in with 'boxd auth login', and restart the host so it is on the PATH.";
    Timeout = "TIMEOUT" => "Call boxd_status in a later turn instead; do not retry inside the same call.";
    NotProven = "NOT_PROVEN" => "Call boxd_harvest for this work first: it imports and proves the transcript on this laptop.";
    Dirty = "DIRTY" => "Call boxd_harvest, which stores the uncommitted changes as a patch in the ledger, then drop.";
    ExportInvalid = "EXPORT_INVALID" => "Call boxd_harvest again once boxd_job reports idle; never substitute a transcript.";
    ParentMissing = "PARENT_MISSING" => "Call boxd_harvest again: it imports the whole session tree, parents first.";
    SnapshotExists = "SNAPSHOT_EXISTS" => "Pick a new snapshot name: snapshots are immutable.";
    GoldenFailed = "GOLDEN_FAILED" => "Read the build's message above (the download URL, the architecture, boxd env), fix it and build again: the build machine was removed and no snapshot was saved.";
    SnapshotMissing = "SNAPSHOT_MISSING" => "Build the golden image (boxd-host golden, see docs/golden-image.md), then set the snapshot option to its name.";
    LedgerFailed = "LEDGER_FAILED" => "Check that the ledger folder is writable, then restart the host.";
    RulesNotAdded = "RULES_NOT_ADDED" => "Restart OpenCode, then run /boxd-status: a machine change may otherwise run without asking.";
    Untracked = "UNTRACKED" => "Commit or delete the named paths on the machine (or harvest them with files), harvest again, then drop; or boxd_sleep, which keeps the disk.";
    GitUnknown = "GIT_UNKNOWN" => "Make the work tree a git repository on the machine and commit, harvest again, then drop; or boxd_sleep, which keeps the disk.";
    CreateUncertain = "CREATE_UNCERTAIN" => "Call boxd_status in a later turn: if the machine appears, boxd_ensure adopts it; if not, call boxd_ensure again.";
    ToolUnknown = "TOOL_UNKNOWN" => "Call one of the tools boxd_status lists (describe shows them all).";
    ArgsInvalid = "ARGS_INVALID" => "Fix the named argument to match the tool's JSON Schema, then call again.";
    AccessDenied = "ACCESS_DENIED" => "This plugin is set to access \"read-only\": set access to \"ask-changes\" or \"all\" in the plugin options to allow machine changes.";
    ApprovalRequired = "APPROVAL_REQUIRED" => "The plugin is set to access \"ask-changes\": the host must ask the user and pass the approval before this change runs.";
    OpencodeMissing = "OPENCODE_MISSING" => "Install OpenCode on this laptop (or give the host its path), then call boxd_harvest again.";
    ImportFailed = "IMPORT_FAILED" => "Read the laptop OpenCode's message above, fix it, then call boxd_harvest again; nothing was marked proven.";
    ProofFailed = "PROOF_FAILED" => "Call boxd_harvest again: the laptop's copy did not match the guest's, so nothing was marked proven.";
    MachineAsleep = "MACHINE_ASLEEP" => "Call boxd_resume for this work to wake its machine, then try again.";
    HostFailed = "HOST_FAILED" => "Restart the host; if it happens again, report it with the message.";
    WorkUnknown = "WORK_UNKNOWN" => "Call boxd_ensure with this work id first (boxd_status lists the works the ledger knows).";
    CapReached = "CAP_REACHED" => "Sleep (boxd_sleep) or drop (boxd_drop) one of the running works the message names, then call again.";
    CeilingReached = "CEILING_REACHED" => "Sleep the running works the message names, or raise the ceiling in the plugin options (a work over its workSpendCeiling wakes only then, for its harvest and drop).";
    QuotaReached = "QUOTA_REACHED" => "Sleep or drop machines on the boxd account (boxd_status lists this ledger's), or raise the account's quota with boxd, then call again.";
    LifetimeReached = "LIFETIME_REACHED" => "Harvest the work (boxd_harvest), then drop it (boxd_drop); start a new work for more prompts.";
    WorkConflict = "WORK_CONFLICT" => "Use a new work id, or call again with the spec the ledger records for this one (the message names it).";
}

/// A tool failure as every host shows it: `{error, message, next}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolError {
    pub code: Code,
    pub message: String,
    pub next: String,
}

impl ToolError {
    /// A failure with the code's own next step.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), next: code.next().to_string() }
    }

    /// A failure whose next step is more specific than the code's default.
    pub fn with_next(code: Code, message: impl Into<String>, next: impl Into<String>) -> Self {
        Self { code, message: message.into(), next: next.into() }
    }
}

pub type ToolResult<T> = Result<T, ToolError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_upper_snake_and_every_next_is_an_action() {
        let mut seen = alloc::collections::BTreeSet::new();
        for code in Code::ALL {
            let s = code.as_str();
            assert!(seen.insert(s), "duplicate code {s}");
            assert!(s.chars().all(|c| c.is_ascii_uppercase() || c == '_'), "{s}");
            assert!(code.next().len() > 20 && code.next().ends_with('.'), "{s}: {}", code.next());
        }
    }
}

#[cfg(test)]
mod docs_tests {
    use super::Code;

    /// docs/configuration.md lists every code with exactly its next step, and no other code.
    #[test]
    fn the_documented_table_matches_the_enum() {
        let doc = include_str!("../../docs/configuration.md");
        let rows: alloc::vec::Vec<&str> = doc.lines().filter(|l| l.starts_with("| `") && l.matches('|').count() == 4).collect();
        let documented: alloc::collections::BTreeSet<&str> = rows.iter().filter_map(|r| r.split('`').nth(1)).filter(|c| c.chars().all(|ch| ch.is_ascii_uppercase() || ch == '_')).collect();
        for code in Code::ALL {
            let row = rows.iter().find(|r| r.starts_with(&alloc::format!("| `{}` |", code.as_str())));
            let row = row.unwrap_or_else(|| panic!("{} is not documented in docs/configuration.md", code.as_str()));
            assert!(row.trim_end().ends_with(&alloc::format!("| {} |", code.next())), "{}: the documented next step differs from the enum", code.as_str());
        }
        let known: alloc::collections::BTreeSet<&str> = Code::ALL.iter().map(|c| c.as_str()).collect();
        let extra: alloc::vec::Vec<_> = documented.difference(&known).collect();
        assert!(extra.is_empty(), "documented codes the enum lacks: {extra:?}");
    }
}
