//! What an invalid field is: [`ValidationError`] (one field, named by its JSON path) and
//! [`ValidationErrors`] (all of one object), and [`parse_enum`], which reads a string enum
//! with an error listing the values it allows.
//!
//! The ground floor of validation: it knows no CRD type, so the types (`common`,
//! `host_auth`, `naming`, `auth`) use it for their parsers, and `validate`, which checks
//! whole objects, stands above them all. Its public path is `liteio_api::validate::…`
//! (re-exported there).

use serde::de::DeserializeOwned;

/// One invalid field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ValidationError {
    /// JSON path of the field (`spec.uuid`, `metadata.annotations[obnvmf/allocated-bytes]`).
    pub field: String,
    /// What is wrong and what is allowed.
    pub reason: String,
}

impl ValidationError {
    /// An error about `field`.
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// All invalid fields of one object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct ValidationErrors(pub Vec<ValidationError>);

impl ValidationErrors {
    /// True when some error is about `field`.
    pub fn mentions(&self, field: &str) -> bool {
        self.0.iter().any(|e| e.field == field)
    }
}

/// Values a string enum accepts, read from its JSON schema.
pub fn allowed_values<T: schemars::JsonSchema>() -> Vec<String> {
    let schema = schemars::schema_for!(T);
    let mut out = Vec::new();
    let value = schema.as_value();
    if let Some(list) = value.get("enum").and_then(|v| v.as_array()) {
        out.extend(list.iter().filter_map(|v| v.as_str().map(str::to_string)));
    }
    if let Some(list) = value.get("oneOf").and_then(|v| v.as_array()) {
        for item in list {
            if let Some(c) = item.get("const").and_then(|v| v.as_str()) {
                out.push(c.to_string());
            }
            if let Some(e) = item.get("enum").and_then(|v| v.as_array()) {
                out.extend(e.iter().filter_map(|v| v.as_str().map(str::to_string)));
            }
        }
    }
    out
}

/// Parse a string enum value, with an error naming `field` and the allowed values.
pub fn parse_enum<T: DeserializeOwned + schemars::JsonSchema>(
    field: &str,
    value: &str,
) -> Result<T, ValidationError> {
    serde_json::from_value(serde_json::Value::String(value.to_string())).map_err(|_| {
        let allowed = allowed_values::<T>()
            .iter()
            .map(|v| format!("{v:?}"))
            .collect::<Vec<_>>()
            .join(", ");
        ValidationError::new(field, format!("{value:?} is not one of {allowed}"))
    })
}
