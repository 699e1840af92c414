//! The runtime: one engine, the component compiled once (and cached on disk, keyed by
//! the component's sha256 and the engine's compatibility hash), its WIT version checked
//! against this host's, a linker that provides exactly the granted imports, and a fresh
//! instance per call whose trace (spawns, paths) the runtime keeps for the audit.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context as _, Result};
use sha2::{Digest, Sha256};
use wasmtime::component::{Component, HasSelf, Linker, ResourceTable};
use wasmtime::{Engine, Store};
use wasmtime_wasi::filesystem::{WasiFilesystem, WasiFilesystemView};
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxView, WasiView};

mod children;
mod engine;
mod kill_at;
pub use kill_at::KillAt;
pub mod frames;
#[cfg(target_os = "linux")]
mod listing;
#[cfg(target_os = "linux")]
mod read_open;
mod trace;
pub use trace::{mask_args, PathRecord, SpawnRecord, Trace};

use crate::policy::Policy;

wasmtime::component::bindgen!({
    world: "plugin",
    path: "../wit",
    with: {
        "wasi:filesystem/types": wasmtime_wasi::p2::bindings::sync::filesystem::types,
        "wasi:filesystem/preopens": wasmtime_wasi::p2::bindings::filesystem::preopens,
        "wasi:io": wasmtime_wasi::p2::bindings::sync::io,
        "wasi:clocks": wasmtime_wasi::p2::bindings::clocks,
    },
});

pub use exports::boxd::plugin::tools::ToolError;
use boxd::plugin::spawn as wit_spawn;

/// Tests only: every filesystem call takes wasmtime-wasi's path (an open behind the
/// guard; no shortcut of read_open.rs or listing.rs), so both paths' answers can be
/// compared (tests/host/bounds.rs).
#[doc(hidden)]
pub fn general_paths_only(on: bool) {
    #[cfg(target_os = "linux")]
    read_open::GENERAL_ONLY.store(on, std::sync::atomic::Ordering::Relaxed);
    #[cfg(not(target_os = "linux"))]
    let _ = on;
}

/// Filesystem calls run on the calling thread: each is a few microseconds of syscall, far
/// less than a hop to a blocking pool. Descriptors the host opens itself (read_open.rs)
/// are made with the same setting.
const BLOCK_CURRENT_THREAD: bool = true;

/// wasmtime-wasi runs every filesystem call through tokio (`in_tokio`). Outside a runtime
/// it builds its own at a process's first call: a multi-thread one with an I/O and a time
/// driver and two worker threads (~0.3 ms of a one-shot call). Our filesystem calls run on
/// the calling thread (BLOCK_CURRENT_THREAD) and the world has no clocks or sockets, so a
/// current-thread runtime without drivers serves; a host already in a runtime (the MCP
/// server) keeps its own.
fn in_tokio_context<R>(f: impl FnOnce() -> R) -> R {
    static PLAIN: std::sync::LazyLock<tokio::runtime::Runtime> =
        std::sync::LazyLock::new(|| tokio::runtime::Builder::new_current_thread().build().expect("a current-thread tokio runtime needs no resources"));
    let _entered = tokio::runtime::Handle::try_current().is_err().then(|| PLAIN.enter());
    f()
}

/// Runs once, just before a call's first spawn. The component checks a call's arguments,
/// options and access before it runs any program, so a host that starts progress here
/// reports it only for calls that passed those checks, with no tool logic of its own.
pub type OnFirstSpawn = Box<dyn FnOnce() + Send>;

/// What a host knows about one call; becomes the WIT `context`. The Rust hosts have no
/// OpenCode facts: they are not OpenCode.
#[derive(Clone, Debug, Default)]
pub struct CallContext {
    pub host_name: String,
    pub host_version: String,
    pub options_json: String,
    pub project: String,
    pub ledger: String,
    pub now_ms: u64,
    pub entropy: Vec<u8>,
    /// The user approved this call (the command line is the approval of what it names).
    pub approved: bool,
    pub opencode_version: Option<String>,
}

