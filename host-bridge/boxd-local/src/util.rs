//! Small shared helpers: the wall clock, random hex from /dev/urandom, atomic file writes,
//! human-readable sizes and second counts.

use crate::fail::{Fail, Res};
use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// `bytes` random bytes as lowercase hex (machine ids, user ids, secret placeholders).
pub fn random_hex(bytes: usize) -> Res<String> {
    let mut buf = vec![0u8; bytes];
    File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(|e| Fail::io("reading /dev/urandom", e))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// Write a whole file so readers see the old or the new content, never a torn one:
/// temp file in the same folder, fsync, rename, fsync the folder.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Res<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Fail::io(format!("writing {}", path.display()), e)
    })
}

/// Sizes the way `snapshots list` shows them: `512B`, `4.0K`, `24.3G`.
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["K", "M", "G", "T", "P"];
    if bytes < 1024 {
        return format!("{bytes}B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1}{}", UNITS[unit])
}

/// `get` shows idle bounds as `"300s"`, or `"off"` when zero.
pub fn secs_or_off(secs: u64) -> String {
    if secs == 0 { "off".to_string() } else { format!("{secs}s") }
}

/// A seconds value from the command line: `300` or `300s`.
pub fn parse_secs(what: &str, raw: &str) -> Res<u64> {
    raw.strip_suffix('s').unwrap_or(raw).parse::<u64>().map_err(|_| {
        Fail::usage(
            format!("invalid value '{raw}' for '{what}': expected whole seconds"),
            "hint: give a number of seconds, e.g. 300 (0 turns the bound off)",
        )
    })
}

pub fn is_tty(fd: i32) -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(fd) == 1 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(human_size(0), "0B");
        assert_eq!(human_size(4096), "4.0K");
        assert_eq!(human_size(26_088_533_606), "24.3G");
    }

    #[test]
    fn seconds() {
        assert_eq!(parse_secs("x", "300").unwrap(), 300);
        assert_eq!(parse_secs("x", "15s").unwrap(), 15);
        assert!(parse_secs("x", "soon").is_err());
        assert_eq!(secs_or_off(0), "off");
        assert_eq!(secs_or_off(14400), "14400s");
    }
}
