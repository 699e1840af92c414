//! Native stand-ins for the two capabilities, for unit tests only: a scripted program
//! runner that records every request, and an in-memory file tree with symlinks.

use alloc::collections::{BTreeMap, BTreeSet, VecDeque};
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use crate::caps::{Files, FsError, Kind, Meta, Programs, RunOutput, RunRequest, SpawnError};
use crate::ledger::{GitRecord, Ledger, Proof, Work, WorkState};
use crate::paths;
use crate::tools::RawContext;

/// A call's context as a test host passes it: project /p, ledger /l, clock at zero.
/// `raw_context` with no options or facts, at `now_ms` on the call's clock.
pub fn raw_at(now_ms: u64) -> RawContext {
    RawContext { now_ms, ..raw_context("{}", "{}") }
}

pub fn raw_context(options: &str, facts: &str) -> RawContext {
    RawContext {
        host_name: "test".into(),
        host_version: "1".into(),
        options_json: options.into(),
        project: "/p".into(),
        ledger: "/l".into(),
        now_ms: 0,
        entropy: alloc::vec![1; 32],
        facts: crate::options::HostFacts::from_json(facts),
    }
}

/// A ledger holding one open, proven work w1 on machine oc-w1 (id vm_1), with `git` as
/// its git record.
pub fn open_work(git: Option<GitRecord>) -> MemFiles {
    let mut fs = MemFiles::new(&["/p", "/l"]);
    let mut w = Work::new("w1", "/p", "t");
    w.state = WorkState::Open;
    w.machine_id = Some("vm_1".into());
    w.proofs.push(Proof { prompts: 0, ..Default::default() });
    w.git = git;
    Ledger::new(&mut fs, "/l").write(&w).unwrap();
    fs
}

/// The guest's answer to a claim it agrees to (a machine taken up by its name: machine.rs).
pub const CLAIMED: &str = r#"{"ok":true,"claimed":true}"#;

/// `boxd machine get oc-w1 --json` for the machine the ledger of `open_work` created.
pub const OURS: &str = r#"{"name":"oc-w1","id":"vm_1","status":"running","sharing":"private","isolated":"no"}"#;

/// Answers program runs from a queue, in order, and records what was asked.
#[derive(Default)]
pub struct Scripted {
    pub answers: VecDeque<Result<RunOutput, SpawnError>>,
    pub requests: Vec<RunRequest>,
    /// The size of each `run_all` batch, in order (a host runs a batch side by side).
    pub batches: Vec<usize>,
}

impl Scripted {
    pub fn push_exit(&mut self, code: i32, stdout: &str, stderr: &str) {
        self.answers.push_back(Ok(RunOutput {
            exit_code: Some(code),
            stdout: stdout.as_bytes().to_vec(),
            stderr: stderr.as_bytes().to_vec(),
            files: Vec::new(),
        }));
    }
    pub fn push_fail(&mut self, code: i32, stderr: &str) {
        self.push_exit(code, "", stderr);
    }
    pub fn push_spawn_error(&mut self, e: SpawnError) {
        self.answers.push_back(Err(e));
    }
    /// The argument lists of every run, joined with spaces (for readable assertions).
    pub fn commands(&self) -> Vec<String> {
        self.requests.iter().map(|r| r.args.join(" ")).collect()
    }
}

impl Programs for Scripted {
    fn run(&mut self, request: &RunRequest) -> Result<RunOutput, SpawnError> {
        self.requests.push(request.clone());
        self.answers
            .pop_front()
            .unwrap_or_else(|| panic!("unscripted run: {} {}", request.program, request.args.join(" ")))
    }

    fn run_all(&mut self, requests: &[RunRequest]) -> Vec<Result<RunOutput, SpawnError>> {
        self.batches.push(requests.len());
        requests.iter().map(|r| self.run(r)).collect()
    }
}

/// An in-memory tree confined to `roots`, like the host's preopens.
pub struct MemFiles {
    pub roots: Vec<String>,
    pub files: BTreeMap<String, Vec<u8>>,
    pub dirs: BTreeSet<String>,
    pub symlinks: BTreeSet<String>,
    /// Paths whose writes fail, to test LEDGER_FAILED paths.
    pub broken: BTreeSet<String>,
}

impl MemFiles {
    pub fn new(roots: &[&str]) -> Self {
        let roots: Vec<String> = roots.iter().map(|r| r.to_string()).collect();
        Self { dirs: roots.iter().cloned().collect(), roots, files: BTreeMap::new(), symlinks: BTreeSet::new(), broken: BTreeSet::new() }
    }
    fn check(&self, path: &str) -> Result<String, FsError> {
        let clean = paths::clean_absolute(path).ok_or_else(|| FsError::Refused(path.to_string()))?;
        if self.roots.iter().any(|r| paths::is_within(&clean, r)) { Ok(clean) } else { Err(FsError::Refused(path.to_string())) }
    }
    pub fn put(&mut self, path: &str, bytes: &[u8]) {
        let mut d = paths::parent(path).to_string();
        while !d.is_empty() && d != "/" {
            self.dirs.insert(d.clone());
            d = paths::parent(&d).to_string();
        }
        self.files.insert(path.to_string(), bytes.to_vec());
    }
    /// Something (a file, a symlink, a folder) is at `p`.
    fn taken(&self, p: &str) -> bool {
        self.files.contains_key(p) || self.symlinks.contains(p) || self.dirs.contains(p)
    }
    pub fn text(&self, path: &str) -> Option<String> {
        self.files.get(path).map(|b| String::from_utf8_lossy(b).into_owned())
    }
}

