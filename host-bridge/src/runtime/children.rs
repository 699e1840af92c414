//! The spawn import: every request checked against the policy (program, arguments, folder,
//! environment, streamed files), run by the one process runner, and recorded for the
//! audit. `run-all` does the same for each of its requests and runs the children side by
//! side, all watched from the calling thread (spawn::run_all).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::{frames, mask_args, wit_spawn, HostState, PathRecord, SpawnRecord};
use crate::policy::Refusal;
use crate::spawn::{self, SpawnFailure};

type Answer = std::result::Result<wit_spawn::Output, wit_spawn::Error>;

impl wit_spawn::Host for HostState {
    fn run(&mut self, r: wit_spawn::Request) -> Answer {
        self.run_all(vec![r]).pop().expect("one answer per request")
    }

    /// Kill points count the children in request order: each `before-spawn` point as its
    /// request is checked (before any child of the batch starts), each `after-spawn` point
    /// once every child of the batch has ended (docs/architecture.md, "Kill points").
    fn run_all(&mut self, requests: Vec<wit_spawn::Request>) -> Vec<Answer> {
        if requests.is_empty() {
            return Vec::new();
        }
        let max = crate::policy::run_all_max();
        if requests.len() > max {
            // Refused whole, before anything is checked or counted: a batch never half-runs.
            let why = format!("run-all takes at most {max} requests at once (host-bridge/policy.json runAll.maxRequests); this one had {}, so none ran", requests.len());
            for r in &requests {
                let record = SpawnRecord { program: r.program.clone(), args: mask_args(&r.args), outcome: "failed".into(), ..SpawnRecord::default() };
                self.trace.spawns.push(record);
            }
            return requests.iter().map(|_| Err(wit_spawn::Error::Failed(why.clone()))).collect();
        }
        if let Some(hook) = self.on_first_spawn.take() {
            hook();
        }
        let first = self.spawns + 1;
        let mut records = Vec::with_capacity(requests.len());
        let mut checked = Vec::with_capacity(requests.len());
        for r in &requests {
            self.spawns += 1;
            self.kill_point(true, true, self.spawns);
            let started = Instant::now();
            let mut record = SpawnRecord { program: r.program.clone(), args: mask_args(&r.args), ..SpawnRecord::default() };
            checked.push((self.check(r, &mut record), started));
            records.push(record);
        }
        // The allowed requests run side by side (spawn::run_all); a refused one answers at once.
        let mut spawns = Vec::with_capacity(checked.len());
        for (c, _) in checked.iter_mut() {
            if let Ok(c) = c {
                spawns.push(c.spawn());
            }
        }
        // A refused request's time is its check's, not the batch's.
        let refused_at = Instant::now();
        let mut ran = spawn::run_all(spawns).into_iter();
        let answers: Vec<(Answer, Duration)> = checked
            .into_iter()
            .map(|(c, started)| match c {
                Ok(c) => {
                    let (out, ended) = ran.next().expect("one result a spawn");
                    (c.answer(out), ended.duration_since(started))
                }
                Err(refused) => (Err(refused), refused_at.duration_since(started)),
            })
            .collect();
        let mut out = Vec::with_capacity(answers.len());
        for ((n, mut record), (answer, took)) in (first..).zip(records).zip(answers) {
            self.kill_point(false, true, n);
            record.duration_ms = took.as_millis() as u64;
            record.outcome = match &answer {
                Ok(o) => {
                    record.exit_code = o.exit_code;
                    "exited".into()
                }
                Err(wit_spawn::Error::NotAllowed(_)) => "not-allowed".into(),
                Err(wit_spawn::Error::NotFound(_)) => "not-found".into(),
                Err(wit_spawn::Error::TimedOut) => "timed-out".into(),
                // The host stopping (crate::interrupt) killed it or did not start it.
                Err(wit_spawn::Error::Failed(_)) if crate::interrupt::received().is_some() => "interrupted".into(),
                Err(wit_spawn::Error::Failed(_)) => "failed".into(),
            };
            self.trace.spawns.push(record);
            out.push(answer);
        }
        out
    }
}

