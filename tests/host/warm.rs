//! A long-lived host makes the next call's instance ahead, once an answer is out
//! (Runtime::ready_next). An instance made ahead must be as fresh as one made at the call:
//! it sees the folders as they are when the call starts, a trap leaves nothing behind,
//! and calls from two threads never share one.

use std::sync::Arc;

use boxd_host::policy::Policy;

use crate::common::*;

#[test]
fn an_instance_made_ahead_sees_the_folders_as_they_are_when_the_call_starts() {
    let s = Scratch::new("warm-folders");
    let root = s.path("root");
    std::fs::write(root.join("f.txt"), "before").unwrap();
    let mut policy = Policy::new();
    policy.preopen(&root, "project").unwrap();
    let rt = probe(policy);
    let r = root.display().to_string();
    assert_eq!(ask(&rt, "read", &format!("{r}|f.txt")), "ok 6 bytes");
    rt.ready_next();
    // The folder is moved away and another made in its place after the instance was made.
    let moved = s.path("moved");
    std::fs::remove_dir(&moved).unwrap();
    std::fs::rename(&root, &moved).unwrap();
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("f.txt"), "after the move").unwrap();
    assert_eq!(ask(&rt, "read", &format!("{r}|f.txt")), "ok 14 bytes", "the call reads the folder that is there now");
    rt.ready_next();
    assert_eq!(ask(&rt, "write", &format!("{r}|new.txt")), "ok");
    assert_eq!(std::fs::read_to_string(root.join("new.txt")).unwrap(), "probe", "the write lands in the folder that is there now");
    assert!(!moved.join("new.txt").exists(), "and not in the one moved away");
}

#[test]
fn a_trap_leaves_the_next_call_a_fresh_instance() {
    let s = Scratch::new("warm-trap");
    let root = s.path("root");
    std::fs::write(root.join("f.txt"), "x").unwrap();
    let mut policy = Policy::new();
    policy.preopen(&root, "project").unwrap();
    let rt = probe(policy);
    let r = root.display().to_string();
    for _ in 0..3 {
        rt.ready_next();
        let (trapped, _) = rt.call_traced("trap", "", &Default::default());
        assert!(trapped.is_err(), "the probe traps");
        rt.ready_next();
        assert_eq!(ask(&rt, "read", &format!("{r}|f.txt")), "ok 1 bytes");
        assert_eq!(ask(&rt, "calls", ""), "1", "every call has an instance of its own");
        // A call without ready_next before it still gets an instance of its own.
        assert_eq!(ask(&rt, "read", &format!("{r}|f.txt")), "ok 1 bytes");
    }
}

#[test]
fn calls_from_two_threads_never_share_an_instance() {
    let s = Scratch::new("warm-threads");
    let root = s.path("root");
    for i in 0..2 {
        std::fs::write(root.join(format!("{i}.txt")), "x".repeat(i + 1)).unwrap();
    }
    let mut policy = Policy::new();
    policy.preopen(&root, "project").unwrap();
    let rt = Arc::new(probe(policy));
    let r = root.display().to_string();
    let threads: Vec<_> = (0..2)
        .map(|i| {
            let (rt, r) = (rt.clone(), r.clone());
            std::thread::spawn(move || {
                for _ in 0..40 {
                    assert_eq!(ask(&rt, "read", &format!("{r}|{i}.txt")), format!("ok {} bytes", i + 1));
                    assert_eq!(ask(&rt, "calls", ""), "1", "every call has an instance of its own");
                    rt.ready_next();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}
