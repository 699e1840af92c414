//! Host benchmarks (not run by the tests; `cargo bench -p boxd-host`): cold start with
//! and without the compiled-component cache, and per-call overhead of a trivial tool
//! call and of boxd_status against boxd-local. Prints times and ratios.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use boxd_host::policy::Policy;
use boxd_host::runtime::{CallContext, Runtime};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn policy(dir: &PathBuf, boxd: Option<&PathBuf>) -> Policy {
    let mut p = Policy::new();
    if let Some(b) = boxd {
        p.program("boxd", b).unwrap();
    }
    p.preopen(dir, "project").unwrap();
    p.child_env_from(std::env::vars());
    p
}

fn main() {
    let dir = std::env::temp_dir().join(format!("boxd-bench-{}", std::process::id()));
    let cache = dir.join("cache");
    // SAFETY: set before any thread starts; children of the policy inherit it.
    unsafe { std::env::set_var("BOXD_LOCAL_HOME", dir.join("boxd")) };
    std::fs::create_dir_all(&cache).unwrap();
    let wasm = boxd_host::COMPONENT;
    println!("component: {} bytes", wasm.len());

    let t = Instant::now();
    let rt = Runtime::load(wasm, policy(&dir, None), None).unwrap();
    let cold_compile = t.elapsed();
    drop(rt);
    Runtime::load(wasm, policy(&dir, None), Some(&cache)).unwrap(); // fills the cache
    let cached = median((0..5).map(|_| {
        let t = Instant::now();
        let rt = Runtime::load(wasm, policy(&dir, None), Some(&cache)).unwrap();
        assert!(!rt.compiled);
        t.elapsed()
    }).collect());
    println!("load, compiling:          {cold_compile:>10.2?}");
    println!("load, from the cache:     {cached:>10.2?}   ({:.0}x faster)", cold_compile.as_secs_f64() / cached.as_secs_f64());

    let rt = Runtime::load(wasm, policy(&dir, None), Some(&cache)).unwrap();
    let ctx = CallContext { host_name: "bench".into(), project: dir.display().to_string(), ledger: dir.display().to_string(), options_json: "{}".into(), ..Default::default() };
    let describe = median((0..200).map(|_| { let t = Instant::now(); rt.describe().unwrap(); t.elapsed() }).collect());
    let unknown = median((0..200).map(|_| { let t = Instant::now(); let _ = rt.call("boxd_nope", "{}", &ctx).unwrap(); t.elapsed() }).collect());
    println!("describe (fresh instance):{describe:>10.2?}");
    println!("trivial call (instance + argument check + error): {unknown:.2?}");

    let boxd_local = std::env::current_exe().unwrap().parent().unwrap().parent().unwrap().join("boxd-local");
    if boxd_local.exists() {
        let rt = Runtime::load(wasm, policy(&dir, Some(&boxd_local)), Some(&cache)).unwrap();
        let status = median((0..20).map(|_| { let t = Instant::now(); rt.call("boxd_status", "{}", &ctx).unwrap().0.unwrap(); t.elapsed() }).collect());
        let direct = median((0..20).map(|_| {
            let t = Instant::now();
            for args in [["machine", "list", "--json"], ["snapshots", "list", "--json"]] {
                std::process::Command::new(&boxd_local).args(args).env("BOXD_LOCAL_HOME", dir.join("boxd")).output().unwrap();
            }
            t.elapsed()
        }).collect());
        println!("boxd_status via the component: {status:.2?}; the same two boxd-local calls run directly: {direct:.2?} (overhead ratio {:.2})", status.as_secs_f64() / direct.as_secs_f64());
    } else {
        println!("(build boxd-local in the same profile to time boxd_status: cargo build --release -p boxd-local)");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
