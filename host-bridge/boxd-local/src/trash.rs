//! Deleting a machine's folder without making `machine remove` wait for it. A machine that
//! ran OpenCode holds its cache (thousands of files: the provider packages it installs),
//! and deleting them one by one took seconds while the caller waited and the state lock
//! was held. Instead the folder is renamed into `trash/` (one rename, same filesystem) and
//! a detached `boxd-local` empties the trash after the command has answered. A purge that
//! is killed leaves folders in `trash/`; the next one empties them too.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::fstree;
use crate::store::Home;

/// The argument that makes `boxd-local` empty the trash of `$BOXD_LOCAL_HOME` and nothing
/// else (main.rs checks it before any parsing; it is not a boxd command and not logged).
pub const PURGE_ARG: &str = "--purge-trash";

fn dir(home: &Home) -> PathBuf {
    home.path("trash")
}

/// Move `folder` into the trash, or delete it here when it cannot be moved. A missing
/// folder is fine.
pub fn discard(home: &Home, folder: &Path, id: &str) -> std::io::Result<()> {
    let trash = dir(home);
    std::fs::create_dir_all(&trash)?;
    match std::fs::rename(folder, trash.join(id)) {
        Ok(()) => {
            start_purge(home);
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(_) => fstree::remove_tree(folder),
    }
}

/// Start a detached purge: its own process group (no terminal signal reaches it), no
/// stdio (the caller's pipes close when this invocation exits), not waited for. If it
/// cannot start, the trash waits for the next one.
fn start_purge(home: &Home) {
    let Ok(me) = std::env::current_exe() else { return };
    let _ = Command::new(me)
        .arg(PURGE_ARG)
        .env("BOXD_LOCAL_HOME", home.path(""))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn();
}

/// Empty the trash (the detached process's whole job). The home is the one `start_purge`
/// named, found without `Home::locate`, which creates its folders: a purge that starts
/// after the user deleted the home (or while they delete it) must not bring it back.
pub fn purge() -> i32 {
    let Some(root) = std::env::var_os("BOXD_LOCAL_HOME").filter(|r| !r.is_empty()) else { return 1 };
    let Ok(entries) = std::fs::read_dir(Path::new(&root).join("trash")) else { return 0 };
    for entry in entries.flatten() {
        // Two purges may race on one folder: whatever one deleted, the other skips.
        let _ = fstree::remove_tree(&entry.path());
    }
    0
}