/// The WIT package this host was built against (wit/plugin.wit), e.g. "boxd:plugin@0.1.0".
pub fn wit_package() -> &'static str {
    const WIT: &str = include_str!("../../../wit/plugin.wit");
    WIT.lines()
        .find_map(|l| l.trim().strip_prefix("package "))
        .map(|p| p.trim_end_matches(';').trim())
        .expect("wit/plugin.wit names its package")
}

/// The `tools` interface a component must export for this host: `boxd:plugin/tools@0.1.0`.
fn tools_interface(package: &str) -> String {
    match package.split_once('@') {
        Some((name, version)) => format!("{name}/tools@{version}"),
        None => format!("{package}/tools"),
    }
}

/// Refuse a component built for another version of the world before linking, with the one
/// thing to do about it (a link error would only say an import is not granted).
fn check_world(engine: &Engine, component: &Component) -> Result<()> {
    let want = tools_interface(wit_package());
    let exports: Vec<String> = component.component_type().exports(engine).map(|(n, _)| n.to_string()).collect();
    if exports.iter().any(|e| *e == want) {
        return Ok(());
    }
    let theirs = exports.iter().find(|e| e.starts_with("boxd:plugin/tools")).map(|e| e.replace("/tools", ""));
    match theirs {
        Some(theirs) => anyhow::bail!(
            "the component speaks {theirs}, this boxd-host speaks {}; use the component this boxd-host was built with (leave out --component), or a boxd-host of the component's release",
            wit_package()
        ),
        None => anyhow::bail!("this is not an opencode-boxd component (it exports no boxd:plugin tools); leave out --component to use the one built in"),
    }
}

pub struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    policy: Arc<Policy>,
    trace: Trace,
    /// Descriptor handle → the path it names, so opens are logged as absolute paths.
    fds: BTreeMap<u32, String>,
    /// Descriptors read_open.rs opened and found regular files: their type needs no stat.
    regular: BTreeSet<u32>,
    /// Test-only kill points (BOXD_HOST_KILL_AT) and the counts they are checked against.
    kill_at: Option<KillAt>,
    spawns: u32,
    renames: u32,
    on_first_spawn: Option<OnFirstSpawn>,
    /// The component's memory bound (`MEMORY_LIMIT`).
    limits: wasmtime::StoreLimits,
}

/// The most linear memory a call's instance may grow to. Every answer the component parses
/// is capped (64 MiB of stdout), but JSON of many tiny values takes far more as values than
/// as bytes: a hostile guest's 66 MB export reached 3.5 GiB. Past this a call traps and is
/// answered HOST_FAILED; real transcripts up to the cap fit well within it.
pub const MEMORY_LIMIT: usize = 1 << 30;

