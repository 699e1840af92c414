//! Why a boxd call gave no answer (`Failure`), told apart from what the host says of the
//! files it streams, and the tool error each one is.

use alloc::format;
use alloc::string::String;

use crate::caps::{RunRequest, SpawnError};
use crate::errors::{Code, ToolError};

/// Why a boxd call did not give us an answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// No boxd CLI on this laptop (or only the in-VM one).
    Missing(String),
    SignedOut(String),
    /// Network or API unreachable; the CLI's own reason.
    Unreachable(String),
    /// The CLI says the machine does not exist.
    NotFound(String),
    Timeout(String),
    /// Anything else; the CLI's own message.
    Other(String),
    /// The host grants boxd but not these arguments: this component and the host's policy
    /// disagree, which no retry fixes.
    Refused(String),
    /// A laptop file the host was to stream on the exec's stdin did not reach the guest
    /// whole: the host refused it before starting boxd (`cannot be streamed`, or past a
    /// limit: a refusal starts no child), or cut its frame because it changed while it was
    /// sent (the guest refuses a cut frame before it admits anything). The host's words.
    Unsent(String),
    /// The files the host was to write on the laptop from the exec's stdout did not land:
    /// it refused a path before starting boxd, or could not create or write a file as the
    /// frames arrived (a folder changed after the tool checked it, or the laptop's disk is
    /// full: `full`). The host's words; a frame the guest damaged is not one (`Other`).
    Unreceived { full: bool, said: String },
    /// The files framed on the exec's stdout were not what the guest declared (a digest, a
    /// size, a frame too many or cut short): nothing of them was placed. The host's words.
    Misframed(String),
}

/// Files from the machine that are not what its helper declared: the helper, or what runs
/// before it there (PATH, ~/.local/bin), is not the one the plugin put there, or the bytes
/// were damaged on the way. Not the boxd CLI's failure, and boxd_status cannot tell.
pub fn misframed(why: &str) -> ToolError {
    ToolError::with_next(
        Code::GuestFailed,
        format!("the machine's answer did not carry the files as its helper declared them ({why}); nothing of them was placed on the laptop"),
        "Call the tool again once. If it fails the same way, the guest helper on the machine, or what runs before it there (its PATH, ~/.local/bin), was changed: look at the machine before you harvest or drop; nothing on the laptop changed.",
    )
}

/// What both hosts say of a file to stream that they refused before starting the child
/// (host-bridge/src/runtime/frames.rs, host-bridge/opencode/lib/frames.js).
pub const NOT_STREAMED: &str = "cannot be streamed";
/// What both hosts say of a file that changed while they streamed it: they withhold its
/// digest, so the guest refuses the cut frame and admits nothing.
pub const CHANGED: &str = "changed while it was sent";
/// How a refused file past a limit starts (both hosts).
const TOO_LARGE: &str = "FILE_TOO_LARGE: ";
/// How the error of an `Unsent` failure starts: only the laptop says it (a guest's
/// message starts with its machine's name), so a tool may take it as the host's word.
pub const UNSENT: &str = "the host did not deliver a file to the machine: ";

/// How the error of an `Unreceived` failure starts (the laptop's disk full, or a path
/// refused): only the laptop says it, so a tool may take it as the host's word.
pub const UNRECEIVED: &str = "the host could not write the files the machine sent onto the laptop: ";
pub const LAPTOP_FULL: &str = "the laptop's disk is full: ";
/// How both hosts start a failure in writing the frames of the exec's stdout
/// (host-bridge/src/spawn/mod.rs, host-bridge/opencode/lib/policy.js), and what they say
/// of a file they could not make, or of a path they refused before starting the child.
pub(super) const FRAMED_OUT: &str = "the files framed on its stdout: ";
const NOT_CREATED: &str = "cannot create ";
const NOT_RECEIVED: &str = "cannot be received";
/// What both hosts say of frames the guest sent other than it declared them (a digest, a
/// size, a frame too many or cut short): its doing, not the laptop's (`cannot write`,
/// `cannot sync`, a full disk) nor the CLI's.
pub(super) const MISFRAMED: [&str; 5] = ["files asked for", "has no size header", "ended after", "has no digest", "arrived damaged"];

/// A spawn failure that is the host's failure to land a file it writes from stdout:
/// `Some(full, said)`. A full disk is its own (what to free differs from what to mend).
pub(super) fn unreceived(request: &RunRequest, e: &SpawnError) -> Option<(bool, String)> {
    let SpawnError::Failed(m) = e else { return None };
    if request.stdout_files.is_empty() {
        return None;
    }
    let lower = m.to_ascii_lowercase();
    let full = ["no space left on device", "quota exceeded", "enospc", "edquot"].iter().any(|w| lower.contains(w));
    let refused = m.contains(NOT_STREAMED) || m.contains(NOT_RECEIVED) || m.contains(&format!("{FRAMED_OUT}{NOT_CREATED}"));
    (full || refused).then(|| (full, m.clone()))
}

/// A spawn failure that is the host's refusal of (or cut in) a file it streams on stdin.
pub(super) fn unsent(request: &RunRequest, e: &SpawnError) -> Option<String> {
    match e {
        SpawnError::Failed(m) if !request.stdin_files.is_empty() && (m.contains(NOT_STREAMED) || m.starts_with(TOO_LARGE) || m.contains(CHANGED)) => Some(m.clone()),
        _ => None,
    }
}

impl Failure {
    pub fn into_error(self) -> ToolError {
        match self {
            Failure::Missing(m) => ToolError::new(Code::BoxdMissing, m),
            Failure::SignedOut(m) => ToolError::with_next(
                Code::BoxdFailed,
                format!("the boxd CLI is not signed in: {m}"),
                "Run 'boxd auth login' on this laptop, then boxd_status.",
            ),
            Failure::Unreachable(m) => ToolError::new(Code::BoxdFailed, format!("boxd is not reachable: {m}")),
            Failure::NotFound(m) => ToolError::new(Code::MachineGone, m),
            Failure::Timeout(m) => ToolError::new(Code::Timeout, m),
            Failure::Other(m) => ToolError::new(Code::BoxdFailed, m),
            Failure::Refused(m) => ToolError::new(Code::HostFailed, format!("the host's policy refused a boxd call this plugin makes: {m}")),
            Failure::Unsent(m) => match m.strip_prefix(TOO_LARGE) {
                Some(rest) => ToolError::new(Code::FileTooLarge, format!("{UNSENT}{rest}")),
                None if m.contains(CHANGED) => ToolError::new(Code::PathRefused, format!("{UNSENT}{m}")),
                None => ToolError::new(Code::PathRefused, format!("{UNSENT}{m}; boxd was not run")),
            },
            Failure::Unreceived { full: true, said } => ToolError::new(Code::PathRefused, format!("{LAPTOP_FULL}{said}")),
            Failure::Unreceived { full: false, said } => ToolError::new(Code::PathRefused, format!("{UNRECEIVED}{said}")),
            Failure::Misframed(m) => misframed(&m),
        }
    }
}
