//! What a run is about to make, written down before it makes it, so a run that is killed
//! (SIGKILL, a crash, a lost terminal) leaves a note the next run can act on. Each run's
//! record is a file it holds locked while it runs: a record whose lock can be taken
//! belongs to a run that is over, and its names are ours to clean up.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use serde::{Deserialize, Serialize};

use super::checks::Names;

#[derive(Debug, Serialize, Deserialize)]
pub struct Doc {
    /// The boxd CLI the names were made with: another CLI cannot see them.
    pub boxd: PathBuf,
    pub names: Names,
    pub started_ms: u64,
}

/// This run's record, locked until it is dropped or `done`.
pub struct Record {
    path: PathBuf,
    _file: File,
}

/// `$XDG_STATE_HOME/opencode-boxd`, else `~/.local/state/opencode-boxd`.
pub fn dir() -> PathBuf {
    let var = |k: &str| std::env::var_os(k).map(PathBuf::from).filter(|p| p.is_absolute());
    let state = var("XDG_STATE_HOME").unwrap_or_else(|| var("HOME").unwrap_or_else(|| PathBuf::from("/")).join(".local/state"));
    state.join("opencode-boxd")
}

pub fn open(dir: &Path, doc: &Doc) -> Result<Record> {
    fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let path = dir.join(format!("{}.json", doc.names.machine));
    let mut file = OpenOptions::new().create_new(true).write(true).open(&path).with_context(|| format!("cannot create {}", path.display()))?;
    file.lock().with_context(|| format!("cannot lock {}", path.display()))?;
    file.write_all(serde_json::to_string_pretty(doc)?.as_bytes())?;
    file.sync_all()?;
    Ok(Record { path, _file: file })
}

impl Record {
    /// Everything is gone: forget the record.
    pub fn done(self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// A record left by a run that is over (its lock was free), held locked while it is dealt with.
pub struct Leftover {
    pub path: PathBuf,
    pub doc: Doc,
    _file: File,
}

impl Leftover {
    pub fn forget(self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// The records of runs that are over. A record that does not parse is named, not removed.
pub fn leftovers(dir: &Path) -> (Vec<Leftover>, Vec<String>) {
    let (mut found, mut unreadable) = (Vec::new(), Vec::new());
    let Ok(entries) = fs::read_dir(dir) else { return (found, unreadable) };
    for entry in entries.flatten() {
        let path = entry.path();
        let is_record = path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("live-check-") && n.ends_with(".json"));
        if !is_record {
            continue;
        }
        let Ok(file) = File::open(&path) else { continue };
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => continue, // a run still going
            Err(TryLockError::Error(_)) => continue,
        }
        let bytes = fs::read(&path).unwrap_or_default();
        if bytes.is_empty() {
            continue; // a run that has just created it and not yet written it
        }
        match serde_json::from_slice::<Doc>(&bytes) {
            Ok(doc) => found.push(Leftover { path, doc, _file: file }),
            Err(_) => unreadable.push(path.display().to_string()),
        }
    }
    (found, unreadable)
}
