//! Opening a file to read in one confined step (Linux), for the component's most common
//! filesystem call: a ledger record or a project file opened to be read.
//!
//! wasmtime-wasi's own path takes five system calls and two path walks once the host's
//! guard against FIFOs is in front of it: the guard's look (an O_PATH open, a stat, a
//! close), then the open and wasmtime-wasi's stat of what it opened. Here it is one
//! `openat2` confined as wasmtime-wasi confines it (RESOLVE_BENEATH, no magic links, the
//! last component not followed), with O_NONBLOCK so a FIFO opens without waiting for a
//! writer, and one fstat of the open file: a regular file or a folder is handed to
//! wasmtime-wasi as its own descriptor; anything else is closed unread and refused with
//! `access`, as the guard refuses it. Status at 500 works makes 1,500 fewer system calls,
//! 1,000 of them path walks (measured: 15 → 12 ms a call).
//!
//! Every case that is not plain is left to the general path (guard, then wasmtime-wasi),
//! so its errors stay wasmtime-wasi's: any failure but a missing file, a kernel without
//! openat2, a base that is not a folder. The two calls that follow such an open
//! (`get-type`, `read`) are shadowed here too (`shadow_reads`).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use wasmtime::component::{LinkerInstance, Resource};
use wasmtime::StoreContextMut;
use wasmtime_wasi::filesystem::{Descriptor, Dir, File, OpenMode};
use wasmtime_wasi::p2::bindings::sync::filesystem::types::{self as fs, HostDescriptor};

use super::HostState;

/// Tests compare this path, and the shortcuts below and in listing.rs, with wasmtime-wasi's
/// own (runtime::general_paths_only).
pub(super) static GENERAL_ONLY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub(super) enum Opened {
    /// Opened: a regular file (true) or a folder.
    Yes(Resource<fs::Descriptor>, bool),
    NoEntry,
    /// Not a regular file or a folder: what it is, for the trace.
    Refused(fs::DescriptorType),
    /// Take the general path.
    General,
}

pub(super) fn general_only() -> bool {
    GENERAL_ONLY.load(std::sync::atomic::Ordering::Relaxed)
}

/// Open `path` under the folder descriptor `base` for reading, as wasmtime-wasi's open-at
/// with no flags but READ would.
pub(super) fn open_to_read(state: &mut HostState, base: u32, path: &str) -> Opened {
    if general_only() {
        return Opened::General;
    }
    let Ok(Descriptor::Dir(dir)) = state.table().get(&Resource::<fs::Descriptor>::new_borrow(base)) else {
        return Opened::General;
    };
    let perms = dir.perms;
    let Ok(cpath) = std::ffi::CString::new(path) else { return Opened::General };
    // O_NOCTTY: a terminal opened here never becomes the host's controlling one.
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_LARGEFILE;
    let file = match openat2(dir.dir.as_raw_fd(), &cpath, flags, libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS) {
        Ok(fd) => std::fs::File::from(fd),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Opened::NoEntry,
        Err(_) => return Opened::General,
    };
    let Ok(meta) = file.metadata() else { return Opened::General };
    // O_NONBLOCK off again: some files that stat as regular (a /proc or FUSE one) honour it.
    // SAFETY: fcntl on the descriptor just opened.
    if meta.is_file() && unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, libc::O_RDONLY | libc::O_LARGEFILE) } != 0 {
        return Opened::General;
    }
    let descriptor = if meta.is_file() {
        Descriptor::File(File::new(file, perms, OpenMode::READ, super::BLOCK_CURRENT_THREAD))
    } else if meta.is_dir() {
        Descriptor::Dir(Dir::new(file, perms, OpenMode::READ, super::BLOCK_CURRENT_THREAD))
    } else {
        use std::os::unix::fs::FileTypeExt;
        let t = meta.file_type();
        return Opened::Refused(if t.is_fifo() {
            fs::DescriptorType::Fifo
        } else if t.is_char_device() {
            fs::DescriptorType::CharacterDevice
        } else if t.is_block_device() {
            fs::DescriptorType::BlockDevice
        } else if t.is_socket() {
            fs::DescriptorType::Socket
        } else {
            fs::DescriptorType::Unknown
        });
    };
    match state.table().push(descriptor) {
        Ok(r) => Opened::Yes(r, meta.is_file()),
        Err(_) => Opened::General,
    }
}

/// openat2(2): `path` under the folder `dir`, resolved as `resolve` says. A created file
/// gets mode 0666 before the umask, as std's OpenOptions gives it.
pub(super) fn openat2(dir: std::os::fd::RawFd, path: &std::ffi::CStr, flags: i32, resolve: u64) -> std::io::Result<OwnedFd> {
    // SAFETY: open_how is plain integers; zero is "no flags".
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = flags as u64;
    if flags & libc::O_CREAT != 0 {
        how.mode = 0o666;
    }
    how.resolve = resolve;
    // SAFETY: openat2 reads the path and the open_how made above, with their size.
    let fd = unsafe { libc::syscall(libc::SYS_openat2, dir, path.as_ptr(), &how, std::mem::size_of::<libc::open_how>()) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: openat2 returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Two calls a file read makes, answered with fewer system calls and no extra trip into
/// the host (status reads every record: 1,000 fewer of each at 500 works):
/// - `get-type` of a file opened above is known (a file's type never changes): no fstat;
/// - a short `read` of a regular file says it reached the end when it did (the file's size
///   is where the read stopped, one fstat), so the component does not ask again only to be
///   told so. wasmtime-wasi says so only for a read that returns nothing. A file that grew
///   meanwhile, or whose size says nothing (/proc), reads on as before.
pub(super) fn shadow_reads(types: &mut LinkerInstance<'_, HostState>) -> wasmtime::Result<()> {
    types.func_wrap("[method]descriptor.get-type", |mut store: StoreContextMut<'_, HostState>, (fd,): (Resource<fs::Descriptor>,)| {
        if store.data().regular.contains(&fd.rep()) {
            return Ok((Ok(fs::DescriptorType::RegularFile),));
        }
        let r = HostDescriptor::get_type(&mut store.data_mut().fs_view(), fd);
        Ok((super::trace::split(r)?,))
    })?;
    types.func_wrap(
        "[method]descriptor.read",
        |mut store: StoreContextMut<'_, HostState>, (fd, len, offset): (Resource<fs::Descriptor>, fs::Filesize, fs::Filesize)| {
            let rep = fd.rep();
            let r = super::trace::split(HostDescriptor::read(&mut store.data_mut().fs_view(), fd, len, offset))?;
            Ok((r.map(|(bytes, end)| {
                let at_end = end || (!general_only() && !bytes.is_empty() && (bytes.len() as u64) < len && ends_at(store.data_mut(), rep, offset + bytes.len() as u64));
                (bytes, at_end)
            }),))
        },
    )?;
    Ok(())
}

/// Whether descriptor `rep` is a regular file whose size is exactly `at` now.
fn ends_at(state: &mut HostState, rep: u32, at: u64) -> bool {
    match state.table().get(&Resource::<fs::Descriptor>::new_borrow(rep)) {
        Ok(Descriptor::File(f)) => f.file.metadata().is_ok_and(|m| m.is_file() && m.len() == at),
        _ => false,
    }
}
