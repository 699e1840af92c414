//! What one call touched: every spawn (arguments with secrets masked, never stdin) and
//! every path opened with its mode. The runtime owns the trace (each store carries one);
//! `audit` only reads it. The filesystem functions that reach a path are shadowed here so
//! each is recorded; a plain read is opened by read_open.rs, everything else by
//! wasmtime-wasi (cap-std).

use anyhow::Result;
use serde::Serialize;
use wasmtime::component::{Linker, Resource};
use wasmtime::StoreContextMut;
use wasmtime_wasi::p2::bindings::filesystem::types::ErrorCode;
use wasmtime_wasi::p2::bindings::sync::filesystem::types::{self as fs, HostDescriptor};

use super::HostState;

#[derive(Clone, Debug, Default, Serialize)]
pub struct SpawnRecord {
    pub program: String,
    pub args: Vec<String>,
    /// The grant the call matched ("boxd machine-get"); none when it was refused. The
    /// host's own calls (the tour's `boxd env set`) name themselves, as `host: …`.
    pub grant: Option<String>,
    pub exit_code: Option<i32>,
    /// exited, not-allowed, not-found, timed-out or failed.
    pub outcome: String,
    pub duration_ms: u64,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct PathRecord {
    pub path: String,
    /// read, write, create, dir, mkdir, rename, link, unlink; stream-in / stream-out for a file
    /// the host streamed for a spawn, mode-from for the file whose mode a stream-out file
    /// takes (runtime/frames.rs).
    pub mode: String,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Trace {
    pub spawns: Vec<SpawnRecord>,
    pub paths: Vec<PathRecord>,
}

/// Mask values that look like credentials; the component never puts secrets in argv,
/// and this keeps a mistake out of the log all the same.
pub fn mask_args(args: &[String]) -> Vec<String> {
    let secret_key = |k: &str| {
        let k = k.to_ascii_uppercase();
        ["TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD"].iter().any(|s| k.contains(s))
    };
    let mut out = Vec::with_capacity(args.len());
    let mut mask_next = false;
    for a in args {
        if mask_next {
            out.push("***".to_string());
            mask_next = false;
            continue;
        }
        if a == "--token" || a == "--password" {
            mask_next = true;
            out.push(a.clone());
        } else if a.starts_with("bxd_") || a.starts_with("bxds_") {
            out.push("***".into());
        } else if let Some((k, _)) = a.split_once('=').filter(|(k, _)| secret_key(k)) {
            out.push(format!("{k}=***"));
        } else {
            out.push(a.clone());
        }
    }
    out
}

/// Shadow the filesystem functions that reach a path, so each is recorded before
/// wasmtime-wasi (cap-std) performs or refuses it.
pub fn trace_filesystem(linker: &mut Linker<HostState>) -> Result<()> {
    linker.allow_shadowing(true);
    {
        let mut pre = linker.instance("wasi:filesystem/preopens@0.2.12")?;
        pre.func_wrap("get-directories", |mut store: StoreContextMut<'_, HostState>, (): ()| {
            let dirs = wasmtime_wasi::p2::bindings::filesystem::preopens::Host::get_directories(&mut store.data_mut().fs_view())?;
            for (d, name) in &dirs {
                store.data_mut().remember_preopen(d.rep(), name.clone());
            }
            Ok((dirs,))
        })?;
    }
    let mut types = linker.instance("wasi:filesystem/types@0.2.12")?;
    types.func_wrap(
        "[method]descriptor.open-at",
        |mut store: StoreContextMut<'_, HostState>, (fd, pf, path, of, df): (Resource<fs::Descriptor>, fs::PathFlags, String, fs::OpenFlags, fs::DescriptorFlags)| {
            let base = fd.rep();
            let refused = |t: fs::DescriptorType| format!("open (refused: {t:?} is not a regular file or a folder)");
            #[cfg(target_os = "linux")]
            if pf == fs::PathFlags::empty() && of == fs::OpenFlags::empty() && df == fs::DescriptorFlags::READ {
                use super::read_open::{open_to_read, Opened};
                match open_to_read(store.data_mut(), base, &path) {
                    Opened::Yes(new, regular) => {
                        store.data_mut().record_open(base, Some(new.rep()), &path, "read");
                        if regular {
                            store.data_mut().regular.insert(new.rep());
                        }
                        return Ok((Ok(new),));
                    }
                    Opened::NoEntry => {
                        let e = ErrorCode::NoEntry;
                        store.data_mut().record_open(base, None, &path, &format!("read (refused: {e:?})"));
                        return Ok((Err(e),));
                    }
                    Opened::Refused(t) => {
                        store.data_mut().record_open(base, None, &path, &refused(t));
                        return Ok((Err(ErrorCode::Access),));
                    }
                    Opened::General => {}
                }
            }
            // Only regular files and folders are opened: opening a FIFO blocks until a
            // writer comes, a device may never end, a socket cannot be opened. Look first
            // (without opening, confined like the open) and refuse with `access`.
            let look = HostDescriptor::stat_at(&mut store.data_mut().fs_view(), Resource::new_borrow(base), pf, path.clone());
            if let Ok(st) = look {
                if !matches!(st.type_, fs::DescriptorType::RegularFile | fs::DescriptorType::Directory | fs::DescriptorType::SymbolicLink) {
                    store.data_mut().record_open(base, None, &path, &refused(st.type_));
                    return Ok((Err(ErrorCode::Access),));
                }
            }
            let r = HostDescriptor::open_at(&mut store.data_mut().fs_view(), fd, pf, path.clone(), of, df);
            let mode = if of.contains(fs::OpenFlags::CREATE) {
                "create"
            } else if of.contains(fs::OpenFlags::DIRECTORY) {
                "dir"
            } else if df.contains(fs::DescriptorFlags::WRITE) {
                "write"
            } else {
                "read"
            };
            let r = split(r)?;
            match &r {
                Ok(new) => store.data_mut().record_open(base, Some(new.rep()), &path, mode),
                Err(e) => store.data_mut().record_open(base, None, &path, &format!("{mode} (refused: {e:?})")),
            }
            // A file created in the ledger is owner-only (it may be a work's server password):
            // WASI cannot set modes, so the host does, on the open descriptor, before the
            // component has written a byte to it. Files created elsewhere (a harvest into the
            // project) keep the usual mode.
            if let Ok(new) = &r {
                if of.contains(fs::OpenFlags::CREATE) {
                    owner_only_in_ledger(store.data_mut(), new.rep());
                }
            }
            Ok((r,))
        },
    )?;
    types.func_wrap("[method]descriptor.create-directory-at", |mut store: StoreContextMut<'_, HostState>, (fd, path): (Resource<fs::Descriptor>, String)| {
        store.data_mut().record_open(fd.rep(), None, &path, "mkdir");
        let r = HostDescriptor::create_directory_at(&mut store.data_mut().fs_view(), fd, path);
        Ok((split(r)?,))
    })?;
    types.func_wrap("[method]descriptor.unlink-file-at", |mut store: StoreContextMut<'_, HostState>, (fd, path): (Resource<fs::Descriptor>, String)| {
        store.data_mut().record_open(fd.rep(), None, &path, "unlink");
        let r = HostDescriptor::unlink_file_at(&mut store.data_mut().fs_view(), fd, path);
        Ok((split(r)?,))
    })?;
    types.func_wrap(
        "[method]descriptor.rename-at",
        |mut store: StoreContextMut<'_, HostState>, (fd, old, new_fd, new): (Resource<fs::Descriptor>, String, Resource<fs::Descriptor>, String)| {
            store.data_mut().record_open(fd.rep(), None, &old, "rename-from");
            store.data_mut().record_open(new_fd.rep(), None, &new, "rename-to");
            let n = store.data_mut().next_rename();
            store.data().kill_point(true, false, n);
            let r = HostDescriptor::rename_at(&mut store.data_mut().fs_view(), fd, old, new_fd, new);
            store.data().kill_point(false, false, n);
            Ok((split(r)?,))
        },
    )?;
    // A hard link places a harvested file only where nothing is (Files::place_new): a
    // committed write like a rename, so it is traced and counted as one for the kill points.
    types.func_wrap(
        "[method]descriptor.link-at",
        |mut store: StoreContextMut<'_, HostState>, (fd, flags, old, new_fd, new): (Resource<fs::Descriptor>, fs::PathFlags, String, Resource<fs::Descriptor>, String)| {
            store.data_mut().record_open(fd.rep(), None, &old, "link-from");
            store.data_mut().record_open(new_fd.rep(), None, &new, "link-to");
            let n = store.data_mut().next_rename();
            store.data().kill_point(true, false, n);
            let r = HostDescriptor::link_at(&mut store.data_mut().fs_view(), fd, flags, old, new_fd, new);
            store.data().kill_point(false, false, n);
            Ok((split(r)?,))
        },
    )?;
    #[cfg(target_os = "linux")]
    super::read_open::shadow_reads(&mut types)?;
    #[cfg(target_os = "linux")]
    super::listing::shadow_listing(&mut types)?;
    Ok(())
}

