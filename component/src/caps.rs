//! The two capabilities the component is given, as traits.
//!
//! Every rule in the component is written against these traits, so it runs natively in
//! unit tests (with the fakes in `testing`) and, on wasm32, over the WIT imports (`wasm`).
//! Nothing here does I/O itself.

use alloc::string::String;
use alloc::vec::Vec;

/// One program run: a *name* the host maps to a binary, and an argument list (no shell).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunRequest {
    pub program: String,
    pub args: Vec<String>,
    pub stdin: Option<Vec<u8>>,
    pub env: Vec<(String, String)>,
    pub cwd: Option<String>,
    pub timeout_ms: u32,
    /// Laptop files the host streams onto stdin after `stdin`, framed (docs/guest.md).
    pub stdin_files: Vec<String>,
    /// New laptop files the host writes the child's stdout frames to, in order.
    pub stdout_files: Vec<String>,
    /// For each of `stdout_files`, the laptop file whose mode it takes ("": none).
    pub stdout_modes_from: Vec<String>,
}

/// The files a run streams, as `RunRequest` carries them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Streams {
    pub stdin_files: Vec<String>,
    pub stdout_files: Vec<String>,
    pub stdout_modes_from: Vec<String>,
}

/// A file the host streamed in or out: laptop path, size, sha256 (hex).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Streamed {
    pub path: String,
    pub size: u64,
    pub sha256: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunOutput {
    /// None when the child was killed by a signal.
    pub exit_code: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// The stdin files sent, then the stdout files received.
    pub files: Vec<Streamed>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SpawnError {
    NotAllowed(String),
    NotFound(String),
    TimedOut,
    Failed(String),
}

/// Run a named program the host granted.
pub trait Programs {
    fn run(&mut self, request: &RunRequest) -> Result<RunOutput, SpawnError>;

    /// Several runs side by side, results in request order. The hosts run the children at
    /// once; this default (the unit tests' fakes) runs them one after another, in order.
    fn run_all(&mut self, requests: &[RunRequest]) -> Vec<Result<RunOutput, SpawnError>> {
        requests.iter().map(|r| self.run(r)).collect()
    }
}

// A borrowed capability is the capability: a tool holds `&mut dyn Programs` (one tool
// table serves every host) and lends it to the adapters, which are generic over it.
impl<T: Programs + ?Sized> Programs for &mut T {
    fn run(&mut self, request: &RunRequest) -> Result<RunOutput, SpawnError> {
        (**self).run(request)
    }

    fn run_all(&mut self, requests: &[RunRequest]) -> Vec<Result<RunOutput, SpawnError>> {
        (**self).run_all(requests)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Other,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Meta {
    pub kind: Kind,
    pub size: u64,
}

/// A file-system failure, already reduced to what the component acts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FsError {
    /// The path is outside every preopened root (or escapes one).
    Refused(String),
    Io(String),
}

/// Files under the host's preopened roots. Paths are absolute laptop paths; an
/// implementation resolves them against the preopen that contains them and never
/// follows a symlink in the last component.
pub trait Files {
    /// The file's bytes, or None when it does not exist.
    fn read(&mut self, path: &str) -> Result<Option<Vec<u8>>, FsError>;
    /// Write through a temporary sibling, sync it, then rename over `path`.
    fn write_atomic(&mut self, path: &str, bytes: &[u8]) -> Result<(), FsError>;
    /// Create `path` and any missing parents.
    fn create_dir_all(&mut self, path: &str) -> Result<(), FsError>;
    /// Entry names in a directory (empty when it does not exist).
    fn list(&mut self, dir: &str) -> Result<Vec<String>, FsError>;
    /// Metadata without following a symlink; None when absent.
    fn stat(&mut self, path: &str) -> Result<Option<Meta>, FsError>;
    /// The kind alone, as `stat` tells it: where a size would cost a read of the file.
    fn kind(&mut self, path: &str) -> Result<Option<Kind>, FsError> {
        Ok(self.stat(path)?.map(|m| m.kind))
    }
    /// Remove a file; absent is fine.
    fn remove_file(&mut self, path: &str) -> Result<(), FsError>;
    /// Create `path` only if nothing is there (an exclusive create), holding `bytes`;
    /// false when it already exists. The ledger's lock is built on this.
    fn create_new(&mut self, path: &str, bytes: &[u8]) -> Result<bool, FsError>;
    /// Rename `from` over `to` in the same preopen; false when `from` does not exist.
    fn rename(&mut self, from: &str, to: &str) -> Result<bool, FsError>;
    /// Move `from` to `to` in the same preopen only if nothing is at `to`: false when
    /// something is (then `from` stays). A placement that never replaces a file that
    /// appeared after a check (another harvest's, landing at once).
    fn place_new(&mut self, from: &str, to: &str) -> Result<bool, FsError>;
    /// The sha256 (hex) of a regular file's bytes, or None when it does not exist. An
    /// implementation may hash it in pieces so the file is never in memory as a whole.
    fn sha256(&mut self, path: &str) -> Result<Option<String>, FsError> {
        Ok(self.read(path)?.map(|b| crate::encode::sha256_hex(&b)))
    }
    /// `read`, refused (Io) once the file holds more than `max` bytes. An implementation
    /// may stop reading there, so a huge file never fills the component's memory.
    fn read_at_most(&mut self, path: &str, max: usize) -> Result<Option<Vec<u8>>, FsError> {
        match self.read(path)? {
            Some(b) if b.len() > max => Err(too_large(path, max)),
            b => Ok(b),
        }
    }
}

/// The refusal of a file larger than a reader takes.
pub fn too_large(path: &str, max: usize) -> FsError {
    FsError::Io(alloc::format!("{path} holds more than {} MiB, more than it may", max >> 20))
}

impl<T: Files + ?Sized> Files for &mut T {
    fn read(&mut self, path: &str) -> Result<Option<Vec<u8>>, FsError> {
        (**self).read(path)
    }
    fn sha256(&mut self, path: &str) -> Result<Option<String>, FsError> {
        (**self).sha256(path)
    }
    fn read_at_most(&mut self, path: &str, max: usize) -> Result<Option<Vec<u8>>, FsError> {
        (**self).read_at_most(path, max)
    }
    fn write_atomic(&mut self, path: &str, bytes: &[u8]) -> Result<(), FsError> {
        (**self).write_atomic(path, bytes)
    }
    fn create_dir_all(&mut self, path: &str) -> Result<(), FsError> {
        (**self).create_dir_all(path)
    }
    fn list(&mut self, dir: &str) -> Result<Vec<String>, FsError> {
        (**self).list(dir)
    }
    fn stat(&mut self, path: &str) -> Result<Option<Meta>, FsError> {
        (**self).stat(path)
    }
    fn remove_file(&mut self, path: &str) -> Result<(), FsError> {
        (**self).remove_file(path)
    }
    fn create_new(&mut self, path: &str, bytes: &[u8]) -> Result<bool, FsError> {
        (**self).create_new(path, bytes)
    }
    fn rename(&mut self, from: &str, to: &str) -> Result<bool, FsError> {
        (**self).rename(from, to)
    }
    fn place_new(&mut self, from: &str, to: &str) -> Result<bool, FsError> {
        (**self).place_new(from, to)
    }
}
