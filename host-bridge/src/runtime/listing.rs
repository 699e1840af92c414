//! A folder's listing with each entry's type as the folder itself gives it (Linux).
//!
//! wasmtime-wasi's `read-directory` stats every entry for its type, one system call an
//! entry, and the component lists the works folder on every status call (500 statx at
//! 500 works). getdents already says each entry's type; only a filesystem that does not
//! (DT_UNKNOWN) is asked with a stat, as wasmtime-wasi asks. Everything else is as
//! wasmtime-wasi does it: the folder is read whole when the listing is made, in the
//! order the folder gives, "." and ".." left out, a name that is not UTF-8 an
//! `illegal-byte-sequence` at its place. The listing is a resource of this host's own,
//! so the stream's two other functions (next entry, drop) are shadowed with it.

use std::collections::VecDeque;
use std::ffi::CStr;
use std::os::fd::AsRawFd;

use wasmtime::component::{LinkerInstance, Resource, ResourceType};
use wasmtime::StoreContextMut;
use wasmtime_wasi::filesystem::Descriptor;
use wasmtime_wasi::p2::bindings::sync::filesystem::types::{self as fs, HostDescriptor, HostDirectoryEntryStream};
use wasmtime_wasi::p2::bindings::filesystem::types::ErrorCode;
use wasmtime_wasi::p2::ReaddirIterator;

use super::HostState;

/// The entries still to be handed out.
struct Listing(VecDeque<Result<fs::DirectoryEntry, ErrorCode>>);

pub(super) fn shadow_listing(types: &mut LinkerInstance<'_, HostState>) -> wasmtime::Result<()> {
    types.func_wrap("[method]descriptor.read-directory", |mut store: StoreContextMut<'_, HostState>, (fd,): (Resource<fs::Descriptor>,)| {
        let state = store.data_mut();
        let raw = match state.table().get(&fd) {
            Ok(Descriptor::Dir(d)) => Some(d.dir.as_raw_fd()),
            _ => None,
        };
        let Some(Ok(entries)) = raw.filter(|_| !super::read_open::general_only()).map(read_entries) else {
            // Not a folder, or a failure: wasmtime-wasi's own answer, word for word.
            let r = HostDescriptor::read_directory(&mut state.fs_view(), fd);
            return Ok((super::trace::split(r)?,));
        };
        let listing = state.table().push(Listing(entries))?;
        Ok((Ok(Resource::<ReaddirIterator>::new_own(listing.rep())),))
    })?;
    types.func_wrap(
        "[method]directory-entry-stream.read-directory-entry",
        |mut store: StoreContextMut<'_, HostState>, (stream,): (Resource<ReaddirIterator>,)| {
            let state = store.data_mut();
            if let Ok(Listing(entries)) = state.table().get_mut(&Resource::<Listing>::new_borrow(stream.rep())) {
                return Ok((entries.pop_front().transpose(),));
            }
            let r = HostDirectoryEntryStream::read_directory_entry(&mut state.fs_view(), stream);
            Ok((super::trace::split(r)?,))
        },
    )?;
    types.resource("directory-entry-stream", ResourceType::host::<ReaddirIterator>(), |mut store, rep| {
        let state = store.data_mut();
        // Looked at first: the table's delete removes an entry of another type too.
        if state.table().get(&Resource::<Listing>::new_borrow(rep)).is_ok() {
            state.table().delete(Resource::<Listing>::new_own(rep))?;
            return Ok(());
        }
        HostDirectoryEntryStream::drop(&mut state.fs_view(), Resource::new_own(rep))
    })?;
    Ok(())
}

/// Every entry of the folder open as `dir`, read through a descriptor of its own (so the
/// folder's own offset is not moved).
fn read_entries(dir: std::os::fd::RawFd) -> std::io::Result<VecDeque<Result<fs::DirectoryEntry, ErrorCode>>> {
    // SAFETY: openat on a descriptor the table holds open; "." names that folder.
    let fd = unsafe { libc::openat(dir, c".".as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fdopendir takes the new descriptor; closedir below closes both.
    let stream = unsafe { libc::fdopendir(fd) };
    if stream.is_null() {
        let e = std::io::Error::last_os_error();
        // SAFETY: fdopendir failed, so the descriptor is still ours to close.
        unsafe { libc::close(fd) };
        return Err(e);
    }
    let mut out = VecDeque::new();
    let result = loop {
        // SAFETY: errno is this thread's; readdir sets it only on failure.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: the stream is open until closedir below.
        let entry = unsafe { libc::readdir64(stream) };
        if entry.is_null() {
            let errno = std::io::Error::last_os_error();
            break if errno.raw_os_error() == Some(0) { Ok(out) } else { Err(errno) };
        }
        // SAFETY: readdir returned an entry that stays valid until the next readdir.
        let (name, d_type) = unsafe { (CStr::from_ptr((*entry).d_name.as_ptr()), (*entry).d_type) };
        let bytes = name.to_bytes();
        if bytes == b"." || bytes == b".." {
            continue;
        }
        let Ok(text) = std::str::from_utf8(bytes) else {
            out.push_back(Err(ErrorCode::IllegalByteSequence));
            continue;
        };
        let type_ = match d_type {
            libc::DT_UNKNOWN => stat_type(fd, name),
            t => Ok(of_d_type(t)),
        };
        out.push_back(type_.map(|type_| fs::DirectoryEntry { type_, name: text.to_string() }));
    };
    // SAFETY: the stream made above, closed once.
    unsafe { libc::closedir(stream) };
    result
}

/// The type as wasmtime-wasi names it: a FIFO and a socket are `unknown` there.
fn of_d_type(t: u8) -> fs::DescriptorType {
    match t {
        libc::DT_REG => fs::DescriptorType::RegularFile,
        libc::DT_DIR => fs::DescriptorType::Directory,
        libc::DT_LNK => fs::DescriptorType::SymbolicLink,
        libc::DT_CHR => fs::DescriptorType::CharacterDevice,
        libc::DT_BLK => fs::DescriptorType::BlockDevice,
        _ => fs::DescriptorType::Unknown,
    }
}

/// An entry's type from a stat of it (not followed), for a filesystem whose listing does
/// not say; a failure (the entry removed meanwhile) is that entry's error, as in
/// wasmtime-wasi.
fn stat_type(dir: std::os::fd::RawFd, name: &CStr) -> Result<fs::DescriptorType, ErrorCode> {
    // SAFETY: a zeroed stat is a valid out-parameter.
    let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
    // SAFETY: fstatat on an open folder and a name within it, writing into `st`.
    if unsafe { libc::fstatat64(dir, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) } != 0 {
        // wasmtime-wasi's own mapping of the error.
        return Err(wasmtime_wasi::p2::FsError::from(std::io::Error::last_os_error()).downcast().unwrap_or(ErrorCode::Io));
    }
    let t = match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => libc::DT_REG,
        libc::S_IFDIR => libc::DT_DIR,
        libc::S_IFLNK => libc::DT_LNK,
        libc::S_IFCHR => libc::DT_CHR,
        libc::S_IFBLK => libc::DT_BLK,
        _ => libc::DT_UNKNOWN,
    };
    Ok(of_d_type(t))
}