/// fchmod 0600 a file just created through descriptor `rep`, when it lies in the ledger.
fn owner_only_in_ledger(state: &mut HostState, rep: u32) {
    use std::os::unix::fs::PermissionsExt;
    let in_ledger = state.path_of(rep).is_some_and(|p| state.in_ledger(p));
    if !in_ledger {
        return;
    }
    if let Ok(wasmtime_wasi::filesystem::Descriptor::File(f)) = state.table().get(&Resource::<fs::Descriptor>::new_borrow(rep)) {
        let _ = f.file.set_permissions(std::fs::Permissions::from_mode(0o600));
    }
}

/// A filesystem result as the guest sees it: the error code, or a trap for a host bug.
pub(super) fn split<T, E>(r: Result<T, wasmtime_wasi::TrappableError<E>>) -> wasmtime::Result<Result<T, E>>
where
    E: std::error::Error + Send + Sync + 'static,
{
    match r {
        Ok(v) => Ok(Ok(v)),
        Err(e) => Ok(Err(e.downcast()?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_masked() {
        let args: Vec<String> = ["machine", "exec", "-e", "API_KEY=abc", "--token", "t0k", "bxd_123", "plain=1"].iter().map(|s| s.to_string()).collect();
        assert_eq!(mask_args(&args), ["machine", "exec", "-e", "API_KEY=***", "--token", "***", "***", "plain=1"]);
    }
}