/// A request the policy allowed, with what it resolved to: ready to run on any thread.
struct Checked<'r> {
    r: &'r wit_spawn::Request,
    binary: PathBuf,
    env: Vec<(String, String)>,
    cwd: Option<PathBuf>,
    stdin_files: Vec<frames::Outgoing>,
    roots: Vec<PathBuf>,
}

impl HostState {
    /// Check one request against the program's grants (the grant it matched goes into
    /// `record`), open the files it streams out, and check where its files stream in.
    fn check<'r>(&mut self, r: &'r wit_spawn::Request, record: &mut SpawnRecord) -> Result<Checked<'r>, wit_spawn::Error> {
        let refused = |(Refusal::NotAllowed(m) | Refusal::CwdOutside(m))| wit_spawn::Error::NotAllowed(m);
        let (binary, grant) = self.policy.allows_call(&r.program, &r.args).map_err(refused)?;
        let binary = binary.to_path_buf();
        record.grant = Some(format!("{} {}", r.program, grant.name));
        let cwd = match &r.cwd {
            Some(c) => Some(self.policy.allows_cwd(c).map_err(refused)?),
            None => None,
        };
        let mut env = self.policy.child_env(&r.program);
        self.policy.allows_env(&r.program, &r.env).map_err(refused)?;
        env.extend(r.env.iter().cloned());
        // Streamed files are checked (and those sent opened) before the child starts.
        let roots: Vec<PathBuf> = self.policy.preopens().iter().map(|p| p.path.clone()).collect();
        let stdin_files = frames::open_outgoing(&r.stdin_files, &roots).map_err(wit_spawn::Error::Failed)?;
        frames::check_incoming(&r.stdout_files, &roots).map_err(wit_spawn::Error::Failed)?;
        let modes_from = r.stdout_modes_from.iter().filter(|p| !p.is_empty()).map(|p| (p, "mode-from"));
        for (path, mode) in r.stdin_files.iter().map(|p| (p, "stream-in")).chain(r.stdout_files.iter().map(|p| (p, "stream-out"))).chain(modes_from) {
            self.trace.paths.push(PathRecord { path: path.clone(), mode: mode.to_string() });
        }
        Ok(Checked { r, binary, env, cwd, stdin_files, roots })
    }
}

impl<'r> Checked<'r> {
    /// The spawn to run (its files to send move into it).
    fn spawn(&mut self) -> (spawn::Spawn<'_>, spawn::Streams<'_>) {
        let r = self.r;
        let streams = spawn::Streams { stdin_files: std::mem::take(&mut self.stdin_files), stdout_files: &r.stdout_files, stdout_modes_from: &r.stdout_modes_from, roots: &self.roots };
        let s = spawn::Spawn {
            name: &r.program,
            binary: &self.binary,
            args: &r.args,
            env: &self.env,
            cwd: self.cwd.as_deref(),
            stdin: r.stdin.as_deref(),
            timeout: Duration::from_millis(r.timeout_ms.max(1).into()),
            bounds: spawn::Bounds::default(),
        };
        (s, streams)
    }

    /// The component's answer for what the run gave.
    fn answer(&self, out: Result<spawn::Output, SpawnFailure>) -> Answer {
        let r = self.r;
        match out {
            Ok(o) => Ok(wit_spawn::Output {
                exit_code: o.exit_code,
                stdout: o.stdout,
                stderr: o.stderr,
                files: o.files.into_iter().map(|f| wit_spawn::Streamed { path: f.path, size: f.size, sha256: f.sha256 }).collect(),
            }),
            Err(SpawnFailure::NotFound(m)) => Err(wit_spawn::Error::NotFound(m)),
            Err(SpawnFailure::TimedOut) => Err(wit_spawn::Error::TimedOut),
            Err(SpawnFailure::Failed(m)) => Err(wit_spawn::Error::Failed(m)),
            Err(SpawnFailure::Interrupted(sig)) => Err(wit_spawn::Error::Failed(SpawnFailure::interrupted_message(&r.program, sig))),
        }
    }
}
