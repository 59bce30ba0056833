//! Validation errors that name the offending field.

use serde::Serialize;

/// One invalid field: a JSON-pointer-like path (`gpus`, `command[0]`, `env.FOO`) and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FieldError {
    pub field: String,
    pub reason: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// A request that broke one or more rules; every broken rule is listed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid input: {}", .0.iter().map(|e| format!("{}: {}", e.field, e.reason)).collect::<Vec<_>>().join("; "))]
pub struct ValidationError(pub Vec<FieldError>);

impl ValidationError {
    pub fn single(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self(vec![FieldError::new(field, reason)])
    }
}

/// Collects field errors and turns into a `Result` at the end.
#[derive(Debug, Default)]
pub struct Violations(Vec<FieldError>);

impl Violations {
    pub fn push(&mut self, field: impl Into<String>, reason: impl Into<String>) {
        self.0.push(FieldError::new(field, reason));
    }

    pub fn check(&mut self, ok: bool, field: impl Into<String>, reason: impl Into<String>) {
        if !ok {
            self.push(field, reason);
        }
    }

    pub fn into_result(self) -> Result<(), ValidationError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(ValidationError(self.0))
        }
    }
}