/// A store for one call's instance, bounded by MEMORY_LIMIT.
fn bounded_store(engine: &Engine, state: HostState) -> Store<HostState> {
    let mut store = Store::new(engine, state);
    store.limiter(|s| &mut s.limits);
    store
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

/// A long-lived host's instance for its next call and its last call's store: both are
/// handled by `Runtime::ready_next`, off the calls' path. `on` once a host asks for it
/// (`ready_next`, or `keep_spent` for a one-shot call, whose store goes with the process).
#[derive(Default)]
struct Warm {
    on: bool,
    spare: Option<(Store<HostState>, Plugin)>,
    spent: Option<Store<HostState>>,
}

pub struct Runtime {
    engine: Engine,
    component: Component,
    pre: PluginPre<HostState>,
    warm: std::sync::Mutex<Warm>,
    policy: Arc<Policy>,
    pub sha256: String,
    pub size: usize,
    /// Whether this start compiled the component (false: loaded from the cache).
    pub compiled: bool,
}

impl Runtime {
    /// Load `wasm` under `policy`, compiling it or reusing the compiled copy in `cache`.
    pub fn load(wasm: &[u8], policy: Policy, cache: Option<&Path>) -> Result<Runtime> {
        Self::load_digested(wasm, &hex(&Sha256::digest(wasm)), policy, cache)
    }

    /// The component built into this host: compiled at build time (build.rs) when this
    /// host runs where it was built, so even a first start compiles nothing.
    pub fn load_built_in(policy: Policy, cache: Option<&Path>) -> Result<Runtime> {
        Self::load_with(crate::COMPONENT, crate::COMPONENT_SHA256, Some(crate::COMPONENT_PRECOMPILED), policy, cache)
    }

    /// As `load`, for a component whose sha256 is known.
    pub fn load_digested(wasm: &[u8], sha256: &str, policy: Policy, cache: Option<&Path>) -> Result<Runtime> {
        Self::load_with(wasm, sha256, None, policy, cache)
    }

    /// As `load_digested`, trying `precompiled` (this engine's compiled form of `wasm`) first.
    fn load_with(wasm: &[u8], sha256: &str, precompiled: Option<&[u8]>, policy: Policy, cache: Option<&Path>) -> Result<Runtime> {
        let engine = Engine::new(&engine::config())?;
        let sha256 = sha256.to_string();
        let (component, compiled) = compile_cached(&engine, wasm, &sha256, precompiled, cache).map_err(|e| {
            // wasmtime's own error ends in a dump of the bytes it read: keep its first line.
            let first = e.to_string().lines().next().unwrap_or("").to_string();
            anyhow::anyhow!("cannot load the component: it is not a WebAssembly component this host can compile ({first})")
        })?;
        check_world(&engine, &component)?;
        let mut linker = Linker::<HostState>::new(&engine);
        // Exactly the granted imports: our spawn, and wasi:filesystem (types, preopens).
        wit_spawn::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)?;
        wasmtime_wasi::p2::bindings::sync::filesystem::types::add_to_linker::<HostState, WasiFilesystem>(&mut linker, <HostState as WasiFilesystemView>::filesystem)?;
        wasmtime_wasi::p2::bindings::filesystem::preopens::add_to_linker::<HostState, WasiFilesystem>(&mut linker, <HostState as WasiFilesystemView>::filesystem)?;
        trace::trace_filesystem(&mut linker)?;
        let pre = linker
            .instantiate_pre(&component)
            .map_err(|e| anyhow::anyhow!("the component asks for an import this host does not grant: {e}"))?;
        let pre = PluginPre::new(pre)?;
        Ok(Runtime { engine, component, pre, warm: Default::default(), policy: Arc::new(policy), sha256, size: wasm.len(), compiled })
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub fn component(&self) -> &Component {
        &self.component
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// A call's host state: the policy's folders opened now, as the call starts, so a call
    /// sees the folders as they are then, even in an instance made ahead (`ready_next`).
    fn host_state(&self, on_first_spawn: Option<OnFirstSpawn>) -> Result<HostState> {
        let mut b = WasiCtx::builder();
        // Deny by default: no env, args, stdio or network; only the policy's folders.
        b.allow_blocking_current_thread(BLOCK_CURRENT_THREAD);
        for p in self.policy.preopens() {
            let guest = p.path.to_str().context("preopen paths must be UTF-8")?;
            b.preopened_dir(&p.path, guest, FsPerms::ReadWrite)?;
        }
        Ok(self.host_state_with(b.build(), on_first_spawn))
    }

    fn host_state_with(&self, wasi: WasiCtx, on_first_spawn: Option<OnFirstSpawn>) -> HostState {
        HostState {
            wasi,
            table: ResourceTable::new(),
            policy: self.policy.clone(),
            trace: Trace::default(),
            fds: BTreeMap::new(),
            regular: BTreeSet::new(),
            kill_at: KillAt::from_env(),
            spawns: 0,
            renames: 0,
            on_first_spawn,
            limits: wasmtime::StoreLimitsBuilder::new().memory_size(MEMORY_LIMIT).trap_on_grow_failure(true).build(),
        }
    }

    fn store(&self, on_first_spawn: Option<OnFirstSpawn>) -> Result<Store<HostState>> {
        Ok(bounded_store(&self.engine, self.host_state(on_first_spawn)?))
    }

    /// A fresh instance for one call: the one `ready_next` made, given this call's host
    /// state, else one made now. An instance made ahead has answered no call and holds no
    /// folder: the folders come with the call's host state, opened as the call starts.
    fn instance(&self, on_first_spawn: Option<OnFirstSpawn>) -> Result<(Store<HostState>, Plugin)> {
        let state = self.host_state(on_first_spawn)?;
        match self.warm().spare.take() {
            Some((mut store, plugin)) => {
                *store.data_mut() = state;
                Ok((store, plugin))
            }
            None => {
                let mut store = bounded_store(&self.engine, state);
                let plugin = self.pre.instantiate(&mut store)?;
                Ok((store, plugin))
            }
        }
    }

    /// A call's store, done with: a long-lived host drops it in `ready_next`, after the
    /// answer is out (unmapping its memory is ~30-50 µs); others drop it here.
    fn spent(&self, store: Store<HostState>) {
        let mut warm = self.warm();
        let older = if warm.on { warm.spent.replace(store) } else { Some(store) };
        drop(warm);
        drop(older);
    }

    fn warm(&self) -> std::sync::MutexGuard<'_, Warm> {
        self.warm.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// For a one-shot call: its spent store is kept, not dropped before the answer goes
    /// out (unmapping it is ~50 µs); the process's exit frees it.
    pub fn keep_spent(&self) {
        self.warm().on = true;
    }

    /// For a long-lived host (the MCP server), once an answer is out: drop the last call's
    /// store and make the next call's instance, so neither is on that call's path (the
    /// OpenCode bridge's worker does the same). A failure here is left for the next call,
    /// which makes its instance itself and reports what went wrong.
    pub fn ready_next(&self) {
        let spent = {
            let mut warm = self.warm();
            warm.on = true;
            warm.spent.take()
        };
        drop(spent);
        if self.warm().spare.is_some() {
            return;
        }
        let mut store = bounded_store(&self.engine, self.host_state_with(WasiCtx::builder().build(), None));
        if let Ok(plugin) = self.pre.instantiate(&mut store) {
            self.warm().spare = Some((store, plugin));
        }
    }

    pub fn describe(&self) -> Result<String> {
        let mut store = self.store(None)?;
        let plugin = self.pre.instantiate(&mut store)?;
        in_tokio_context(|| plugin.boxd_plugin_tools().call_describe(&mut store).map_err(Into::into))
    }

    /// One tool call in a fresh instance. The outer error is a host failure (a trap); the
    /// inner one is the tool's own `{code, message, next}`.
    pub fn call(&self, tool: &str, args: &str, ctx: &CallContext) -> Result<(std::result::Result<String, ToolError>, Trace)> {
        let (r, trace) = self.call_traced(tool, args, ctx);
        Ok((r?, trace))
    }

    /// As `call`, but the trace (spawns, paths) is kept when the call traps, so the audit
    /// log still shows what a failed call touched.
    pub fn call_traced(&self, tool: &str, args: &str, ctx: &CallContext) -> (Result<std::result::Result<String, ToolError>>, Trace) {
        self.call_watched(tool, args, ctx, None)
    }

    /// As `call_traced`, with `on_first_spawn` run just before the call's first spawn (never,
    /// when the call spawns nothing). The hook is dropped when the call ends either way.
    pub fn call_watched(&self, tool: &str, args: &str, ctx: &CallContext, on_first_spawn: Option<OnFirstSpawn>) -> (Result<std::result::Result<String, ToolError>>, Trace) {
        self.traced(on_first_spawn, |store, plugin| plugin.boxd_plugin_tools().call_call(store, tool, args, &wit_context(ctx)))
    }

    /// The golden-image operation in a fresh instance, traced like a tool call.
    pub fn build_golden(&self, spec_json: &str, ctx: &CallContext) -> (Result<std::result::Result<String, ToolError>>, Trace) {
        self.traced(None, |store, plugin| plugin.boxd_plugin_operations().call_build_golden(store, spec_json, &wit_context(ctx)))
    }

    /// `f` in a fresh instance, with the trace kept whether or not it traps.
    fn traced<T>(&self, on_first_spawn: Option<OnFirstSpawn>, f: impl FnOnce(&mut Store<HostState>, &Plugin) -> wasmtime::Result<T>) -> (Result<T>, Trace) {
        let (mut store, plugin) = match self.instance(on_first_spawn) {
            Ok(s) => s,
            Err(e) => return (Err(e), Trace::default()),
        };
        let r = in_tokio_context(|| f(&mut store, &plugin)).map_err(Into::into);
        let trace = std::mem::take(&mut store.data_mut().trace);
        self.spent(store);
        (r, trace)
    }
}

fn wit_context(ctx: &CallContext) -> exports::boxd::plugin::tools::Context {
    exports::boxd::plugin::tools::Context {
        host_name: ctx.host_name.clone(),
        host_version: ctx.host_version.clone(),
        options_json: ctx.options_json.clone(),
        project: ctx.project.clone(),
        ledger: ctx.ledger.clone(),
        now_ms: ctx.now_ms,
        entropy: ctx.entropy.clone(),
        approved: ctx.approved,
        opencode_version: ctx.opencode_version.clone(),
        opencode: None,
    }
}

/// Handle bookkeeping for the filesystem trace (see trace::trace_filesystem).
impl HostState {
    /// SIGKILL this host if BOXD_HOST_KILL_AT names this point (test-only).
    pub(crate) fn kill_point(&self, before: bool, spawn: bool, n: u32) {
        if self.kill_at == Some(KillAt { before, spawn, n }) {
            crate::spawn::kill_self();
        }
    }

    /// Count one rename-at (the commit of an atomic write) and return its number.
    pub(crate) fn next_rename(&mut self) -> u32 {
        self.renames += 1;
        self.renames
    }

    /// The laptop path a descriptor names, when it is known.
    pub(crate) fn path_of(&self, rep: u32) -> Option<&str> {
        self.fds.get(&rep).map(String::as_str)
    }

    /// Whether `path` lies in the ledger preopen (and in no longer preopen inside it).
    pub(crate) fn in_ledger(&self, path: &str) -> bool {
        let p = Path::new(path);
        self.policy.preopens().iter().filter(|o| p.starts_with(&o.path)).max_by_key(|o| o.path.as_os_str().len()).is_some_and(|o| o.why == "ledger")
    }

    pub(crate) fn table(&mut self) -> &mut ResourceTable {
        &mut self.table
    }

    pub(crate) fn record_open(&mut self, base: u32, new: Option<u32>, path: &str, mode: &str) {
        let base_path = self.fds.get(&base).cloned().unwrap_or_else(|| format!("<descriptor {base}>"));
        let full = if path.is_empty() || path == "." { base_path } else { format!("{}/{}", base_path.trim_end_matches('/'), path) };
        if let Some(n) = new {
            self.fds.insert(n, full.clone());
            // A handle number is reused once its descriptor is dropped.
            self.regular.remove(&n);
        }
        self.trace.paths.push(PathRecord { path: full, mode: mode.to_string() });
    }

    pub(crate) fn remember_preopen(&mut self, rep: u32, path: String) {
        self.regular.remove(&rep);
        self.fds.insert(rep, path);
    }

    pub(crate) fn fs_view(&mut self) -> wasmtime_wasi::filesystem::WasiFilesystemCtxView<'_> {
        <Self as WasiFilesystemView>::filesystem(self)
    }
}

/// The compiled component, and whether this start compiled it. In order: the cache's copy
/// (mapped from its file: the cheapest start), else `precompiled` when this engine takes
/// those bytes, else Cranelift; either of the last two is written to the cache for the next
/// start.
fn compile_cached(engine: &Engine, wasm: &[u8], sha256: &str, precompiled: Option<&[u8]>, cache: Option<&Path>) -> Result<(Component, bool)> {
    let file = cache.map(|dir| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut h);
        dir.join(format!("{}-{:016x}.cwasm", &sha256[..16], h.finish()))
    });
    if let Some(file) = file.as_ref().filter(|f| unchanged_since_written(f)) {
        // SAFETY: the file was written by `precompile_component` of an engine with the same
        // compatibility hash (it is in the name) for the wasm with this sha256, and nothing
        // has written to it since (`unchanged_since_written`).
        if let Ok(c) = unsafe { Component::deserialize_file(engine, file) } {
            return Ok((c, false));
        }
    }
    // SAFETY: `precompiled` is build.rs's `precompile_component` of this very component with
    // the same wasmtime and configuration (engine.rs), carried in this binary; an engine that
    // does not match refuses it. Bytes we compile here are this engine's own.
    let ready = precompiled.filter(|b| !b.is_empty()).and_then(|b| unsafe { Component::deserialize(engine, b) }.ok().map(|c| (c, b)));
    let (component, bytes, compiled) = match ready {
        Some((c, b)) => (c, std::borrow::Cow::Borrowed(b), false),
        None => {
            let b = engine.precompile_component(wasm)?;
            (unsafe { Component::deserialize(engine, &b)? }, std::borrow::Cow::Owned(b), true)
        }
    };
    if let Some(file) = &file {
        std::fs::create_dir_all(file.parent().expect("the cache folder")).ok();
        if write_private(file, &bytes) {
            if let Some(s) = stamp(file) {
                write_private(&stamp_file(file), s.as_bytes());
            }
        }
    }
    Ok((component, compiled))
}

