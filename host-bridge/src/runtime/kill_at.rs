//! Test-only kill points (docs/architecture.md, "Kill points").

/// A test-only kill point: `BOXD_HOST_KILL_AT=before-spawn:N`, `after-spawn:N`,
/// `before-rename:N` or `after-rename:N` (N counts from 1 within one tool call) makes the
/// host SIGKILL itself at that point, as `kill -9` would. Never set it outside tests
/// (docs/architecture.md, "Kill points").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KillAt {
    pub before: bool,
    pub spawn: bool,
    pub n: u32,
}

impl KillAt {
    pub const VAR: &'static str = "BOXD_HOST_KILL_AT";

    pub fn parse(s: &str) -> Option<KillAt> {
        let (point, n) = s.trim().split_once(':')?;
        let n: u32 = n.parse().ok().filter(|n| *n >= 1)?;
        let (before, spawn) = match point {
            "before-spawn" => (true, true),
            "after-spawn" => (false, true),
            "before-rename" => (true, false),
            "after-rename" => (false, false),
            _ => return None,
        };
        Some(KillAt { before, spawn, n })
    }

    pub(super) fn from_env() -> Option<KillAt> {
        let v = std::env::var(Self::VAR).ok()?;
        match Self::parse(&v) {
            Some(k) => Some(k),
            None => {
                eprintln!("boxd-host: ignoring {}={v:?} (before-spawn:N, after-spawn:N, before-rename:N or after-rename:N)", Self::VAR);
                None
            }
        }
    }
}
