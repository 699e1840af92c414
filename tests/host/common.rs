//! Shared fixtures: temp folders, the built binaries, and one boxd-host invocation.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

pub fn target_dir() -> PathBuf {
    // tests run from target/<profile>/deps/<test-binary>
    std::env::current_exe().unwrap().parent().unwrap().parent().unwrap().to_path_buf()
}

/// The boxd-host under test: cargo's build of it, or the file BOXD_HOST_BIN names (the
/// bench runs an installed copy: host-bridge/benches/host.rs, `installed`).
pub fn boxd_host() -> PathBuf {
    std::env::var_os("BOXD_HOST_BIN").filter(|p| !p.is_empty()).map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_boxd-host")), PathBuf::from)
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
        self.host_stdin(args, env, None)
    }

    /// boxd-host with `stdin` fed (for `call TOOL -` with large arguments).
    pub fn host_stdin(&self, args: &[&str], env: &[(&str, &str)], stdin: Option<&[u8]>) -> Output {
        let mut cmd = Command::new(boxd_host());
        cmd.arg("--project").arg(&self.project).arg("--ledger").arg(&self.ledger).arg("--boxd").arg(boxd_local());
        cmd.args(args).env("BOXD_LOCAL_HOME", &self.boxd_home).env("BOXD_HOST_CACHE", cache_dir());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let Some(input) = stdin else { return cmd.output().unwrap() };
        cmd.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let mut pipe = child.stdin.take().unwrap();
        let bytes = input.to_vec();
        let writer = std::thread::spawn(move || std::io::Write::write_all(&mut pipe, &bytes));
        let out = child.wait_with_output().unwrap();
        writer.join().unwrap().unwrap();
        out
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

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The pinned real OpenCode from npm (tests/bootstrap.sh installs it).
pub fn opencode_bin() -> PathBuf {
    let p = repo().join("tests/node_modules/.bin/opencode");
    assert!(p.exists(), "{} is missing: run bash tests/bootstrap.sh", p.display());
    p
}

/// The scripted OpenAI-compatible model on loopback; killed when dropped.
pub struct Model {
    child: std::process::Child,
    pub url: String,
}

impl Model {
    pub fn start(dir: &Path) -> Model {
        use std::io::BufRead;
        let log = dir.join("model.jsonl");
        let mut child = Command::new("node")
            .arg(repo().join("host-bridge/tour/scripted-model.mjs"))
            .env("PORT", "0")
            .env("MODEL_LOG", &log)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("node runs the scripted model");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let url = line.split_whitespace().last().unwrap_or("").to_string();
        assert!(url.starts_with("http://127.0.0.1:"), "the scripted model did not start: {line:?}");
        Model { child, url }
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A laptop plus a provider with a golden image whose guests talk to the scripted model.
pub struct World {
    pub laptop: Laptop,
    pub model: Model,
    pub home: PathBuf,
}

/// The guests' OpenCode config: the tour's (the scripted provider, its URL and key from boxd env).
/// The guest config the tour builds its image with (the scripted provider): read from the
/// tour's own file, so the tests and the tour boot the same guest.
pub fn guest_config() -> String {
    std::fs::read_to_string(repo().join("host-bridge/tour/guest-opencode.json")).unwrap()
}

impl World {
    pub fn new(name: &str) -> World {
        let laptop = Laptop::new(name);
        let model = Model::start(&laptop.scratch.0);
        let home = laptop.scratch.path("laptop-home");
        let w = World { laptop, model, home };
        w.golden("opencode-golden");
        for (k, v) in [("SCRIPTED_MODEL_URL", w.model.url.as_str()), ("OPENCODE_DISABLE_MODELS_FETCH", "1"), ("OPENCODE_DISABLE_AUTOUPDATE", "1")] {
            w.ok(&["env", "set", k, v]);
        }
        w.ok(&["env", "set", "SCRIPTED_MODEL_KEY", "test-key", "--secret"]);
        w.forget_calls();
        w
    }

    /// Start the provider's call log afresh, so a test counts only its own round trips.
    pub fn forget_calls(&self) {
        let _ = std::fs::remove_file(self.laptop.boxd_home.join("calls.jsonl"));
    }

    fn ok(&self, args: &[&str]) -> Output {
        let out = self.laptop.boxd(args);
        assert!(out.status.success(), "boxd-local {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        out
    }

    /// A golden image: OpenCode's config written first (the binary comes from PATH here).
    pub fn golden(&self, name: &str) {
        self.ok(&["machine", "new", "golden-build", "--json"]);
        let seed = r#"mkdir -p .config/opencode/node_modules && cat > .config/opencode/opencode.json && printf '{"dependencies":{"@opencode-ai/plugin":"1.18.33"}}' > .config/opencode/package.json && printf '{"lockfileVersion":3,"packages":{"":{"dependencies":{"@opencode-ai/plugin":"1.18.33"}}}}' > .config/opencode/package-lock.json"#;
        let mut child = Command::new(boxd_local())
            .args(["machine", "exec", "golden-build", "--", "sh", "-c", &format!("'{}'", seed.replace('\'', "'\\''"))])
            .env("BOXD_LOCAL_HOME", &self.laptop.boxd_home)
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child.stdin.take().unwrap().write_all(guest_config().as_bytes()).unwrap();
        assert!(child.wait().unwrap().success());
        self.ok(&["snapshots", "save", "golden-build", name]);
        self.ok(&["machine", "remove", "golden-build", "-y"]);
    }

    /// `boxd-host call TOOL ARGS` as this laptop: its own OpenCode data, the pinned
    /// opencode, boxd-local. Returns (exit code, JSON).
    pub fn call(&self, tool: &str, args: &str) -> (i32, serde_json::Value) {
        self.call_with(&[], tool, args)
    }

    pub fn call_with(&self, flags: &[&str], tool: &str, args: &str) -> (i32, serde_json::Value) {
        let out = self.host_call(flags, tool, args, &[]);
        let code = out.status.code().unwrap_or(-1);
        assert!(code == 0 || code == 1, "boxd-host failed ({code}): {}", String::from_utf8_lossy(&out.stderr));
        (code, stdout_json(&out))
    }

    /// `boxd-host call` as `call_with` makes it (a later `--opencode` in `flags` wins over
    /// the pinned one), with `extra` in its environment: how it ended, whatever that was.
    pub fn host_call(&self, flags: &[&str], tool: &str, args: &str, extra: &[(&str, &str)]) -> Output {
        let oc = opencode_bin();
        let path = format!("{}:{}", oc.parent().unwrap().display(), std::env::var("PATH").unwrap_or_default());
        let mut argv: Vec<&str> = vec!["--opencode", oc.to_str().unwrap()];
        argv.extend_from_slice(flags);
        let big = args.len() > 64 * 1024;
        argv.extend(["call", tool, if big { "-" } else { args }]);
        let mut env = self.laptop_env();
        env.push(("PATH".into(), path));
        let mut env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        env.extend_from_slice(extra);
        self.laptop.host_stdin(&argv, &env, big.then_some(args.as_bytes()))
    }

    /// `boxd-host call` as `call` makes it, with a kill point (BOXD_HOST_KILL_AT); true when
    /// the host was killed there, else the call's answer must be a tool's answer.
    pub fn killed_at(&self, point: &str, tool: &str, args: &str) -> bool {
        let out = self.host_call(&[], tool, args, &[("BOXD_HOST_KILL_AT", point)]);
        use std::os::unix::process::ExitStatusExt;
        match out.status.signal() {
            Some(9) => true,
            None => {
                let code = out.status.code().unwrap();
                assert!(code == 0 || code == 1, "{tool} at {point}: exit {code}: {}", String::from_utf8_lossy(&out.stderr));
                stdout_json(&out);
                false
            }
            Some(s) => panic!("{tool} at {point}: killed by signal {s}"),
        }
    }

    /// The laptop's own OpenCode data (HOME and the XDG folders under `home`).
    pub fn laptop_env(&self) -> Vec<(String, String)> {
        let h = self.home.display().to_string();
        let mut env = vec![("HOME".to_string(), h.clone())];
        for (k, sub) in [("XDG_DATA_HOME", "data"), ("XDG_CONFIG_HOME", "config"), ("XDG_CACHE_HOME", "cache"), ("XDG_STATE_HOME", "state")] {
            env.push((k.into(), format!("{h}/{sub}")));
        }
        env.push(("OPENCODE_DISABLE_MODELS_FETCH".into(), "1".into()));
        env.push(("OPENCODE_DISABLE_AUTOUPDATE".into(), "1".into()));
        env
    }

    /// Call a tool that must succeed.
    pub fn ok_call(&self, tool: &str, args: &str) -> serde_json::Value {
        let (code, v) = self.call(tool, args);
        assert_eq!(code, 0, "{tool} {args}: {v:#}");
        v
    }

    /// Call a tool that must fail with `code`; returns the error object.
    pub fn err_call(&self, tool: &str, args: &str, code: &str) -> serde_json::Value {
        let (exit, v) = self.call(tool, args);
        assert_eq!((exit, v["error"].as_str()), (1, Some(code)), "{tool} {args}: {v:#}");
        assert!(v["next"].as_str().is_some_and(|n| !n.is_empty()), "{v:#}");
        v
    }

    /// boxd_job until it is no longer busy (bounded): the result, or the error object.
    pub fn job_until_idle(&self, work: &str) -> serde_json::Value {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        loop {
            let (_, v) = self.call("boxd_job", &format!(r#"{{"work":"{work}"}}"#));
            if v["state"] != "busy" || std::time::Instant::now() > deadline {
                return v;
            }
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
    }

    /// boxd-local invocations whose argv starts with `prefix`.
    pub fn calls_starting(&self, prefix: &[&str]) -> usize {
        self.laptop.boxd_calls().iter().filter(|c| c.len() >= prefix.len() && c[..prefix.len()] == *prefix).count()
    }

    pub fn faults(&self, json: &str) {
        std::fs::write(self.laptop.boxd_home.join("faults.json"), json).unwrap();
    }
}

impl Drop for World {
    fn drop(&mut self) {
        // Remove every machine, which kills its processes (servers, pumps).
        let out = self.laptop.boxd(&["machine", "list", "--json"]);
        if let Ok(serde_json::Value::Array(ms)) = serde_json::from_slice(&out.stdout) {
            for m in ms {
                if let Some(name) = m["name"].as_str() {
                    let _ = self.laptop.boxd(&["machine", "remove", name, "-y"]);
                }
            }
        }
    }
}

fn modified(p: &Path) -> Option<std::time::SystemTime> {
    p.metadata().and_then(|m| m.modified()).ok()
}

/// Whether dist/ was built from this component and from the current inputs.
fn dist_is_current(bridge: &Path, wasm: &[u8]) -> bool {
    let Ok(text) = std::fs::read_to_string(bridge.join("dist/build.json")) else { return false };
    let Ok(info) = serde_json::from_str::<serde_json::Value>(&text) else { return false };
    if info["component"]["sha256"].as_str() != Some(crate::guest::sha256(wasm).as_str()) || !bridge.join("dist/worker.js").exists() {
        return false;
    }
    let built = modified(&bridge.join("dist/build.json"));
    let inputs = ["worker.js", "sandbox.js", "scripts/build.mjs", "package-lock.json", "../policy.json", "../../skills/boxd/SKILL.md"];
    // dist/worker.js bundles lib/ (inworker.js and what it imports): a changed lib/ file is
    // a stale worker, or the in-worker spawn path is tested with old code.
    let lib = std::fs::read_dir(bridge.join("lib")).into_iter().flatten().flatten().map(|e| e.path());
    inputs.iter().map(|i| bridge.join(i)).chain(lib).all(|p| modified(&p) <= built)
}

/// Build the OpenCode bridge's dist/ when it is missing or stale (serialised: two tests
/// may want it at once).
pub fn build_bridge() {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let bridge = repo().join("host-bridge/opencode");
    let wasm_path = env!("COMPONENT_WASM");
    let wasm = std::fs::read(wasm_path).expect("build.rs builds the component");
    assert!(
        bridge.join("node_modules/@bytecodealliance/jco").exists(),
        "host-bridge/opencode/node_modules is missing: run bash tests/bootstrap.sh (it runs npm ci there)"
    );
    opencode_bin();
    if !dist_is_current(&bridge, &wasm) {
        let out = Command::new("npm")
            .args(["run", "--silent", "build"])
            .current_dir(&bridge)
            .env("BOXD_COMPONENT_WASM", wasm_path)
            .output()
            .expect("npm runs the bridge build");
        assert!(out.status.success(), "npm run build failed:\n{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    }
}

impl World {
    /// `boxd-host [FLAGS] call TOOL ARGS` as this laptop (as `call_with`), without judging
    /// the outcome: the raw exit status, stdout and stderr, for tests that check them.
    pub fn call_output(&self, flags: &[&str], tool: &str, args: &str) -> Output {
        let oc = opencode_bin();
        let path = format!("{}:{}", oc.parent().unwrap().display(), std::env::var("PATH").unwrap_or_default());
        let mut argv: Vec<&str> = vec!["--opencode", oc.to_str().unwrap()];
        argv.extend_from_slice(flags);
        argv.extend(["call", tool, args]);
        let mut env = self.laptop_env();
        env.push(("PATH".into(), path));
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        self.laptop.host_stdin(&argv, &env, None)
    }

    /// Run a shell command line in a machine's home through boxd-local (no plugin involved).
    pub fn on_machine(&self, machine: &str, script: &str) -> Output {
        self.laptop.boxd(&["machine", "exec", machine, "--", "sh", "-c", &format!("'{}'", script.replace('\'', "'\\''"))])
    }
}

/// The test-only probe component (tests/probe), built on first use by a nested cargo into
/// the component's own target folder, so no product build ever builds it.
/// `BOXD_PROBE_WASM` names a prebuilt one instead.
pub fn probe_wasm() -> &'static Path {
    static WASM: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    WASM.get_or_init(|| {
        if let Some(p) = std::env::var_os("BOXD_PROBE_WASM") {
            return PathBuf::from(p);
        }
        let target = target_dir().parent().unwrap().join("wasm-component");
        let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .current_dir(repo())
            .args(["build", "--quiet", "-p", "boxd-probe", "--target", "wasm32-wasip2", "--profile", "wasm", "--target-dir"])
            .arg(&target)
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_BUILD_TARGET")
            .status()
            .expect("cargo builds the probe component");
        assert!(status.success(), "building tests/probe for wasm32-wasip2 failed");
        target.join("wasm32-wasip2/wasm/boxd_probe.wasm")
    })
}

/// The probe component under `policy` (tests/probe: it tries what a hostile component would).
pub fn probe(policy: boxd_host::policy::Policy) -> boxd_host::runtime::Runtime {
    let wasm = std::fs::read(probe_wasm()).expect("the probe component is built");
    boxd_host::runtime::Runtime::load(&wasm, policy, Some(cache_dir())).unwrap()
}

/// One probe tool call that must answer; its text.
pub fn ask(rt: &boxd_host::runtime::Runtime, tool: &str, arg: &str) -> String {
    let (result, _) = rt.call(tool, arg, &boxd_host::runtime::CallContext::default()).unwrap();
    result.unwrap_or_else(|e| panic!("probe error {}: {}", e.code, e.message))
}

/// Whether a process runs whose arguments hold `args` in a row (a boxd call under way: the
/// call log has its line only once it ends).
pub fn running(args: &[&str]) -> bool {
    let want: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    std::fs::read_dir("/proc").into_iter().flatten().flatten().any(|p| {
        let argv = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
        let argv: Vec<&[u8]> = argv.split(|b| *b == 0).collect();
        argv.windows(want.len()).any(|w| w == want.as_slice())
    })
}

/// Wait until a boxd-local of the provider state `home` runs with `args` in a row (one
/// laptop's call under way while other tests run the same verb), at most 60 s.
pub fn until_running_in(home: &Path, args: &[&str]) {
    let want: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    let marker = format!("BOXD_LOCAL_HOME={}", home.display()).into_bytes();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let found = std::fs::read_dir("/proc").into_iter().flatten().flatten().any(|p| {
            let argv = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
            let argv: Vec<&[u8]> = argv.split(|b| *b == 0).collect();
            argv.windows(want.len()).any(|w| w == want.as_slice())
                && std::fs::read(p.path().join("environ")).unwrap_or_default().split(|b| *b == 0).any(|v| v == marker.as_slice())
        });
        if found {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "nothing ran {args:?} in {}", home.display());
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Wait until a process runs with `args` in a row (the call under way), at most 60 s.
pub fn until_running(args: &[&str]) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !running(args) {
        assert!(std::time::Instant::now() < deadline, "nothing ran {args:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
