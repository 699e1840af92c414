//! The argument check against a tool's JSON Schema, so a bad argument is refused the
//! same way in every host.

use alloc::format;
use alloc::string::String;
use serde_json::{Map, Value};

use crate::errors::{Code, ToolError, ToolResult};

fn bad(field: &str, why: &str) -> ToolError {
    ToolError::with_next(
        Code::ArgsInvalid,
        format!("argument '{field}' {why}"),
        format!("Fix '{field}' to match the tool's JSON Schema (describe shows it), then call again."),
    )
}

/// Check `args` against a schema of the shapes our tools use (object, string, boolean,
/// integer, array of strings or of objects; required; additionalProperties false; maxLength).
pub fn check(schema: &Value, args: &Value) -> ToolResult<()> {
    check_at("", schema, args)
}

fn check_at(path: &str, schema: &Value, v: &Value) -> ToolResult<()> {
    let name = if path.is_empty() { "(arguments)" } else { path };
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => {
            let Value::Object(map) = v else { return Err(bad(name, "must be a JSON object")) };
            let empty = Map::new();
            let props = schema.get("properties").and_then(Value::as_object).unwrap_or(&empty);
            for req in schema.get("required").and_then(Value::as_array).into_iter().flatten() {
                let req = req.as_str().unwrap_or("");
                if !map.contains_key(req) {
                    return Err(bad(&join(path, req), "is required"));
                }
            }
            for (k, val) in map {
                match props.get(k) {
                    Some(s) => check_at(&join(path, k), s, val)?,
                    None => return Err(bad(&join(path, k), "is not an argument of this tool")),
                }
            }
            Ok(())
        }
        Some("string") => {
            let s = v.as_str().ok_or_else(|| bad(name, "must be a string"))?;
            if let Some(max) = schema.get("maxLength").and_then(Value::as_u64) {
                if s.chars().count() as u64 > max {
                    return Err(bad(name, &format!("is longer than {max} characters")));
                }
            }
            Ok(())
        }
        Some("boolean") => v.as_bool().map(drop).ok_or_else(|| bad(name, "must be true or false")),
        Some("integer") => v.as_u64().map(drop).ok_or_else(|| bad(name, "must be a whole number")),
        Some("array") => {
            let items = v.as_array().ok_or_else(|| bad(name, "must be an array"))?;
            if let Some(max) = schema.get("maxItems").and_then(Value::as_u64) {
                if items.len() as u64 > max {
                    return Err(bad(name, &format!("has more than {max} items")));
                }
            }
            let item_schema = schema.get("items").cloned().unwrap_or(Value::Null);
            for (i, item) in items.iter().enumerate() {
                check_at(&format!("{name}[{i}]"), &item_schema, item)?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() { key.into() } else { format!("{path}.{key}") }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn argument_errors_name_the_field() {
        let schema = (crate::tools::registry::find("boxd_image").unwrap().schema)();
        let e = check(&schema, &json!({"work": "w1"})).unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (Code::ArgsInvalid, "argument 'name' is required"));
        let e = check(&schema, &json!({"work": 7, "name": "x"})).unwrap_err();
        assert_eq!(e.message, "argument 'work' must be a string");
        let e = check(&schema, &json!({"work": "w", "name": "x", "force": true})).unwrap_err();
        assert_eq!(e.message, "argument 'force' is not an argument of this tool");
        assert!(check(&schema, &json!({"work": "w", "name": "x"})).is_ok());
    }
}
