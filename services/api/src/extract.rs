//! Request extractors that turn every malformed input into a problem naming the field.

use std::future::Future;
use std::pin::Pin;

use actix_web::dev::Payload;
use actix_web::http::header;
use actix_web::{FromRequest, HttpRequest, web};
use futures_util::StreamExt;
use serde::de::DeserializeOwned;

use crate::problem::ApiError;

/// Largest JSON body accepted, unless the app sets a [`BodyLimit`].
pub const DEFAULT_BODY_LIMIT: usize = 1024 * 1024;

/// The body-size limit for [`Json`], set as app data.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit(pub usize);

/// A JSON body deserialized strictly: `application/json` only, size-limited, errors located
/// by field path.
#[derive(Debug)]
pub struct Json<T>(pub T);

/// Turns a serde error and its path into the field it concerns and a reason.
fn locate(path: &serde_path_to_error::Path, message: &str) -> (String, String) {
    // `.` is the root; `?` marks a position serde could not name (e.g. after the last field).
    let raw = path.to_string();
    let mut field = raw
        .split('.')
        .filter(|s| !s.is_empty() && *s != "?")
        .collect::<Vec<_>>()
        .join(".");
    // serde reports unknown and missing fields at the parent: name the field itself.
    for prefix in ["unknown field `", "missing field `"] {
        if let Some(rest) = message.strip_prefix(prefix)
            && let Some(name) = rest.split('`').next()
            && !field.ends_with(name)
        {
            field = if field.is_empty() {
                name.to_owned()
            } else {
                format!("{field}.{name}")
            };
        }
    }
    // Drop serde_json's "at line 1 column 9" suffix: the field path already locates it.
    let reason = match message.rfind(" at line ") {
        Some(i) => &message[..i],
        None => message,
    };
    if field.is_empty() {
        field = "body".to_owned();
    }
    (field, reason.to_owned())
}

/// JSON numbers with no fraction (`3.0`) are integers (JSON Schema counts them so, and
/// clients and generators write them): as integers they reach integer fields.
fn integral(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Number(n) if !n.is_i64() && !n.is_u64() => {
            if let Some(f) = n.as_f64()
                && f.fract() == 0.0
            {
                // In range of one or the other, exactly (the casts saturate otherwise).
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                if (0.0..18_446_744_073_709_551_616.0).contains(&f) {
                    *v = serde_json::Value::from(f as u64);
                } else if (-9_223_372_036_854_775_808.0..0.0).contains(&f) {
                    *v = serde_json::Value::from(f as i64);
                }
            }
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(integral),
        serde_json::Value::Object(o) => o.values_mut().for_each(integral),
        _ => {}
    }
}

/// Applies a JSON merge patch (RFC 7396) to `target`: an object's members are merged
/// member by member, `null` removes one, anything else replaces.
pub(crate) fn merge_patch(target: &mut serde_json::Value, patch: &serde_json::Value) {
    use serde_json::Value;
    let Value::Object(changes) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(serde_json::Map::new());
    }
    if let Value::Object(fields) = target {
        for (key, change) in changes {
            if change.is_null() {
                fields.remove(key);
            } else {
                merge_patch(fields.entry(key.clone()).or_insert(Value::Null), change);
            }
        }
    }
}

fn located(e: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let (field, reason) = locate(e.path(), &e.inner().to_string());
    ApiError::malformed(field, reason)
}

/// Reads `value` as `T`, errors naming the field as for a body.
pub(crate) fn from_value<T: DeserializeOwned>(mut value: serde_json::Value) -> Result<T, ApiError> {
    integral(&mut value);
    serde_path_to_error::deserialize(value).map_err(located)
}

pub(crate) fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let mut value: serde_json::Value = match serde::Deserialize::deserialize(&mut de) {
        Ok(v) => v,
        // Not JSON: read again as the target, to name the field it broke off in.
        Err(_) => {
            let mut de = serde_json::Deserializer::from_slice(body);
            return Err(match serde_path_to_error::deserialize::<_, T>(&mut de) {
                Err(e) => located(e),
                Ok(_) => ApiError::malformed("body", "not valid JSON"),
            });
        }
    };
    de.end()
        .map_err(|_| ApiError::malformed("body", "unexpected data after the JSON value"))?;
    integral(&mut value);
    serde_path_to_error::deserialize(value).map_err(located)
}