impl Files for MemFiles {
    fn read(&mut self, path: &str) -> Result<Option<Vec<u8>>, FsError> {
        let p = self.check(path)?;
        if self.symlinks.contains(&p) {
            return Err(FsError::Refused(p));
        }
        Ok(self.files.get(&p).cloned())
    }
    fn write_atomic(&mut self, path: &str, bytes: &[u8]) -> Result<(), FsError> {
        let p = self.check(path)?;
        if self.broken.iter().any(|b| paths::is_within(&p, b)) {
            return Err(FsError::Io("read-only file system".into()));
        }
        if !self.dirs.contains(paths::parent(&p)) {
            return Err(FsError::Io("no such directory".into()));
        }
        self.files.insert(p, bytes.to_vec());
        Ok(())
    }
    fn create_dir_all(&mut self, path: &str) -> Result<(), FsError> {
        let p = self.check(path)?;
        if self.broken.iter().any(|b| paths::is_within(&p, b)) {
            return Err(FsError::Io("read-only file system".into()));
        }
        let mut d = p;
        while !d.is_empty() && d != "/" {
            self.dirs.insert(d.clone());
            d = paths::parent(&d).to_string();
        }
        Ok(())
    }
    fn list(&mut self, dir: &str) -> Result<Vec<String>, FsError> {
        let d = self.check(dir)?;
        let prefix = if d == "/" { d.clone() } else { alloc::format!("{d}/") };
        let mut names = BTreeSet::new();
        for p in self.files.keys().chain(self.dirs.iter()) {
            if let Some(rest) = p.strip_prefix(&prefix) {
                if let Some(first) = rest.split('/').next().filter(|s| !s.is_empty()) {
                    names.insert(first.to_string());
                }
            }
        }
        Ok(names.into_iter().collect())
    }
    fn stat(&mut self, path: &str) -> Result<Option<Meta>, FsError> {
        let p = self.check(path)?;
        Ok(if self.symlinks.contains(&p) {
            Some(Meta { kind: Kind::Symlink, size: 0 })
        } else if let Some(b) = self.files.get(&p) {
            Some(Meta { kind: Kind::File, size: b.len() as u64 })
        } else if self.dirs.contains(&p) {
            Some(Meta { kind: Kind::Dir, size: 0 })
        } else {
            None
        })
    }
    fn remove_file(&mut self, path: &str) -> Result<(), FsError> {
        let p = self.check(path)?;
        self.files.remove(&p);
        Ok(())
    }
    fn create_new(&mut self, path: &str, bytes: &[u8]) -> Result<bool, FsError> {
        let p = self.check(path)?;
        if self.taken(&p) {
            return Ok(false);
        }
        self.write_atomic(&p, bytes)?;
        Ok(true)
    }
    fn place_new(&mut self, from: &str, to: &str) -> Result<bool, FsError> {
        if self.taken(&self.check(to)?) {
            return Ok(false);
        }
        self.rename(from, to)
    }
    fn rename(&mut self, from: &str, to: &str) -> Result<bool, FsError> {
        let (f, t) = (self.check(from)?, self.check(to)?);
        match self.files.remove(&f) {
            Some(bytes) => {
                self.files.insert(t, bytes);
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

/// Files and programs sharing one in-memory ledger, so a scripted boxd answer can act as
/// another call changing the ledger at that moment.
pub struct Shared(pub alloc::rc::Rc<core::cell::RefCell<MemFiles>>);

impl Files for Shared {
    fn read(&mut self, p: &str) -> Result<Option<Vec<u8>>, crate::caps::FsError> {
        self.0.borrow_mut().read(p)
    }
    fn write_atomic(&mut self, p: &str, b: &[u8]) -> Result<(), crate::caps::FsError> {
        self.0.borrow_mut().write_atomic(p, b)
    }
    fn create_dir_all(&mut self, p: &str) -> Result<(), crate::caps::FsError> {
        self.0.borrow_mut().create_dir_all(p)
    }
    fn list(&mut self, p: &str) -> Result<Vec<String>, crate::caps::FsError> {
        self.0.borrow_mut().list(p)
    }
    fn stat(&mut self, p: &str) -> Result<Option<crate::caps::Meta>, crate::caps::FsError> {
        self.0.borrow_mut().stat(p)
    }
    fn remove_file(&mut self, p: &str) -> Result<(), crate::caps::FsError> {
        self.0.borrow_mut().remove_file(p)
    }
    fn create_new(&mut self, p: &str, b: &[u8]) -> Result<bool, crate::caps::FsError> {
        self.0.borrow_mut().create_new(p, b)
    }
    fn rename(&mut self, a: &str, b: &str) -> Result<bool, crate::caps::FsError> {
        self.0.borrow_mut().rename(a, b)
    }
    fn place_new(&mut self, a: &str, b: &str) -> Result<bool, crate::caps::FsError> {
        self.0.borrow_mut().place_new(a, b)
    }
}
