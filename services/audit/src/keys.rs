//! Checkpoint keys over time. Each key has a validity period; the signer in force at a
//! moment is the valid key that started last, so rotating is adding a key whose period
//! starts later (and, once every replica has it, ending the old key's period).
//!
//! One key per line, `#` starts a comment:
//!
//! ```text
//! PRIVATE+KEY+allot.example+1a2b3c4d+AQ… not-before=2026-01-01T00:00:00Z not-after=2027-01-01T00:00:00Z
//! allot.example+1a2b3c4d+AU…            not-before=2026-01-01T00:00:00Z not-after=2027-01-01T00:00:00Z
//! ```
//!
//! Signer keys (`PRIVATE+KEY+…`) belong in a file or the environment of the control plane
//! only; the verifier lines are what auditors and bundles carry. `not-before` is inclusive,
//! `not-after` exclusive; either may be left out (open-ended).

use chrono::{DateTime, SecondsFormat, Utc};

use crate::note::{NoteError, NoteSigner, Signer, Verifier};

/// A key and the period in which it may sign.
#[derive(Debug, Clone)]
pub struct Period<K> {
    pub key: K,
    pub not_before: Option<DateTime<Utc>>,
    pub not_after: Option<DateTime<Utc>>,
}

impl<K> Period<K> {
    pub fn open(key: K) -> Self {
        Self {
            key,
            not_before: None,
            not_after: None,
        }
    }

    pub fn contains(&self, at: DateTime<Utc>) -> bool {
        self.not_before.is_none_or(|b| b <= at) && self.not_after.is_none_or(|a| at < a)
    }

    fn suffix(&self) -> String {
        let mut out = String::new();
        let fmt = |t: DateTime<Utc>| t.to_rfc3339_opts(SecondsFormat::AutoSi, true);
        if let Some(b) = self.not_before {
            out.push_str(&format!(" not-before={}", fmt(b)));
        }
        if let Some(a) = self.not_after {
            out.push_str(&format!(" not-after={}", fmt(a)));
        }
        out
    }
}

/// Parses the lines of a key file with `parse_key` for the key column.
fn parse_lines<K>(
    text: &str,
    parse_key: impl Fn(&str) -> Result<K, NoteError>,
) -> Result<Vec<Period<K>>, NoteError> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let at = |msg: String| NoteError::Key(format!("line {}: {msg}", n + 1));
        let mut words = line.split_whitespace();
        let key = parse_key(words.next().unwrap_or("")).map_err(|e| at(e.to_string()))?;
        let mut period = Period::open(key);
        for word in words {
            let (name, value) = word.split_once('=').ok_or_else(|| {
                at(format!(
                    "expected not-before=TIME or not-after=TIME, got `{word}`"
                ))
            })?;
            let slot = match name {
                "not-before" => &mut period.not_before,
                "not-after" => &mut period.not_after,
                _ => return Err(at(format!("unknown attribute `{name}`"))),
            };
            *slot = Some(
                DateTime::parse_from_rfc3339(value)
                    .map_err(|e| at(format!("{name}: `{value}` is not an RFC 3339 time: {e}")))?
                    .with_timezone(&Utc),
            );
        }
        if let (Some(b), Some(a)) = (period.not_before, period.not_after)
            && a <= b
        {
            return Err(at("not-after must be later than not-before".into()));
        }
        out.push(period);
    }
    if out.is_empty() {
        return Err(NoteError::Key("no key in the key file".into()));
    }
    Ok(out)
}

/// The control plane's signing keys.
#[derive(Debug)]
pub struct SigningKeys {
    keys: Vec<Period<Box<dyn NoteSigner>>>,
}

impl SigningKeys {
    /// From a key file's text (private keys held in memory).
    pub fn parse(text: &str) -> Result<Self, NoteError> {
        let keys = parse_lines(text, Signer::from_skey)?;
        Ok(Self::from_signers(
            keys.into_iter()
                .map(|p| Period {
                    key: Box::new(p.key) as Box<dyn NoteSigner>,
                    not_before: p.not_before,
                    not_after: p.not_after,
                })
                .collect(),
        ))
    }

    /// From signers held anywhere, e.g. an HSM or KMS behind [`NoteSigner`].
    pub fn from_signers(keys: Vec<Period<Box<dyn NoteSigner>>>) -> Self {
        Self { keys }
    }

    pub fn single(signer: Signer) -> Self {
        Self::from_signers(vec![Period::open(Box::new(signer))])
    }

    /// The key to sign with at `at`: of the keys valid then, the one that started last.
    pub fn active(&self, at: DateTime<Utc>) -> Result<&dyn NoteSigner, NoteError> {
        self.keys
            .iter()
            .filter(|p| p.contains(at))
            .max_by_key(|p| p.not_before)
            .map(|p| p.key.as_ref())
            .ok_or_else(|| NoteError::Key(format!("no audit signing key is valid at {at}")))
    }

