//! Build steps of the component.

use std::env;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

fn main() {
    build_helper();
    // The component's memory may grow to 1 GiB and no further, in every host: a hostile
    // answer (millions of tiny JSON values under the output cap) traps at the bound
    // instead of taking the laptop's memory. boxd-host also bounds its store at the same size.
    if env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("wasm32") {
        println!("cargo:rustc-link-arg=--max-memory={}", 1u64 << 30);
    }
}

/// The guest helper ships as ONE file, a zipapp (`python3 helper.pyz <command> …` runs
/// the `__main__.py` at its root), built from `guest/` into OUT_DIR and embedded by
/// `src/guest.rs`. Its sha256 names and verifies the upload, so the build is
/// deterministic: entries sorted, fixed timestamps and modes, stored uncompressed. Only
/// `.py` and `.json` files go in (no `__pycache__`, no editor files).
fn build_helper() {
    let guest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR")).join("guest");
    println!("cargo:rerun-if-changed={}", guest.display());
    println!("cargo:rerun-if-changed={}", guest.join("protocol.json").display());
    let mut files = Vec::new();
    collect(&guest, &guest, &mut files);
    files.sort();
    assert!(files.iter().any(|f| f == "__main__.py"), "guest/__main__.py is missing: the zipapp would not run");
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("helper.pyz");
    let mut zip = zip::ZipWriter::new(fs::File::create(&out).expect("create OUT_DIR/helper.pyz"));
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Stored)
        .last_modified_time(zip::DateTime::default())
        .system(zip::System::Unix)
        .unix_permissions(0o644);
    for name in &files {
        let bytes = fs::read(guest.join(name)).unwrap_or_else(|e| panic!("read guest/{name}: {e}"));
        zip.start_file(name.as_str(), options).unwrap_or_else(|e| panic!("add {name} to the helper zipapp: {e}"));
        zip.write_all(&bytes).unwrap_or_else(|e| panic!("write {name} into the helper zipapp: {e}"));
    }
    zip.finish().expect("finish the helper zipapp");
}

/// Every `.py` and `.json` file under `dir`, as `/`-separated paths relative to `root`.
fn collect(root: &Path, dir: &Path, files: &mut Vec<String>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
        let path = entry.expect("read a guest/ entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if path.is_dir() {
            if name != "__pycache__" {
                collect(root, &path, files);
            }
        } else if name.ends_with(".py") || name.ends_with(".json") {
            let rel = path.strip_prefix(root).expect("under guest/");
            let parts: Vec<&str> = rel.iter().map(|p| p.to_str().expect("guest/ file names are UTF-8")).collect();
            files.push(parts.join("/"));
        }
    }
}
