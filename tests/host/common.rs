//! Shared fixtures: temp folders, the built binaries, and one boxd-host invocation.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

pub fn target_dir() -> PathBuf {
    // tests run from target/<profile>/deps/<test-binary>
    std::env::current_exe().unwrap().parent().unwrap().parent().unwrap().to_path_buf()
}

pub fn boxd_host() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_boxd-host"))
}

/// The boxd-local provider binary, built by `cargo test --workspace`.
pub fn boxd_local() -> PathBuf {
    let p = target_dir().join("boxd-local");
    assert!(p.exists(), "{} is missing: run the tests with `cargo test --workspace` (it builds boxd-local)", p.display());
    p
}

/// A fresh folder under the cargo target tmp dir, removed when dropped.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst)));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(std::fs::canonicalize(&dir).unwrap())
    }
    pub fn path(&self, rel: &str) -> PathBuf {
        let p = self.0.join(rel);
        std::fs::create_dir_all(&p).unwrap();
        p
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A laptop for one test: project, ledger, boxd-local state, and the compiled cache.
pub struct Laptop {
    pub scratch: Scratch,
    pub project: PathBuf,
    pub ledger: PathBuf,
    pub boxd_home: PathBuf,
}

impl Laptop {
    pub fn new(name: &str) -> Laptop {
        let scratch = Scratch::new(name);
        Laptop { project: scratch.path("project"), ledger: scratch.path("ledger"), boxd_home: scratch.path("boxd-local"), scratch }
    }

    /// `boxd-host --project … --ledger … --boxd <boxd-local> ARGS`.
    pub fn host(&self, args: &[&str]) -> Output {
        self.host_with(args, &[])
    }

    pub fn host_with(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new(boxd_host());
        cmd.arg("--project").arg(&self.project).arg("--ledger").arg(&self.ledger).arg("--boxd").arg(boxd_local());
        cmd.args(args).env("BOXD_LOCAL_HOME", &self.boxd_home).env("XDG_CACHE_HOME", cache_dir());
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    }

    /// Run boxd-local directly against this laptop's provider state.
    pub fn boxd(&self, args: &[&str]) -> Output {
        Command::new(boxd_local()).args(args).env("BOXD_LOCAL_HOME", &self.boxd_home).output().unwrap()
    }

    /// The provider's call log: each invocation's argv.
    pub fn boxd_calls(&self) -> Vec<Vec<String>> {
        let text = std::fs::read_to_string(self.boxd_home.join("calls.jsonl")).unwrap_or_default();
        text.lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                v["argv"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect()
            })
            .collect()
    }
}

pub fn cache_dir() -> &'static Path {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
}

pub fn stdout_json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("not JSON ({e}): stdout={} stderr={}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    })
}
