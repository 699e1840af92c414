//! The only file that knows the WIT bindings: it exports `tools`, and implements the two
//! capability traits over the `spawn` import and wasi:filesystem preopens. No tool
//! logic here. Also the no_std runtime pieces a wasm32 cdylib needs (allocator, panic
//! handler, `cabi_realloc`, `memcmp`/`bcmp`).

use alloc::string::{String, ToString};
use alloc::vec::Vec;

use crate::caps::{Files, FsError, Kind, Meta, Programs, RunOutput, RunRequest, SpawnError, Streamed};

wit_bindgen::generate!({ world: "plugin", path: "../wit", generate_all });

use boxd::plugin::spawn;
use exports::boxd::plugin::operations;
use exports::boxd::plugin::tools::{Context, Guest as ToolsExport, ToolError};
use wasi::filesystem::preopens::get_directories;
use wasi::filesystem::types::{Descriptor, DescriptorFlags, DescriptorType, ErrorCode, OpenFlags, PathFlags};

struct Component;

impl ToolsExport for Component {
    fn describe() -> String {
        crate::describe()
    }

    fn call(tool: String, args_json: String, context: Context) -> Result<String, ToolError> {
        let raw = raw_context(context);
        let mut files = WitFiles::open(&raw.entropy);
        answer(crate::call(&mut WitPrograms, &mut files, &tool, &args_json, raw))
    }

    fn check(tool: String, args_json: String, context: Context) -> Result<(), ToolError> {
        let raw = raw_context(context);
        let mut files = WitFiles::open(&raw.entropy);
        answer(crate::tools::check(&mut WitPrograms, &mut files, &tool, &args_json, raw).map(|()| serde_json::Value::Null)).map(|_| ())
    }
}

impl operations::Guest for Component {
    fn build_golden(spec_json: String, context: Context) -> Result<String, ToolError> {
        let raw = raw_context(context);
        let mut files = WitFiles::open(&raw.entropy);
        answer(crate::tools::context(raw).and_then(|ctx| crate::golden::build(&mut WitPrograms, &mut files, &ctx, &spec_json)))
    }
}

fn raw_context(c: Context) -> crate::RawContext {
    crate::RawContext {
        host_name: c.host_name,
        host_version: c.host_version,
        options_json: c.options_json,
        project: c.project,
        ledger: c.ledger,
        now_ms: c.now_ms,
        entropy: c.entropy,
        facts: crate::options::HostFacts {
            approved: c.approved,
            opencode_version: c.opencode_version,
            opencode: c.opencode.map(|o| crate::options::OpencodeFacts {
                agents_without_rules: o.agents_without_rules,
                rules_not_added: o.rules_not_added,
                skills_invalid: o.skills_invalid,
                default_rules_json: o.default_rules_json,
                agent: o.agent,
                tool_rules: o
                    .tool_rules
                    .into_iter()
                    .map(|r| crate::options::ToolRule { tool: r.tool, action: r.action, hidden: r.hidden })
                    .collect(),
            }),
        },
    }
}

fn answer(r: crate::errors::ToolResult<serde_json::Value>) -> Result<String, ToolError> {
    r.map(|v| serde_json::to_string(&v).expect("a result serialises"))
        .map_err(|e| ToolError { code: e.code.as_str().to_string(), message: e.message, next: e.next })
}

export!(Component);

struct WitPrograms;

impl Programs for WitPrograms {
    fn run(&mut self, r: &RunRequest) -> Result<RunOutput, SpawnError> {
        from_wit(spawn::run(&to_wit(r)))
    }

    fn run_all(&mut self, requests: &[RunRequest]) -> Vec<Result<RunOutput, SpawnError>> {
        let wit: Vec<spawn::Request> = requests.iter().map(to_wit).collect();
        spawn::run_all(&wit).into_iter().map(from_wit).collect()
    }
}

fn to_wit(r: &RunRequest) -> spawn::Request {
    spawn::Request {
        program: r.program.clone(),
        args: r.args.clone(),
        stdin: r.stdin.clone(),
        env: r.env.clone(),
        cwd: r.cwd.clone(),
        timeout_ms: r.timeout_ms,
        stdin_files: r.stdin_files.clone(),
        stdout_files: r.stdout_files.clone(),
        stdout_modes_from: r.stdout_modes_from.clone(),
    }
}

