//! The state folder: where it lives, the exclusive lock taken around every read-modify-write,
//! and `state.json` (schema-versioned, written atomically). Layout:
//! `state.json`, `state.lock`, `machines/<id>/home/` and `tmp/`, `snapshots/<name>/<vN>/`,
//! `faults.json`, `calls.jsonl`, `config.json`.

use crate::fail::{Fail, Res};
use crate::util;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::path::PathBuf;

pub const SCHEMA: u32 = 1;

#[derive(Serialize, Deserialize)]
pub struct State {
    pub schema: u32,
    pub signed_in: bool,
    pub user_id: String,
    #[serde(default)]
    pub env: Vec<EnvVar>,
    #[serde(default)]
    pub machines: Vec<Machine>,
    /// Uses of `BOXD_LOCAL_FAULTS` rules (an env var cannot be rewritten), keyed by rule.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fault_uses: BTreeMap<String, u64>,
}

#[derive(Serialize, Deserialize, Clone)]
pub struct EnvVar {
    pub name: String,
    pub value: String,
    #[serde(default)]
    pub secret: bool,
    pub scope: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domains: Option<String>,
    /// What the machine sees instead of a `--domains` secret (`bxds_…`, 37 chars).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placeholder: Option<String>,
}

#[derive(Serialize, Deserialize, Clone)]
pub struct Machine {
    pub name: String,
    pub id: String,
    /// running | standby | hibernated | stopped | failed (`starting` is derived, see status_at).
    pub status: String,
    pub source: String,
    #[serde(default)]
    pub shared: bool,
    #[serde(default)]
    pub isolated: bool,
    pub auto_suspend_s: u64,
    pub auto_hibernate_s: u64,
    #[serde(default)]
    pub auto_destroy_s: u64,
    pub vcpu: u32,
    pub memory: String,
    pub created_ms: u64,
    pub last_activity_ms: u64,
    /// A create that "landed late": invisible to list/get until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visible_at_ms: Option<u64>,
    /// Shows `starting` until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_at_ms: Option<u64>,
    /// exec/cp invocations in progress: the machine is not idle while any is alive.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sessions: Vec<Session>,
}

#[derive(Serialize, Deserialize, Clone, PartialEq, Debug)]
pub struct Session {
    pub pid: i32,
    /// Kernel start time of `pid`, so a reused pid is not mistaken for the session.
    pub start: u64,
}

impl Machine {
    /// What list/get report now; `None` while a late-landing create is still invisible.
    pub fn status_at(&self, now: u64) -> Option<&str> {
        if self.visible_at_ms.is_some_and(|t| now < t) {
            return None;
        }
        if self.ready_at_ms.is_some_and(|t| now < t) {
            return Some("starting");
        }
        Some(&self.status)
    }

    pub fn url(&self) -> String {
        format!("{}.boxd.sh", self.name)
    }

    pub fn sharing(&self) -> &'static str {
        if self.shared { "shared" } else { "private" }
    }
}

impl State {
    fn fresh() -> Res<State> {
        Ok(State {
            schema: SCHEMA,
            // A local provider has no account: a first try works without a login step.
            signed_in: true,
            user_id: format!("usr_local_{}", util::random_hex(6)?),
            env: Vec::new(),
            machines: Vec::new(),
            fault_uses: BTreeMap::new(),
        })
    }

    /// Index of the machine called `name` as list/get would see it.
    pub fn visible(&self, name: &str, now: u64) -> Res<usize> {
        self.machines
            .iter()
            .position(|m| m.name == name && m.status_at(now).is_some())
            .ok_or_else(|| Fail::not_found(name))
    }

    /// A name is taken even while its machine is still invisible (boxd never duplicates).
    pub fn taken(&self, name: &str) -> bool {
        self.machines.iter().any(|m| m.name == name)
    }
}

pub struct Home {
    pub root: PathBuf,
}

impl Home {
    /// `$BOXD_LOCAL_HOME`, else `$XDG_DATA_HOME/boxd-local`, else `~/.local/share/boxd-local`.
    pub fn locate() -> Res<Home> {
        let nonempty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        let root = if let Some(v) = nonempty("BOXD_LOCAL_HOME") {
            PathBuf::from(v)
        } else if let Some(x) = nonempty("XDG_DATA_HOME") {
            PathBuf::from(x).join("boxd-local")
        } else if let Some(h) = nonempty("HOME") {
            PathBuf::from(h).join(".local/share/boxd-local")
        } else {
            return Err(Fail::new("cannot find a state folder: set BOXD_LOCAL_HOME"));
        };
        let root = if root.is_absolute() {
            root
        } else {
            std::env::current_dir().map_err(|e| Fail::io("reading the current folder", e))?.join(root)
        };
        for sub in ["machines", "snapshots"] {
            fs::create_dir_all(root.join(sub))
                .map_err(|e| Fail::io(format!("creating {}", root.join(sub).display()), e))?;
        }
        // Canonical, so "inside the machine home" checks compare like with like.
        let root = root.canonicalize().map_err(|e| Fail::io(format!("opening {}", root.display()), e))?;
        Ok(Home { root })
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    pub fn machine_dir(&self, id: &str) -> PathBuf {
        self.root.join("machines").join(id)
    }

    pub fn machine_home(&self, id: &str) -> PathBuf {
        self.machine_dir(id).join("home")
    }

    /// The machine's own temporary folder (its TMPDIR): a real machine's /tmp is its own,
    /// and what its programs leave there goes with the machine, not into the laptop's /tmp.
    pub fn machine_tmp(&self, id: &str) -> PathBuf {
        self.machine_dir(id).join("tmp")
    }

    pub fn snapshots_dir(&self) -> PathBuf {
        self.root.join("snapshots")
    }

    /// Take the state lock and read the state; the lock is released when `Locked` drops.
    pub fn lock(&self) -> Res<Locked<'_>> {
        let path = self.path("state.lock");
        let file = OpenOptions::new()
            .create(true)
            .read(true)
            .write(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| Fail::io(format!("opening {}", path.display()), e))?;
        file.lock().map_err(|e| Fail::io(format!("locking {}", path.display()), e))?;
        let state_path = self.path("state.json");
        let mut locked = match fs::read(&state_path) {
            Ok(bytes) => {
                let state: State = serde_json::from_slice(&bytes).map_err(|e| {
                    Fail::new(format!(
                        "{} is unreadable ({e}); move it away to start fresh",
                        state_path.display()
                    ))
                })?;
                if state.schema > SCHEMA {
                    return Err(Fail::new(format!(
                        "state.json has schema {} but this boxd-local knows only {SCHEMA}: update boxd-local",
                        state.schema
                    )));
                }
                Locked { _file: file, home: self, state }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut l = Locked { _file: file, home: self, state: State::fresh()? };
                l.save()?; // the user id must stay the same from the first call on
                l
            }
            Err(e) => return Err(Fail::io(format!("reading {}", state_path.display()), e)),
        };
        locked.state.schema = SCHEMA;
        Ok(locked)
    }
}

pub struct Locked<'a> {
    _file: File,
    pub home: &'a Home,
    pub state: State,
}

impl Locked<'_> {
    pub fn save(&mut self) -> Res<()> {
        let bytes = serde_json::to_vec_pretty(&self.state)
            .map_err(|e| Fail::new(format!("encoding state.json: {e}")))?;
        util::write_atomic(&self.home.path("state.json"), &bytes)
    }
}