    /// The verifier keys with their periods, for auditors and bundles.
    pub fn public(&self) -> TrustedKeys {
        TrustedKeys {
            keys: self
                .keys
                .iter()
                .map(|p| Period {
                    key: p.key.verifier(),
                    not_before: p.not_before,
                    not_after: p.not_after,
                })
                .collect(),
        }
    }
}

/// Verifier keys with their periods.
#[derive(Debug, Clone)]
pub struct TrustedKeys {
    keys: Vec<Period<Verifier>>,
}

impl From<Verifier> for TrustedKeys {
    fn from(v: Verifier) -> Self {
        Self {
            keys: vec![Period::open(v)],
        }
    }
}

impl TrustedKeys {
    pub fn parse(text: &str) -> Result<Self, NoteError> {
        Ok(Self {
            keys: parse_lines(text, Verifier::from_vkey)?,
        })
    }

    /// The key file text (verifier lines with their periods).
    pub fn to_text(&self) -> String {
        self.keys
            .iter()
            .map(|p| format!("{}{}\n", p.key.vkey(), p.suffix()))
            .collect()
    }

    pub fn verifiers(&self) -> Vec<Verifier> {
        self.keys.iter().map(|p| p.key.clone()).collect()
    }

    pub fn contains(&self, v: &Verifier) -> bool {
        self.keys.iter().any(|p| p.key.vkey() == v.vkey())
    }

    /// Checks that one of `signers` (name, id) was valid at `at`; names the problem if not.
    pub fn check_period(&self, signers: &[(String, u32)], at: DateTime<Utc>) -> Result<(), String> {
        let periods: Vec<&Period<Verifier>> = self
            .keys
            .iter()
            .filter(|p| {
                signers
                    .iter()
                    .any(|(n, id)| p.key.name() == n && p.key.id() == *id)
            })
            .collect();
        if periods.iter().any(|p| p.contains(at)) {
            return Ok(());
        }
        let names: Vec<String> = periods
            .iter()
            .map(|p| format!("{:08x}{}", p.key.id(), p.suffix()))
            .collect();
        Err(format!(
            "signed at {} by a key outside its validity period ({})",
            at.to_rfc3339_opts(SecondsFormat::AutoSi, true),
            names.join("; ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s)
            .expect("time")
            .with_timezone(&Utc)
    }

    #[test]
    fn the_newest_valid_key_signs_and_periods_are_checked() {
        let old = Signer::generate_system("audit.test").expect("key");
        let new = Signer::generate_system("audit.test").expect("key");
        let text = format!(
            "# rotated on 2026-06-01\n{} not-before=2026-01-01T00:00:00Z not-after=2026-06-02T00:00:00Z\n{} not-before=2026-06-01T00:00:00Z\n",
            old.skey(),
            new.skey()
        );
        let keys = SigningKeys::parse(&text).expect("parse");
        let id = |s: &dyn NoteSigner| s.verifier().id();
        assert_eq!(
            id(keys.active(t("2026-03-01T00:00:00Z")).expect("key")),
            id(&old)
        );
        // During the overlap the newer key signs.
        assert_eq!(
            id(keys.active(t("2026-06-01T12:00:00Z")).expect("key")),
            id(&new)
        );
        assert!(keys.active(t("2025-12-31T00:00:00Z")).is_err());

        let public = TrustedKeys::parse(&keys.public().to_text()).expect("round trip");
        let signed_by = |s: &Signer| vec![(s.verifier().name().to_owned(), id(s))];
        assert!(
            public
                .check_period(&signed_by(&old), t("2026-03-01T00:00:00Z"))
                .is_ok()
        );
        let late = public
            .check_period(&signed_by(&old), t("2026-07-01T00:00:00Z"))
            .expect_err("expired key");
        assert!(late.contains("outside its validity period"), "{late}");
        assert!(
            public
                .check_period(&signed_by(&new), t("2030-01-01T00:00:00Z"))
                .is_ok()
        );
    }

    #[test]
    fn bad_key_files_name_the_line() {
        let s = Signer::generate_system("audit.test").expect("key");
        for (text, want) in [
            ("".to_owned(), "no key"),
            ("nonsense".to_owned(), "line 1"),
            (
                format!("{}\n{} not-before=yesterday", s.skey(), s.skey()),
                "line 2",
            ),
            (format!("{} colour=blue", s.skey()), "unknown attribute"),
            (
                format!(
                    "{} not-before=2026-02-01T00:00:00Z not-after=2026-01-01T00:00:00Z",
                    s.skey()
                ),
                "later than",
            ),
        ] {
            let err = SigningKeys::parse(&text).expect_err(&text).to_string();
            assert!(err.contains(want), "{text}: {err}");
        }
    }
}
