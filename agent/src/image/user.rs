//! The user an image asks to run as (its configuration's `User`: `uid`, `name`, `uid:gid`,
//! `name:group`), looked up in the image's own `/etc/passwd` and `/etc/group`, read as data
//! ([`super::inroot`]): inside its root, regular files only, at most
//! [`MAX_ACCOUNT_FILE_BYTES`] each. Blocking: call it off the async workers.

use std::path::Path;

use allot_domain::Tenant;

use super::inroot;

/// Largest `/etc/passwd` or `/etc/group` read (about 15,000 users).
pub const MAX_ACCOUNT_FILE_BYTES: u64 = 1 << 20;

/// The container uid and gid `user` names in the image at `root`; root of the container
/// (an unprivileged host uid) when it names none.
pub fn resolve(root: &Path, user: Option<&str>) -> Result<(u32, u32), String> {
    let Some(user) = user.filter(|u| !u.is_empty()) else {
        return Ok((0, 0));
    };
    let (u, g) = user.split_once(':').unwrap_or((user, ""));
    let numeric_uid = u.parse::<u32>().ok();
    let numeric_gid = g.parse::<u32>().ok();
    // The files are read only when a name (or a numeric user's own group) needs them.
    let passwd = if numeric_uid.is_none() || g.is_empty() {
        account_file(root, "/etc/passwd")?
    } else {
        None
    };
    let entry = passwd.as_deref().and_then(|p| match numeric_uid {
        Some(uid) => passwd_entry(p, |_, id| id == uid),
        None => passwd_entry(p, |name, _| name == u),
    });
    let uid = match (numeric_uid, entry) {
        (Some(uid), _) => uid,
        (None, Some((uid, _))) => uid,
        (None, None) if passwd.is_none() => {
            return Err(format!(
                "the image's user `{u}` cannot be looked up: the image has no /etc/passwd (or \
                 it is a link to nothing inside the image)"
            ));
        }
        (None, None) => return Err(format!("the image's user `{u}` is not in its /etc/passwd")),
    };
    let gid = if g.is_empty() {
        entry.map_or(uid, |(_, gid)| gid)
    } else if let Some(gid) = numeric_gid {
        gid
    } else {
        let group = account_file(root, "/etc/group")?;
        match group.as_deref().and_then(|t| group_id(t, g)) {
            Some(gid) => gid,
            None => return Err(format!("the image's group `{g}` is not in its /etc/group")),
        }
    };
    if uid >= Tenant::UID_RANGE || gid >= Tenant::UID_RANGE {
        return Err(format!(
            "the image's user {uid}:{gid} is outside the container's ids (0 to {})",
            Tenant::UID_RANGE - 1
        ));
    }
    Ok((uid, gid))
}

/// An account file of the image as text (`None`: it has none).
fn account_file(root: &Path, path: &str) -> Result<Option<String>, String> {
    let bytes = inroot::read(root, path, MAX_ACCOUNT_FILE_BYTES)
        .map_err(|e| format!("the image's user cannot be looked up: {e}"))?;
    Ok(bytes.map(|b| String::from_utf8_lossy(&b).into_owned()))
}

/// The uid and gid of the first `/etc/passwd` line `matches` (by name and uid).
fn passwd_entry(passwd: &str, matches: impl Fn(&str, u32) -> bool) -> Option<(u32, u32)> {
    passwd.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        let (name, uid, gid) = (f.first()?, f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?);
        matches(name, uid).then_some((uid, gid))
    })
}

/// The gid of group `name` in `/etc/group` text.
fn group_id(group: &str, name: &str) -> Option<u32> {
    group.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        (f.first() == Some(&name)).then(|| f.get(2)?.parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n\
                          user:x:1000:1001:user:/home/user:/bin/sh\nbroken:x:abc\n";
    const GROUP: &str = "root:x:0:\nstaff:x:50:user\n";

    fn root() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir_all(dir.path().join("etc")).expect("mkdir");
        std::fs::write(dir.path().join("etc/passwd"), PASSWD).expect("write");
        std::fs::write(dir.path().join("etc/group"), GROUP).expect("write");
        dir
    }

    #[test]
    fn names_and_numbers_are_looked_up_in_the_images_files() {
        let d = root();
        let r = |u: &str| resolve(d.path(), Some(u));
        assert_eq!(resolve(d.path(), None), Ok((0, 0)));
        assert_eq!(resolve(d.path(), Some("")), Ok((0, 0)));
        assert_eq!(r("user"), Ok((1000, 1001)));
        assert_eq!(r("1000"), Ok((1000, 1001)), "a numeric user's own group");
        assert_eq!(r("4242"), Ok((4242, 4242)), "a uid the image does not list");
        assert_eq!(r("user:staff"), Ok((1000, 50)));
        assert_eq!(r("user:7"), Ok((1000, 7)));
        assert_eq!(r("12:34"), Ok((12, 34)));
        assert!(
            r("ghost")
                .expect_err("unknown")
                .contains("not in its /etc/passwd")
        );
        assert!(r("broken").is_err());
        assert!(
            r("user:ghosts")
                .expect_err("unknown group")
                .contains("not in its /etc/group")
        );
        assert_eq!(r("nobody"), Ok((65534, 65534)));
        assert!(
            r("70000")
                .expect_err("beyond the range")
                .contains("outside")
        );
    }

    #[test]
    fn passwd_pointing_at_a_host_file_or_device_is_not_read() {
        let d = root();
        let passwd = d.path().join("etc/passwd");
        std::fs::remove_file(&passwd).expect("rm");
        // The host's own account file, and a device that never ends.
        let host = tempfile::NamedTempFile::new().expect("host file");
        std::fs::write(host.path(), "user:x:7:7::/:/bin/sh\n").expect("write");
        std::os::unix::fs::symlink(host.path(), &passwd).expect("link");
        let e = resolve(d.path(), Some("user")).expect_err("the host's file is not read");
        assert!(e.contains("no /etc/passwd"), "{e}");
        std::fs::remove_file(&passwd).expect("rm");
        std::os::unix::fs::symlink("/dev/zero", &passwd).expect("link");
        let e = resolve(d.path(), Some("user")).expect_err("/dev/zero is not read");
        assert!(e.contains("no /etc/passwd"), "{e}");
        // Inside the root, a file too large is refused rather than read.
        std::fs::remove_file(&passwd).expect("rm");
        std::fs::write(&passwd, vec![b'a'; MAX_ACCOUNT_FILE_BYTES as usize + 1]).expect("big");
        let e = resolve(d.path(), Some("user")).expect_err("too large");
        assert!(e.contains("larger than"), "{e}");
        // A numeric user and group need no file at all.
        assert_eq!(resolve(d.path(), Some("5:6")), Ok((5, 6)));
    }
}
