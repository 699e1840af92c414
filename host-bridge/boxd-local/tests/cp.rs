//! `machine cp`: both directions, `-` for stdin/stdout, `-r`, the home mapping, staging,
//! and refusing paths and symlinks that lead out of the machine home.

mod common;
use common::*;

#[test]
fn upload_and_download_files() {
    let h = Home::new("cp");
    h.ok(&["machine", "new", "c"]);
    let home = h.machine_home("c");
    let local = h.dir.join("local.txt");
    std::fs::write(&local, "payload\n").unwrap();

    let v = h.json(&["machine", "cp", local.to_str().unwrap(), "c:work/in.txt"]);
    assert_eq!(v, serde_json::json!({"bytes": 8, "files": 1}));
    assert_eq!(std::fs::read_to_string(home.join("work/in.txt")).unwrap(), "payload\n");
    assert!(!home.join("work/in.txt.boxd-upload.tmp").exists(), "staging file renamed away");

    // /home/boxd/... maps into the home; a folder target takes the source's name.
    h.ok(&["cp", local.to_str().unwrap(), "c:/home/boxd/work"]);
    assert!(home.join("work/local.txt").exists());

    let out = h.dir.join("out.txt");
    h.ok(&["machine", "cp", "c:~/work/in.txt", out.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "payload\n");

    // `-` is stdin / stdout, byte for byte.
    let data: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    let r = h.run_in(&["machine", "cp", "-", "c:bin.dat"], &data);
    assert_eq!(r.code, 0, "{}", r.err);
    assert_eq!(std::fs::read(home.join("bin.dat")).unwrap(), data);
    let r = h.run(&["machine", "cp", "c:bin.dat", "-", "--json"]);
    assert!(r.raw == data, "stdout carries only the file");

    assert!(h.fails(&["machine", "cp", "c:missing", out.to_str().unwrap()]).starts_with("error: c:missing"));
    assert!(h.fails(&["machine", "cp", "c:work", out.to_str().unwrap()]).contains("use -r"));
    assert!(h.fails(&["machine", "cp", "a.txt", "b.txt"]).contains("VM:path"));
    assert_eq!(h.fails(&["machine", "cp", "x.txt", "nope:f"]), "error: VM 'nope' not found");
}

#[test]
fn recursive_copies() {
    let h = Home::new("cp-r");
    h.ok(&["machine", "new", "c"]);
    let home = h.machine_home("c");
    let tree = h.dir.join("tree");
    std::fs::create_dir_all(tree.join("sub/deeper")).unwrap();
    std::fs::write(tree.join("top"), "t").unwrap();
    std::fs::write(tree.join("sub/deeper/leaf"), "l").unwrap();
    std::os::unix::fs::symlink("top", tree.join("link")).unwrap();

    let v = h.json(&["machine", "cp", "-r", tree.to_str().unwrap(), "c:up"]);
    assert_eq!(v["files"], 2);
    assert_eq!(std::fs::read_to_string(home.join("up/sub/deeper/leaf")).unwrap(), "l");
    assert_eq!(std::fs::read_link(home.join("up/link")).unwrap().to_str(), Some("top"));

    let back = h.dir.join("back");
    h.ok(&["machine", "cp", "-r", "c:up", back.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(back.join("sub/deeper/leaf")).unwrap(), "l");
    assert!(h.fails(&["machine", "cp", tree.to_str().unwrap(), "c:up2"]).contains("use -r"));
}

#[test]
fn nothing_leads_out_of_the_home() {
    let h = Home::new("cp-escape");
    h.ok(&["machine", "new", "c"]);
    let home = h.machine_home("c");
    let outside = h.dir.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret"), "host file").unwrap();
    std::os::unix::fs::symlink(&outside, home.join("escape")).unwrap();
    std::os::unix::fs::symlink(outside.join("secret"), home.join("secret-link")).unwrap();
    let local = h.dir.join("l.txt");
    std::fs::write(&local, "x").unwrap();
    let l = local.to_str().unwrap();
    let o = h.dir.join("o.txt");
    let o = o.to_str().unwrap();

    assert!(h.fails(&["machine", "cp", "c:/etc/passwd", o]).contains("outside the machine home"));
    assert!(h.fails(&["machine", "cp", "c:../../x", o]).contains("outside the machine home"));
    assert!(h.fails(&["machine", "cp", "c:escape/secret", o]).contains("symlink"));
    assert!(h.fails(&["machine", "cp", "c:secret-link", o]).contains("symlink"));
    assert!(h.fails(&["machine", "cp", l, "c:escape/planted"]).contains("symlink"));
    assert!(h.fails(&["machine", "cp", l, "c:escape"]).contains("symlink"));
    assert!(!outside.join("planted").exists() && !outside.join("l.txt").exists());
    // Uploading onto a link that leads out is refused; the file it points at is untouched.
    assert!(h.fails(&["machine", "cp", l, "c:secret-link"]).contains("symlink"));
    assert_eq!(std::fs::read_to_string(outside.join("secret")).unwrap(), "host file");
    // A link inside the home is fine to write through the rename (it replaces the link).
    std::os::unix::fs::symlink("inner", home.join("inner-link")).unwrap();
    h.ok(&["machine", "cp", l, "c:inner-link"]);
    assert_eq!(std::fs::read_to_string(home.join("inner-link")).unwrap(), "x");
}

#[test]
fn cp_wakes_standby_and_refuses_hibernated() {
    let h = Home::new("cp-state");
    h.ok(&["machine", "new", "c"]);
    let local = h.dir.join("l.txt");
    std::fs::write(&local, "x").unwrap();
    h.ok(&["machine", "pause", "c"]);
    h.ok(&["machine", "cp", local.to_str().unwrap(), "c:f"]);
    assert_eq!(h.status("c"), "running");
    h.ok(&["machine", "hibernate", "c"]);
    assert!(h.fails(&["machine", "cp", local.to_str().unwrap(), "c:f"]).contains("machine wake c"));
}
