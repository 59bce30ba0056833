//! Row <-> domain conversions shared by the repositories.

use crate::StoreError;

pub(crate) fn to_i64(field: &str, v: u64) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::Corrupt(format!("{field} {v} exceeds i64")))
}

pub(crate) fn to_u64(field: &str, v: i64) -> Result<u64, StoreError> {
    u64::try_from(v).map_err(|_| StoreError::Corrupt(format!("{field} {v} is negative")))
}

pub(crate) fn to_u32(field: &str, v: i64) -> Result<u32, StoreError> {
    u32::try_from(v).map_err(|_| StoreError::Corrupt(format!("{field} {v} is out of range")))
}

pub(crate) fn parse<T: std::str::FromStr<Err = String>>(
    field: &str,
    v: &str,
) -> Result<T, StoreError> {
    v.parse()
        .map_err(|e: String| StoreError::Corrupt(format!("{field}: {e}")))
}

pub(crate) fn json<T: serde::de::DeserializeOwned>(field: &str, v: &str) -> Result<T, StoreError> {
    serde_json::from_str(v).map_err(|e| StoreError::Corrupt(format!("{field}: {e}")))
}

pub(crate) fn to_json<T: serde::Serialize>(field: &str, v: &T) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| StoreError::Corrupt(format!("{field}: {e}")))
}

/// `items` in chunks of at most `n`: rows for multi-row statements, which PostgreSQL bounds
/// at 65535 bind parameters.
pub(crate) fn chunks<T>(items: Vec<T>, n: usize) -> Vec<Vec<T>> {
    let mut out = Vec::new();
    let mut items = items.into_iter().peekable();
    while items.peek().is_some() {
        out.push(items.by_ref().take(n).collect());
    }
    out
}