impl<T: DeserializeOwned + 'static> FromRequest for Json<T> {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, ApiError>>>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let limit = req
            .app_data::<BodyLimit>()
            .map_or(DEFAULT_BODY_LIMIT, |l| l.0);
        let content_type = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| {
                v.split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_ascii_lowercase()
            });
        let declared_len = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        let mut payload = payload.take();
        Box::pin(async move {
            match content_type.as_deref() {
                Some("application/json") => {}
                Some(other) => {
                    return Err(ApiError::UnsupportedMediaType(format!(
                        "the body must be application/json, not {other}"
                    )));
                }
                None => {
                    return Err(ApiError::UnsupportedMediaType(
                        "the body must be application/json (set Content-Type)".into(),
                    ));
                }
            }
            if declared_len.is_some_and(|n| n > limit) {
                return Err(ApiError::PayloadTooLarge { limit });
            }
            let mut body = web::BytesMut::new();
            while let Some(chunk) = payload.next().await {
                let chunk = chunk.map_err(|e| ApiError::malformed("body", e.to_string()))?;
                if body.len() + chunk.len() > limit {
                    return Err(ApiError::PayloadTooLarge { limit });
                }
                body.extend_from_slice(&chunk);
            }
            if body.is_empty() {
                return Err(ApiError::malformed("body", "a JSON body is required"));
            }
            parse_json(&body).map(Json)
        })
    }
}

/// A query string deserialized strictly: unknown parameters are rejected, errors name the
/// parameter.
#[derive(Debug)]
pub struct Query<T>(pub T);

impl<T: DeserializeOwned> FromRequest for Query<T> {
    type Error = ApiError;
    type Future = std::future::Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let pairs = form_urlencoded::parse(req.query_string().as_bytes());
        let de = serde_urlencoded::Deserializer::new(pairs);
        std::future::ready(
            serde_path_to_error::deserialize(de)
                .map(Query)
                .map_err(|e| {
                    let (field, reason) = locate(e.path(), &e.inner().to_string());
                    let field = if field == "body" {
                        "query".into()
                    } else {
                        field
                    };
                    ApiError::malformed(field, reason)
                }),
        )
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        max_gpus: Option<u32>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Body {
        gpus: u32,
        quota: Option<Inner>,
    }

    fn field_of(body: &str) -> String {
        match parse_json::<Body>(body.as_bytes()) {
            Err(ApiError::Malformed { errors, .. }) => errors[0].field.clone(),
            other => panic!("expected malformed, got {other:?}"),
        }
    }

    proptest::proptest! {
        /// Any body is parsed into a request or refused as a 400 naming a field.
        #[test]
        fn any_body_is_parsed_or_refused(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            match parse_json::<crate::views::SubmitJob>(&body) {
                Ok(_) | Err(ApiError::Malformed { .. }) => {}
                Err(e) => proptest::prop_assert!(false, "{e}"),
            }
        }

        #[test]
        fn json_shaped_bodies_are_parsed_or_refused(body in "\\{(\"[a-z_]{1,12}\": ?(-?[0-9]{1,20}(\\.[0-9]{1,3})?|\"[a-z]{0,8}\"|null|true|\\[\\]), ?){0,6}\"command\": \\[\"x\"\\]\\}") {
            match parse_json::<crate::views::SubmitJob>(body.as_bytes()) {
                Ok(_) | Err(ApiError::Malformed { .. }) => {}
                Err(e) => proptest::prop_assert!(false, "{e}"),
            }
        }
    }

    #[test]
    fn errors_name_the_field() {
        assert_eq!(field_of(r#"{"gpus": -1}"#), "gpus");
        assert_eq!(field_of(r#"{"gpus": "two"}"#), "gpus");
        assert_eq!(field_of(r#"{"gpus": 1, "colour": "red"}"#), "colour");
        assert_eq!(field_of(r#"{}"#), "gpus");
        assert_eq!(
            field_of(r#"{"gpus": 1, "quota": {"max_gpus": 1.5}}"#),
            "quota.max_gpus"
        );
        assert_eq!(
            field_of(r#"{"gpus": 1, "quota": {"nope": 1}}"#),
            "quota.nope"
        );
        assert_eq!(field_of(r#"{"gpus": 1"#), "body");
        assert_eq!(field_of(r#"{"gpus": 1} trailing"#), "body");
    }
}
