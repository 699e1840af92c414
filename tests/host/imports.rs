//! The built component reaches exactly what tests/expected-imports.txt lists.

use crate::common::*;

#[test]
fn component_imports_equal_the_checked_in_list() {
    let laptop = Laptop::new("imports");
    let out = laptop.host(&["audit", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let reach = stdout_json(&out);
    let mut actual: Vec<String> = Vec::new();
    for (kind, key) in [("import", "imports"), ("export", "exports")] {
        for item in reach[key].as_array().unwrap() {
            actual.push(format!("{kind} {}", item["name"].as_str().unwrap()));
        }
    }
    let expected: Vec<String> = include_str!("../expected-imports.txt")
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect();
    actual.sort();
    let mut sorted = expected.clone();
    sorted.sort();
    assert_eq!(actual, sorted, "the component's imports changed; if on purpose, update tests/expected-imports.txt");
}

#[test]
fn audit_names_programs_and_folders_from_the_policy() {
    let laptop = Laptop::new("audit");
    let out = laptop.host(&["audit"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains(&format!("boxd      -> {}", std::fs::canonicalize(boxd_local()).unwrap().display())), "{text}");
    assert!(text.contains(&format!("project   {}", laptop.project.display())), "{text}");
    assert!(text.contains(&format!("ledger    {}", laptop.ledger.display())), "{text}");
    assert!(text.contains("boxd:plugin/spawn@0.1.0"), "{text}");
}
