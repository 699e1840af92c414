//! Saving a snapshot, and telling whose version the save made. boxd has no "create only if
//! absent": a save under a name someone made after our last look becomes a new version of
//! their snapshot (and machines booted from that name then get ours). So a save asks for
//! its JSON answer and reads the version it made: only `v1` is a snapshot of our own.

use alloc::format;
use alloc::string::{String, ToString};
use serde_json::Value;

use super::{argv, first_json, Boxd, Failure};
use crate::caps::Programs;

/// `v3` → 3; anything else (empty, `latest`, `v0`, `3`) → None.
pub fn version_number(v: &str) -> Option<u32> {
    v.strip_prefix('v').filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())).and_then(|n| n.parse().ok()).filter(|n| *n >= 1)
}

/// Which version of a snapshot name a save that exited 0 made, as far as boxd says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Made {
    /// `v1`: the name held nothing when the save ran; the snapshot is the save's own.
    First,
    /// The save's answer says it made `vN`, N > 1: the name held a snapshot already (one
    /// made after our last look), and the save added a version to it.
    Later(u32),
    /// The save's answer named no version, and the listing after it shows the name at
    /// `vN`, N > 1: more than one save went into the name, which one is ours is not known.
    Shared(u32),
    /// Neither the answer nor the listing named a version. `retry`: the listing failed (a
    /// later look may tell); else boxd answered without a version we can read.
    Unknown { why: String, retry: bool },
}

impl<P: Programs> Boxd<'_, P> {
    /// `snapshots save VM NAME --json`; the version its answer names (`{"name","version"}`,
    /// as boxd-local prints), or None when it printed no JSON (the real CLI is documented
    /// to print nothing), garbage, another name, or a version we cannot read.
    pub fn snapshot_save(&mut self, machine: &str, snapshot: &str) -> Result<Option<u32>, Failure> {
        // Saving blocks until the capture lands; give it the long timeout.
        let out = self.run(argv(&["snapshots", "save", machine, snapshot, "--json"]), None, self.timeout_ms.saturating_mul(5))?;
        let v = first_json(&out.stdout).filter(Value::is_object);
        let named = |v: &Value| v.get("name").and_then(Value::as_str).is_none_or(|n| n == snapshot);
        Ok(v.filter(|v| named(v)).and_then(|v| version_number(v.get("version")?.as_str()?)))
    }

    /// Which version a save of `name` that exited 0 made: its answer's, else one listing's
    /// (a listing shows the newest ready version, and ours was ready when the save
    /// answered: `v1` listed means ours is the only one).
    pub fn made(&mut self, name: &str, answered: Option<u32>) -> Made {
        match answered {
            Some(1) => return Made::First,
            Some(n) => return Made::Later(n),
            None => {}
        }
        let listed = match self.snapshots() {
            Ok(list) => list.into_iter().find(|s| s.name == name),
            Err(f) => return Made::Unknown { why: format!("the save's answer named no version, and the listing after it failed: {}", f.into_error().message), retry: true },
        };
        match listed.as_ref().map(|s| (version_number(&s.version), s)) {
            Some((Some(1), _)) => Made::First,
            Some((Some(n), _)) => Made::Shared(n),
            Some((None, s)) => Made::Unknown {
                why: format!("neither the save's answer nor boxd's listing names a version of it (listed as {:?})", crate::redact::redact(&s.version, 40)),
                retry: false,
            },
            None => Made::Unknown { why: "the save's answer named no version, and boxd's listing after it does not show the name".to_string(), retry: false },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Scripted;

    #[test]
    fn versions_are_read_strictly() {
        assert_eq!([version_number("v1"), version_number("v12")], [Some(1), Some(12)]);
        for bad in ["", "v", "v0", "1", "latest", "v1.2", "v-1", "V1", "v99999999999"] {
            assert_eq!(version_number(bad), None, "{bad}");
        }
    }

    /// The save asks for JSON and reads the version it made; an answer that names another
    /// snapshot, prints garbage or nothing names none.
    #[test]
    fn a_save_reads_the_version_its_answer_names() {
        for (answer, want) in [
            (r#"{"name":"img","version":"v1","status":"ready"}"#, Some(1)),
            ("(restarted client-utilities daemon)\n{\"name\":\"img\",\"version\":\"v3\"}", Some(3)),
            (r#"{"version":"v2"}"#, Some(2)),
            (r#"{"name":"other","version":"v1"}"#, None),
            (r#"[{"name":"img","version":"v1"}]"#, None),
            ("upstream connect error or disconnect/reset before headers", None),
            ("", None),
            (r#"{"name":"img","version":1}"#, None),
        ] {
            let mut p = Scripted::default();
            p.push_exit(0, answer, "");
            assert_eq!(Boxd::new(&mut p, 10).snapshot_save("oc-w1", "img"), Ok(want), "{answer}");
            assert_eq!(p.commands(), ["snapshots save oc-w1 img --json"]);
        }
    }

    /// Without a version in the answer, one listing decides: v1 is ours alone; a later
    /// version is shared; no readable version (or no row) is unknown, a failed listing
    /// unknown for now.
    #[test]
    fn a_save_without_a_version_is_settled_by_one_listing() {
        let mut p = Scripted::default();
        assert_eq!(Boxd::new(&mut p, 10).made("img", Some(1)), Made::First);
        assert_eq!(Boxd::new(&mut p, 10).made("img", Some(2)), Made::Later(2));
        assert!(p.commands().is_empty(), "an answer's version needs no listing");
        for (listed, want) in [
            (r#"[{"name":"img","version":"v1","status":"ready"}]"#, Made::First),
            (r#"[{"name":"img","version":"v4","status":"ready"}]"#, Made::Shared(4)),
        ] {
            let mut p = Scripted::default();
            p.push_exit(0, listed, "");
            assert_eq!(Boxd::new(&mut p, 10).made("img", None), want);
        }
        for (listed, retry) in [(r#"[{"name":"img","status":"ready"}]"#, false), ("[]", false)] {
            let mut p = Scripted::default();
            p.push_exit(0, listed, "");
            assert!(matches!(Boxd::new(&mut p, 10).made("img", None), Made::Unknown { retry: r, .. } if r == retry), "{listed}");
        }
        let mut p = Scripted::default();
        p.push_fail(1, "error: cannot connect to https://boxd.sh:9443: dns error");
        assert!(matches!(Boxd::new(&mut p, 10).made("img", None), Made::Unknown { retry: true, .. }));
    }
}