fn from_wit(r: Result<spawn::Output, spawn::Error>) -> Result<RunOutput, SpawnError> {
    match r {
        Ok(o) => Ok(RunOutput {
            exit_code: o.exit_code,
            stdout: o.stdout,
            stderr: o.stderr,
            files: o.files.into_iter().map(|f| Streamed { path: f.path, size: f.size, sha256: f.sha256 }).collect(),
        }),
        Err(spawn::Error::NotAllowed(n)) => Err(SpawnError::NotAllowed(n)),
        Err(spawn::Error::NotFound(n)) => Err(SpawnError::NotFound(n)),
        Err(spawn::Error::TimedOut) => Err(SpawnError::TimedOut),
        Err(spawn::Error::Failed(m)) => Err(SpawnError::Failed(m)),
    }
}

/// Files under the preopens. Guest paths of preopens equal the laptop paths, so a path
/// resolves against the preopen with the longest matching prefix.
struct WitFiles {
    roots: Vec<(Descriptor, String)>,
    /// This call's own mark for temp names (from the host's entropy).
    token: String,
    writes: u32,
}

/// The entry names of folder `d`, sorted; the host's error as it gave it.
fn names_in(d: &Descriptor) -> Result<Vec<String>, ErrorCode> {
    let stream = d.read_directory()?;
    let mut names = Vec::new();
    while let Some(entry) = stream.read_directory_entry()? {
        names.push(entry.name);
    }
    names.sort();
    Ok(names)
}

fn io(e: ErrorCode) -> FsError {
    // The code's own name and text ("no-entry: No such file or directory"), never its Debug.
    let text = alloc::format!("{}: {}", e.name(), e.message());
    match e {
        ErrorCode::NotPermitted | ErrorCode::Access | ErrorCode::Loop => FsError::Refused(text),
        _ => FsError::Io(text),
    }
}

impl WitFiles {
    fn open(entropy: &[u8]) -> Self {
        // Derived, not copied: the entropy also seeds the server password.
        let mut seed = entropy.to_vec();
        seed.extend_from_slice(b"temp-names");
        let token = crate::encode::sha256_hex(&seed)[..12].to_string();
        Self { roots: get_directories(), token, writes: 0 }
    }

    /// A regular file opened once for reading (None when absent). A symlink, a folder, a
    /// FIFO, device or socket is refused: only a regular file is read, since the others
    /// could block or never end (the hosts refuse to open one as well). One open, not a
    /// `stat` and then an open: each open costs the host several syscalls.
    fn open_file(&self, path: &str) -> Result<Option<Descriptor>, FsError> {
        let (dir, rel) = self.resolve(path)?;
        if rel.is_empty() {
            return Err(FsError::Refused(path.to_string()));
        }
        let fd = match dir.open_at(PathFlags::empty(), rel, OpenFlags::empty(), DescriptorFlags::READ) {
            Ok(fd) => fd,
            Err(ErrorCode::NoEntry) => return Ok(None),
            Err(ErrorCode::Loop) | Err(ErrorCode::NotPermitted) => return Err(FsError::Refused(path.to_string())),
            Err(e) => return Err(io(e)),
        };
        match fd.get_type().map_err(io)? {
            DescriptorType::RegularFile => Ok(Some(fd)),
            _ => Err(FsError::Refused(path.to_string())),
        }
    }

    /// The preopen holding `path`, and the path relative to it ("" for the root itself).
    fn resolve<'a>(&self, path: &'a str) -> Result<(&Descriptor, &'a str), FsError> {
        if !crate::paths::is_clean_absolute(path) {
            return Err(FsError::Refused(path.to_string()));
        }
        self.roots
            .iter()
            .filter(|(_, root)| crate::paths::is_within(path, root.trim_end_matches('/')))
            .max_by_key(|(_, root)| root.len())
            .map(|(d, root)| (d, path[root.trim_end_matches('/').len()..].trim_start_matches('/')))
            .ok_or_else(|| FsError::Refused(path.to_string()))
    }
}

/// Every byte of an open file, in order, a chunk at a time. The host allocates (and
/// zeroes) each read's whole length before it reads, so chunks start small (a ledger
/// record is a few KiB) and double up to 1 MiB for a big file. A read that reaches the
/// end may say so (boxd-host does, for a regular file); else the next read, which finds
/// nothing, does. `take` gets each chunk (its own) and answers false to stop.
fn each_chunk(fd: &Descriptor, mut take: impl FnMut(Vec<u8>) -> bool) -> Result<(), FsError> {
    let (mut at, mut len) = (0u64, 16u64 << 10);
    loop {
        let (chunk, eof) = fd.read(len, at).map_err(io)?;
        let got = chunk.len() as u64;
        if got == 0 {
            return Ok(());
        }
        at += got;
        if !take(chunk) || eof {
            return Ok(());
        }
        if got == len {
            len = (len * 2).min(1 << 20);
        }
    }
}

