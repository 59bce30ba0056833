//! The tenant secrets a job gets, as the control plane opened them for this launch:
//! variables, and read-only files in a directory of their own (`/run/secrets` in a
//! container; `$ALLOT_SECRETS_DIR` either way). The agent keeps them only while the
//! attempt runs (in the container's bundle, or the process's job directory), writes them
//! without following links, and never logs a value.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Where a container's file secrets are.
pub const CONTAINER_DIR: &str = allot_domain::secret::FILE_ROOT;
/// The variable naming the directory of a job's file secrets.
pub const DIR_ENV: &str = "ALLOT_SECRETS_DIR";

/// One secret of a launch. Its `Debug` shows no value.
#[derive(Clone)]
pub struct SecretSpec {
    pub env: Option<String>,
    /// The path asked for (below [`CONTAINER_DIR`]).
    pub file: Option<String>,
    pub value: Vec<u8>,
}

impl std::fmt::Debug for SecretSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretSpec")
            .field("env", &self.env)
            .field("file", &self.file)
            .field("value", &"<redacted>")
            .finish()
    }
}

impl SecretSpec {
    fn what(&self) -> String {
        match (&self.env, &self.file) {
            (Some(e), _) => format!("variable {e}"),
            (None, Some(f)) => format!("file {f}"),
            (None, None) => "a secret".to_owned(),
        }
    }

    /// The file's name in the secrets directory, when it is a file secret.
    fn file_name(&self) -> Result<Option<&str>, String> {
        let Some(path) = &self.file else {
            return Ok(None);
        };
        let name = path
            .strip_prefix(CONTAINER_DIR)
            .and_then(|p| p.strip_prefix('/'))
            .filter(|n| {
                !n.is_empty()
                    && *n != "."
                    && *n != ".."
                    && n.chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
            })
            .ok_or_else(|| format!("secret file `{path}` is not {CONTAINER_DIR}/NAME"))?;
        Ok(Some(name))
    }
}

/// The variables the job gets from its secrets. Refuses a launch whose secret the control
/// plane could not open (an empty value: a stored one never is).
pub fn env(secrets: &[SecretSpec]) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for s in secrets {
        if s.value.is_empty() {
            return Err(format!(
                "the job's {} could not be had: its secret is gone or cannot be opened",
                s.what()
            ));
        }
        if let Some(var) = &s.env {
            let value = String::from_utf8(s.value.clone())
                .map_err(|_| format!("the secret for variable {var} is not text"))?;
            out.push((var.clone(), value));
        }
    }
    Ok(out)
}

/// Writes the file secrets into `dir` (created 0500, files 0400, both owned by `owner`
/// when given): `Some(dir)` when there are any.
pub fn write_files(
    secrets: &[SecretSpec],
    dir: &Path,
    owner: Option<(u32, u32)>,
) -> Result<Option<PathBuf>, String> {
    let files: Vec<(&str, &SecretSpec)> = secrets
        .iter()
        .filter_map(|s| s.file_name().transpose().map(|n| n.map(|n| (n, s))))
        .collect::<Result<_, _>>()?;
    if files.is_empty() {
        return Ok(None);
    }
    let io = |e: std::io::Error| format!("the job's secrets: {}: {e}", dir.display());
    let _ = std::fs::remove_dir_all(dir);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .map_err(io)?;
    for (name, s) in files {
        let path = dir.join(name);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o400)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(io)?;
        f.write_all(&s.value).map_err(io)?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::fchown(&f, Some(uid), Some(gid)).map_err(io)?;
        }
    }
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(dir, Some(uid), Some(gid)).map_err(io)?;
    }
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o500))
        .map_err(io)?;
    Ok(Some(dir.to_owned()))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn secret(env: Option<&str>, file: Option<&str>, value: &str) -> SecretSpec {
        SecretSpec {
            env: env.map(Into::into),
            file: file.map(Into::into),
            value: value.as_bytes().to_vec(),
        }
    }

    #[test]
    fn variables_and_files_are_delivered_and_a_missing_value_refuses_the_launch() {
        let list = [
            secret(Some("DB_PASSWORD"), None, "hunter2"),
            secret(None, Some("/run/secrets/tls.key"), "KEY"),
        ];
        assert_eq!(
            env(&list).expect("env"),
            [("DB_PASSWORD".to_owned(), "hunter2".to_owned())]
        );
        let dir = tempfile::tempdir().expect("dir");
        let out = write_files(&list, &dir.path().join("secrets"), None)
            .expect("written")
            .expect("a directory");
        assert_eq!(
            std::fs::read_to_string(out.join("tls.key")).expect("file"),
            "KEY"
        );
        let mode = |p: &Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode(&out.join("tls.key")), 0o400);
        assert_eq!(mode(&out), 0o500);
        assert!(
            format!("{list:?}").contains("<redacted>") && !format!("{list:?}").contains("hunter2")
        );

        let gone = [secret(Some("A"), None, "")];
        assert!(env(&gone).expect_err("refused").contains("variable A"));
        let escape = [secret(None, Some("/run/secrets/../etc"), "x")];
        assert!(write_files(&escape, &dir.path().join("s2"), None).is_err());
    }
}