/// `path` written whole, owner-only: a temp file beside it, renamed over it.
fn write_private(path: &Path, bytes: &[u8]) -> bool {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let written = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp).and_then(|mut f| f.write_all(bytes));
    if written.is_ok() && std::fs::rename(&tmp, path).is_ok() {
        return true;
    }
    let _ = std::fs::remove_file(&tmp);
    false
}

fn stamp_file(file: &Path) -> std::path::PathBuf {
    file.with_extension("cwasm.stamp")
}

/// A cached file as this host left it: its device, inode, size and change time. Any write
/// to it since (a damaged file, one replaced or edited) changes the change time, so its
/// bytes, which become native code unchecked, are compiled again instead of run.
fn stamp(file: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(file).ok().filter(|m| m.is_file())?;
    Some(format!("{} {} {} {}.{:09}", m.dev(), m.ino(), m.len(), m.ctime(), m.ctime_nsec()))
}

fn unchanged_since_written(file: &Path) -> bool {
    stamp(file).is_some_and(|s| std::fs::read(stamp_file(file)).is_ok_and(|recorded| recorded == s.as_bytes()))
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_built_in_digest_is_the_component_s() {
        use sha2::Digest;
        assert_eq!(super::hex(&sha2::Sha256::digest(crate::COMPONENT)), crate::COMPONENT_SHA256);
    }

    #[test]
    fn a_call_outside_a_runtime_gets_a_current_thread_one_and_one_inside_keeps_its_own() {
        use tokio::runtime::{Handle, RuntimeFlavor};
        let flavor = || Handle::try_current().map(|h| h.runtime_flavor()).ok();
        assert_eq!(flavor(), None);
        assert_eq!(super::in_tokio_context(flavor), Some(RuntimeFlavor::CurrentThread));
        assert_eq!(flavor(), None, "the context ends with the call");
        let host = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let theirs = host.handle().id();
        let _entered = host.enter();
        assert_eq!(super::in_tokio_context(|| Handle::current().id()), theirs);
    }

    #[test]
    fn the_built_in_component_loads_compiled_and_junk_in_its_place_is_compiled_instead() {
        use super::Runtime;
        use crate::policy::Policy;
        // Built here, for this machine: a first start compiles nothing, and leaves the
        // compiled bytes in the cache, which the next start maps.
        let dir = std::env::temp_dir().join(format!("boxd-precompiled-{}", std::process::id()));
        let r = Runtime::load_built_in(Policy::new(), Some(&dir)).unwrap();
        assert!(!crate::COMPONENT_PRECOMPILED.is_empty() && !r.compiled);
        let cached: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "cwasm")).collect();
        assert_eq!(cached.len(), 1);
        assert!(super::unchanged_since_written(&cached[0]), "its stamp is beside it");
        assert_eq!(std::fs::read(&cached[0]).unwrap(), crate::COMPONENT_PRECOMPILED);
        let again = Runtime::load_built_in(Policy::new(), Some(&dir)).unwrap();
        assert!(!again.compiled && again.describe().unwrap().contains("boxd_status"));
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(r.describe().unwrap().contains("boxd_status"));
        // Bytes the engine refuses are never run: the component is compiled as usual.
        let r = Runtime::load_with(crate::COMPONENT, crate::COMPONENT_SHA256, Some(b"not a compiled component"), Policy::new(), None).unwrap();
        assert!(r.compiled);
        assert!(r.describe().unwrap().contains("boxd_status"));
    }
}