impl WitFiles {
    /// A path's kind, and its size when `sized` (see `stat`).
    fn meta(&mut self, path: &str, sized: bool) -> Result<Option<Meta>, FsError> {
        let (dir, rel) = self.resolve(path)?;
        let fd = if rel.is_empty() {
            None
        } else {
            match dir.open_at(PathFlags::empty(), rel, OpenFlags::empty(), DescriptorFlags::READ) {
                Ok(fd) => Some(fd),
                Err(ErrorCode::NoEntry) => return Ok(None),
                Err(ErrorCode::Loop) | Err(ErrorCode::NotPermitted) => return Ok(Some(Meta { kind: Kind::Symlink, size: 0 })),
                Err(e) => return Err(io(e)),
            }
        };
        let d = fd.as_ref().unwrap_or(dir);
        let kind = match d.get_type().map_err(io)? {
            DescriptorType::RegularFile => Kind::File,
            DescriptorType::Directory => Kind::Dir,
            DescriptorType::SymbolicLink => Kind::Symlink,
            _ => Kind::Other,
        };
        let mut size = 0u64;
        if kind == Kind::File && sized {
            each_chunk(d, |chunk| {
                size += chunk.len() as u64;
                true
            })?;
        }
        Ok(Some(Meta { kind, size }))
    }
}

impl Files for WitFiles {
    fn read(&mut self, path: &str) -> Result<Option<Vec<u8>>, FsError> {
        self.read_at_most(path, usize::MAX)
    }

    /// Stops at the first chunk past `max`: a huge file is neither kept nor read through.
    fn read_at_most(&mut self, path: &str, max: usize) -> Result<Option<Vec<u8>>, FsError> {
        let Some(fd) = self.open_file(path)? else { return Ok(None) };
        let mut out = Vec::new();
        let mut over = false;
        each_chunk(&fd, |chunk| {
            over = out.len().saturating_add(chunk.len()) > max;
            if !over && out.is_empty() {
                // A record is one chunk: kept as the host handed it, not copied.
                out = chunk;
            } else if !over {
                out.extend_from_slice(&chunk);
            }
            !over
        })?;
        if over {
            return Err(crate::caps::too_large(path, max));
        }
        Ok(Some(out))
    }

    /// Hashed a megabyte at a time: a laptop file compared at harvest never sits in the
    /// component's memory as a whole.
    fn sha256(&mut self, path: &str) -> Result<Option<String>, FsError> {
        use sha2::{Digest, Sha256};
        let Some(fd) = self.open_file(path)? else { return Ok(None) };
        let mut hasher = Sha256::new();
        each_chunk(&fd, |chunk| {
            hasher.update(&chunk);
            true
        })?;
        Ok(Some(crate::encode::hex(&hasher.finalize())))
    }

    fn write_atomic(&mut self, path: &str, bytes: &[u8]) -> Result<(), FsError> {
        self.writes += 1;
        let n = self.writes;
        let (dir, rel) = self.resolve(path)?;
        if rel.is_empty() {
            return Err(FsError::Refused(path.to_string()));
        }
        // A temp name of this writer's own: two processes writing one record never share
        // (or delete) each other's temp file.
        let tmp = alloc::format!("{rel}.{}-{n}.boxd-tmp", self.token);
        let fd = dir
            .open_at(PathFlags::empty(), &tmp, OpenFlags::CREATE | OpenFlags::EXCLUSIVE, DescriptorFlags::WRITE)
            .map_err(io)?;
        let written = (|| {
            let mut off = 0usize;
            while off < bytes.len() {
                off += fd.write(&bytes[off..], off as u64)? as usize;
            }
            fd.sync_data()
        })();
        drop(fd);
        // A full disk (or any failure) leaves no temp behind: each retry would add another.
        if let Err(e) = written.and_then(|()| dir.rename_at(&tmp, dir, rel)) {
            let _ = dir.unlink_file_at(&tmp);
            return Err(io(e));
        }
        Ok(())
    }

    fn create_dir_all(&mut self, path: &str) -> Result<(), FsError> {
        let (dir, rel) = self.resolve(path)?;
        let mut so_far = String::new();
        for seg in rel.split('/').filter(|s| !s.is_empty()) {
            if !so_far.is_empty() {
                so_far.push('/');
            }
            so_far.push_str(seg);
            match dir.create_directory_at(&so_far) {
                Ok(()) | Err(ErrorCode::Exist) => {}
                Err(e) => return Err(io(e)),
            }
        }
        Ok(())
    }

    fn list(&mut self, path: &str) -> Result<Vec<String>, FsError> {
        let (dir, rel) = self.resolve(path)?;
        let opened;
        let d = if rel.is_empty() {
            dir
        } else {
            match dir.open_at(PathFlags::empty(), rel, OpenFlags::DIRECTORY, DescriptorFlags::READ) {
                Ok(fd) => {
                    opened = fd;
                    &opened
                }
                Err(ErrorCode::NoEntry) => return Ok(Vec::new()),
                Err(e) => return Err(io(e)),
            }
        };
        // The host reads each entry's type as it lists (wasmtime-wasi looks each one up), so
        // an entry removed meanwhile (another call releasing its admission claim) fails the
        // listing with no-entry: the folder changed while it was read, so read it again.
        let mut tries = 0;
        loop {
            match names_in(d) {
                Err(ErrorCode::NoEntry) if tries < 64 => tries += 1,
                r => return r.map_err(io),
            }
        }
    }

    // Not `stat`: its record carries timestamps, which would import wasi:clocks. Opening
    // without following symlinks tells the kind, and a read tells the size.
    fn stat(&mut self, path: &str) -> Result<Option<Meta>, FsError> {
        self.meta(path, true)
    }

    fn kind(&mut self, path: &str) -> Result<Option<Kind>, FsError> {
        Ok(self.meta(path, false)?.map(|m| m.kind))
    }

    fn remove_file(&mut self, path: &str) -> Result<(), FsError> {
        let (dir, rel) = self.resolve(path)?;
        match dir.unlink_file_at(rel) {
            Ok(()) | Err(ErrorCode::NoEntry) => Ok(()),
            Err(e) => Err(io(e)),
        }
    }

    fn create_new(&mut self, path: &str, bytes: &[u8]) -> Result<bool, FsError> {
        let (dir, rel) = self.resolve(path)?;
        let fd = match dir.open_at(PathFlags::empty(), rel, OpenFlags::CREATE | OpenFlags::EXCLUSIVE, DescriptorFlags::WRITE) {
            Ok(fd) => fd,
            Err(ErrorCode::Exist) => return Ok(false),
            Err(e) => return Err(io(e)),
        };
        let written = (|| {
            let mut off = 0usize;
            while off < bytes.len() {
                off += fd.write(&bytes[off..], off as u64)? as usize;
            }
            Ok(())
        })();
        drop(fd);
        // Not left half-made: an empty lock would read as another call's until it aged out.
        if let Err(e) = written {
            let _ = dir.unlink_file_at(rel);
            return Err(io(e));
        }
        Ok(true)
    }

    fn rename(&mut self, from: &str, to: &str) -> Result<bool, FsError> {
        let (dir, rel_from) = self.resolve(from)?;
        let (_, rel_to) = self.resolve(to)?;
        match dir.rename_at(rel_from, dir, rel_to) {
            Ok(()) => Ok(true),
            Err(ErrorCode::NoEntry) => Ok(false),
            Err(e) => Err(io(e)),
        }
    }

    /// A hard link, which fails when `to` exists, then the old name removed. A file system
    /// without hard links (some network and FAT ones) gets a look, then a rename: the
    /// window between them is left there.
    fn place_new(&mut self, from: &str, to: &str) -> Result<bool, FsError> {
        let (dir, rel_from) = self.resolve(from)?;
        let (_, rel_to) = self.resolve(to)?;
        match dir.link_at(PathFlags::empty(), rel_from, dir, rel_to) {
            Ok(()) => {
                self.remove_file(from)?;
                Ok(true)
            }
            Err(ErrorCode::Exist) => Ok(false),
            Err(ErrorCode::NotPermitted | ErrorCode::Unsupported | ErrorCode::CrossDevice | ErrorCode::TooManyLinks) => {
                if self.stat(to)?.is_some() {
                    return Ok(false);
                }
                self.rename(from, to)
            }
            Err(e) => Err(io(e)),
        }
    }
}

// --- no_std runtime for a wasm32 cdylib -------------------------------------------------

#[global_allocator]
static ALLOC: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    core::arch::wasm32::unreachable()
}

/// The canonical ABI's allocator hook; std would export it, a no_std crate must.
#[unsafe(no_mangle)]
unsafe extern "C" fn cabi_realloc(old: *mut u8, old_len: usize, align: usize, new_len: usize) -> *mut u8 {
    use alloc::alloc::{alloc, realloc, Layout};
    if new_len == 0 {
        return align as *mut u8;
    }
    unsafe {
        if old_len == 0 {
            alloc(Layout::from_size_align_unchecked(new_len, align))
        } else {
            realloc(old, Layout::from_size_align_unchecked(old_len, align), new_len)
        }
    }
}

#[unsafe(no_mangle)]
unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    for i in 0..n {
        let (x, y) = unsafe { (*a.add(i), *b.add(i)) };
        if x != y {
            return x as i32 - y as i32;
        }
    }
    0
}

#[unsafe(no_mangle)]
unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    unsafe { memcmp(a, b, n) }
}
