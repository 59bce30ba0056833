//! Unpacking an image layer (a tar stream) into a root file system, the way OCI image
//! layers are applied: in order, with whiteouts (`.wh.NAME` removes `NAME`, `.wh..wh..opq`
//! empties its directory), and with nothing written outside the root whatever the layer
//! holds:
//!
//! - an entry whose path has a `..` component is refused (the layer is malformed or
//!   hostile), and a leading `/` is taken as the root's;
//! - every directory an entry is written into is resolved inside the root: a symbolic link
//!   on the way is followed as the container would see it, with absolute targets and `..`
//!   taken relative to (and clamped at) the root, so a link pointing out leads back in;
//! - a whiteout hides one name in its directory: `.wh..`, `.wh...` and `.wh.` are refused;
//! - a hard link's target is resolved the same way and must be a file already in the root;
//! - the final component is never followed: an existing link there is replaced, not
//!   written through;
//! - device nodes are skipped, owners are not applied (the root belongs to the agent's
//!   user; the container sees it as unmapped and read-only), and set-user-ID and
//!   set-group-ID bits are dropped, so no file unpacked on the node is a way to root for
//!   anyone who can reach it;
//! - every byte of the uncompressed layer is charged to a [`Quota`] as it is read (an
//!   entry's content, and its 512-byte header: a layer of a million empty files is not
//!   free), so a layer that unpacks to more than the quota allows (a decompression bomb)
//!   stops there, not after it filled the disk; and what is read of one entry's headers
//!   (the tar reader keeps long names and PAX extensions in memory) stops at
//!   [`MAX_HEADER_BYTES`].

use std::ffi::OsString;
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("entry `{0}` leaves the image's root (a `..` component)")]
    Escapes(String),
    #[error("entry `{entry}`: {message}")]
    Entry { entry: String, message: String },
    #[error("reading the layer: {0}")]
    Read(#[from] std::io::Error),
    #[error("unpacking stopped after {written} bytes: {why}")]
    Quota { written: u64, why: String },
}

/// Most bytes of headers (its own, long names, PAX extensions) read for one entry.
pub const MAX_HEADER_BYTES: u64 = 1 << 20;

/// Where the bytes an unpack reads are charged.
pub trait Quota {
    /// Takes `bytes` more; why not, when they are not to be had.
    fn take(&mut self, bytes: u64) -> Result<(), String>;
}

/// No limit (tests and callers that charge nothing).
pub struct Unlimited;

impl Quota for Unlimited {
    fn take(&mut self, _bytes: u64) -> Result<(), String> {
        Ok(())
    }
}

/// What [`Metered`] saw, shared with the loop reading entries.
#[derive(Default)]
struct Meter {
    /// Bytes charged so far.
    charged: std::cell::Cell<u64>,
    /// Bytes read since the last entry was handed out (its headers), while between
    /// entries.
    headers: std::cell::Cell<Option<u64>>,
    /// Why reading stopped, when the quota or the header cap stopped it.
    stopped: std::cell::RefCell<Option<String>>,
}

/// The uncompressed layer, each read charged to the quota.
struct Metered<'q, R> {
    inner: R,
    quota: &'q mut dyn Quota,
    meter: std::rc::Rc<Meter>,
}

impl<R: Read> Read for Metered<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        let stop = |why: String| {
            *self.meter.stopped.borrow_mut() = Some(why.clone());
            Err(std::io::Error::other(why))
        };
        if let Some(h) = self.meter.headers.get() {
            let h = h + n as u64;
            if h > MAX_HEADER_BYTES {
                return stop(format!(
                    "an entry's headers (long names, PAX extensions) pass {MAX_HEADER_BYTES} bytes"
                ));
            }
            self.meter.headers.set(Some(h));
        }
        if let Err(why) = self.quota.take(n as u64) {
            return stop(why);
        }
        self.meter.charged.set(self.meter.charged.get() + n as u64);
        Ok(n)
    }
}

/// Most symbolic links followed while resolving one path (as the kernel's `ELOOP`).
const MAX_LINKS: usize = 40;

/// The components of an entry's path, relative to the root; `..` is refused.
fn components(raw: &Path) -> Result<Vec<OsString>, UnpackError> {
    let mut out = Vec::new();
    for c in raw.components() {
        match c {
            Component::Normal(n) => out.push(n.to_owned()),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
            Component::ParentDir => return Err(UnpackError::Escapes(raw.display().to_string())),
        }
    }
    Ok(out)
}

/// Resolves the directory `dirs` (components below `root`) inside `root`, following
/// symbolic links as seen from inside the root and creating missing directories. Returns
/// the directory's resolved components.
fn resolve_dir(root: &Path, dirs: &[OsString], entry: &str) -> Result<Vec<OsString>, UnpackError> {
    let err = |message: String| UnpackError::Entry {
        entry: entry.to_owned(),
        message,
    };
    let mut resolved: Vec<OsString> = Vec::new();
    let mut todo: std::collections::VecDeque<OsString> = dirs.iter().cloned().collect();
    let mut links = 0;
    while let Some(c) = todo.pop_front() {
        if c == ".." {
            resolved.pop();
            continue;
        }
        if c == "." || c.is_empty() {
            continue;
        }
        let here: PathBuf = root.join(resolved.iter().collect::<PathBuf>()).join(&c);
        match std::fs::symlink_metadata(&here) {
            Ok(m) if m.file_type().is_symlink() => {
                links += 1;
                if links > MAX_LINKS {
                    return Err(err("too many symbolic links".into()));
                }
                let target = std::fs::read_link(&here)?;
                if target.is_absolute() {
                    resolved.clear();
                }
                let mut next: Vec<OsString> = target
                    .components()
                    .filter_map(|t| match t {
                        Component::Normal(n) => Some(n.to_owned()),
                        Component::ParentDir => Some(OsString::from("..")),
                        _ => None,
                    })
                    .collect();
                next.extend(todo.drain(..));
                todo = next.into();
            }
            Ok(m) if m.is_dir() => resolved.push(c),
            Ok(_) => {
                return Err(err(format!(
                    "`{}` is not a directory",
                    PathBuf::from(&c).display()
                )));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::DirBuilder::new().mode(0o755).create(&here)?;
                resolved.push(c);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(resolved)
}

/// Where an entry goes: its resolved directory joined with its own (unfollowed) name.
fn target(root: &Path, comps: &[OsString], entry: &str) -> Result<PathBuf, UnpackError> {
    let (name, dirs) = comps.split_last().ok_or_else(|| UnpackError::Entry {
        entry: entry.to_owned(),
        message: "empty name".into(),
    })?;
    let dir = resolve_dir(root, dirs, entry)?;
    Ok(root.join(dir.iter().collect::<PathBuf>()).join(name))
}

/// Makes sure `path` (absolute, as seen from inside the root) exists in `root` as a
/// directory (`dir`) or an empty file, resolving it as [`apply_layer`] does, so nothing
/// outside the root is created. Returns where it is on the host. What an OCI runtime
/// mounts over must exist before it starts, and a container cannot create it in its
/// read-only root.
pub fn ensure_within(root: &Path, path: &str, dir: bool) -> Result<PathBuf, UnpackError> {
    let comps = components(Path::new(path))?;
    if comps.is_empty() {
        return Ok(root.to_owned());
    }
    if dir {
        let resolved = resolve_dir(root, &comps, path)?;
        return Ok(root.join(resolved.iter().collect::<PathBuf>()));
    }
    let at = target(root, &comps, path)?;
    match std::fs::symlink_metadata(&at) {
        // A link there is the runtime's to resolve, inside the root.
        Ok(_) => Ok(at),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&at)?;
            Ok(at)
        }
        Err(e) => Err(e.into()),
    }
}

/// Removes whatever is at `path` without following it.
pub fn remove(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// A mode as applied: permission bits and sticky, never set-user-ID or set-group-ID.
fn safe_mode(mode: u32) -> u32 {
    mode & 0o1777
}

/// Applies one layer (an uncompressed tar stream) to `root`, charging `quota` for what it
/// reads. Returns the bytes charged.
pub fn apply_layer(
    root: &Path,
    layer: impl Read,
    quota: &mut dyn Quota,
) -> Result<u64, UnpackError> {
    let meter = std::rc::Rc::new(Meter::default());
    let metered = Metered {
        inner: layer,
        quota,
        meter: meter.clone(),
    };
    let applied = apply_entries(root, metered, &meter);
    let written = meter.charged.get();
    match meter.stopped.borrow_mut().take() {
        Some(why) => Err(UnpackError::Quota { written, why }),
        None => applied.map(|()| written),
    }
}

fn apply_entries(root: &Path, layer: impl Read, meter: &Meter) -> Result<(), UnpackError> {
    let mut archive = tar::Archive::new(layer);
    let mut entries = archive.entries()?;
    loop {
        meter.headers.set(Some(0));
        let Some(entry) = entries.next() else {
            break;
        };
        meter.headers.set(None);
        let mut entry = entry?;
        let raw = entry.path()?.into_owned();
        let shown = raw.display().to_string();
        let comps = components(&raw)?;
        let Some(name) = comps.last().cloned() else {
            continue; // the root itself
        };
        let name_str = name.to_string_lossy().into_owned();
        let fail = |message: String| UnpackError::Entry {
            entry: shown.clone(),
            message,
        };
        // Whiteouts.
        if name_str == ".wh..wh..opq" {
            let dir = resolve_dir(root, &comps[..comps.len() - 1], &shown)?;
            let dir = root.join(dir.iter().collect::<PathBuf>());
            for child in std::fs::read_dir(&dir)?.flatten() {
                remove(&child.path())?;
            }
            continue;
        }
        if let Some(hidden) = name_str.strip_prefix(".wh.") {
            // `.wh...` would remove the root's parent, `.wh..` and `.wh.` the directory
            // itself: what a whiteout hides is a name in its directory, nothing else.
            if matches!(hidden, "" | "." | "..") {
                return Err(UnpackError::Escapes(shown));
            }
            let mut victim = comps.clone();
            victim.pop();
            victim.push(OsString::from(hidden));
            let path = target(root, &victim, &shown)?;
            remove(&path)?;
            continue;
        }
        let path = target(root, &comps, &shown)?;
        let mode = entry.header().mode().unwrap_or(0o644);
        let kind = entry.header().entry_type();
        let existing = std::fs::symlink_metadata(&path).ok();
        // A directory over a directory keeps its contents; anything else replaces.
        if !(kind.is_dir() && existing.as_ref().is_some_and(|m| m.is_dir())) && existing.is_some() {
            remove(&path)?;
        }
        if kind.is_dir() {
            if existing.as_ref().is_none_or(|m| !m.is_dir()) {
                std::fs::DirBuilder::new().mode(0o755).create(&path)?;
            }
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(safe_mode(mode)))?;
        } else if kind.is_file() || kind == tar::EntryType::Continuous {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&path)?;
            std::io::copy(&mut entry, &mut f)?;
            f.set_permissions(std::fs::Permissions::from_mode(safe_mode(mode)))?;
        } else if kind.is_symlink() {
            let link = entry
                .link_name()?
                .ok_or_else(|| fail("a symbolic link without a target".into()))?;
            // Stored as it is: only the container resolves it, inside its own root.
            std::os::unix::fs::symlink(link.as_ref(), &path)?;
        } else if kind.is_hard_link() {
            let link = entry
                .link_name()?
                .ok_or_else(|| fail("a hard link without a target".into()))?;
            let source = target(root, &components(&link)?, &shown)?;
            match std::fs::symlink_metadata(&source) {
                Ok(m) if !m.is_dir() => std::fs::hard_link(&source, &path)?,
                Ok(_) => return Err(fail("a hard link to a directory".into())),
                Err(_) => {
                    return Err(fail(format!(
                        "a hard link to `{}`, which is not in the image",
                        link.display()
                    )));
                }
            }
        }
        // Device nodes, FIFOs and the rest are skipped: a container gets its devices from
        // the node (CDI), never from its image.
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        build(&mut b);
        b.into_inner().expect("tar")
    }

    fn file(b: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8], mode: u32) {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(mode);
        h.set_entry_type(tar::EntryType::Regular);
        // set_path refuses `..`: write the raw name, as a hostile layer would.
        h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
        h.set_cksum();
        b.append(&h, data).expect("append");
    }

    fn link(b: &mut tar::Builder<Vec<u8>>, kind: tar::EntryType, path: &str, target: &str) {
        let mut h = tar::Header::new_gnu();
        h.set_size(0);
        h.set_mode(0o777);
        h.set_entry_type(kind);
        h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
        h.as_old_mut().linkname[..target.len()].copy_from_slice(target.as_bytes());
        h.set_cksum();
        b.append(&h, &[][..]).expect("append");
    }

    fn outside_is_untouched(outside: &Path) {
        let entries: Vec<_> = std::fs::read_dir(outside)
            .expect("read")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(entries, ["keep"], "nothing was written outside the root");
        assert_eq!(
            std::fs::read_to_string(outside.join("keep")).expect("read"),
            "original"
        );
    }

    fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path().join("rootfs");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&root).expect("mkdir");
        std::fs::create_dir_all(&outside).expect("mkdir");
        std::fs::write(outside.join("keep"), "original").expect("write");
        (dir, root, outside)
    }

    #[test]
    fn dot_dot_entries_are_refused() {
        let (_d, root, outside) = setup();
        let l = layer(|b| file(b, "../outside/keep", b"pwned", 0o644));
        assert!(matches!(
            apply_layer(&root, &l[..], &mut Unlimited),
            Err(UnpackError::Escapes(_))
        ));
        let l = layer(|b| file(b, "a/../../outside/new", b"pwned", 0o644));
        assert!(apply_layer(&root, &l[..], &mut Unlimited).is_err());
        outside_is_untouched(&outside);
    }

    #[test]
    fn links_pointing_out_lead_back_into_the_root() {
        let (_d, root, outside) = setup();
        let abs = outside.display().to_string();
        let l = layer(|b| {
            // An absolute link out, a relative one climbing out, then files through them.
            link(b, tar::EntryType::Symlink, "abs", &abs);
            link(
                b,
                tar::EntryType::Symlink,
                "rel",
                "../../../../../../outside",
            );
            file(b, "abs/keep", b"pwned", 0o644);
            file(b, "rel/new", b"pwned", 0o644);
            // Replacing a link does not write through it.
            link(b, tar::EntryType::Symlink, "direct", &format!("{abs}/keep"));
            file(b, "direct", b"pwned", 0o644);
        });
        apply_layer(&root, &l[..], &mut Unlimited).expect("contained");
        outside_is_untouched(&outside);
        // What went through the links landed inside.
        assert_eq!(
            std::fs::read_to_string(root.join(abs.trim_start_matches('/')).join("keep"))
                .expect("inside"),
            "pwned"
        );
        assert_eq!(
            std::fs::read_to_string(root.join("outside/new")).expect("inside"),
            "pwned"
        );
        assert!(
            std::fs::symlink_metadata(root.join("direct"))
                .expect("direct")
                .is_file()
        );
    }

    #[test]
    fn hard_links_reach_only_files_in_the_root() {
        let (_d, root, outside) = setup();
        let abs = outside.join("keep").display().to_string();
        let l = layer(|b| link(b, tar::EntryType::Link, "stolen", &abs));
        assert!(
            apply_layer(&root, &l[..], &mut Unlimited).is_err(),
            "no such file in the root"
        );
        let l = layer(|b| link(b, tar::EntryType::Link, "stolen", "../outside/keep"));
        assert!(apply_layer(&root, &l[..], &mut Unlimited).is_err());
        outside_is_untouched(&outside);
        let l = layer(|b| {
            file(b, "bin/tool", b"x", 0o755);
            link(b, tar::EntryType::Link, "bin/alias", "bin/tool");
        });
        apply_layer(&root, &l[..], &mut Unlimited).expect("an ordinary hard link");
        assert_eq!(std::fs::read(root.join("bin/alias")).expect("read"), b"x");
    }

    #[test]
    fn a_whiteout_hides_a_name_never_the_root_or_what_is_above_it() {
        for hostile in [
            ".wh...",
            "etc/.wh...",
            ".wh..",
            "etc/.wh..",
            ".wh.",
            "a/b/.wh.",
        ] {
            let (_d, root, outside) = setup();
            std::fs::create_dir_all(root.join("etc")).expect("mkdir");
            std::fs::write(root.join("etc/keep"), "x").expect("write");
            let l = layer(|b| file(b, hostile, b"", 0o644));
            assert!(
                matches!(
                    apply_layer(&root, &l[..], &mut Unlimited),
                    Err(UnpackError::Escapes(_))
                ),
                "{hostile} is refused"
            );
            outside_is_untouched(&outside);
            assert!(root.join("etc/keep").exists(), "{hostile} removed nothing");
        }
    }

    #[test]
    fn whiteouts_and_set_user_id_bits() {
        let (_d, root, _outside) = setup();
        let l = layer(|b| {
            file(b, "etc/a", b"1", 0o644);
            file(b, "etc/b", b"2", 0o644);
            file(b, "opt/x/y", b"3", 0o644);
            file(b, "bin/su", b"#!", 0o4755);
        });
        apply_layer(&root, &l[..], &mut Unlimited).expect("first");
        let mode = std::fs::metadata(root.join("bin/su"))
            .expect("su")
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o755, "set-user-ID is dropped");
        let l = layer(|b| {
            file(b, "etc/.wh.a", b"", 0o644);
            file(b, "opt/x/.wh..wh..opq", b"", 0o644);
        });
        apply_layer(&root, &l[..], &mut Unlimited).expect("second");
        assert!(!root.join("etc/a").exists());
        assert!(root.join("etc/b").exists());
        assert!(root.join("opt/x").is_dir());
        assert!(!root.join("opt/x/y").exists());
    }

    /// A quota of so many bytes.
    struct Cap(u64);

    impl Quota for Cap {
        fn take(&mut self, bytes: u64) -> Result<(), String> {
            self.0 = self.0.checked_sub(bytes).ok_or("over the cap")?;
            Ok(())
        }
    }

    #[test]
    fn a_layer_stops_at_its_quota_as_it_is_read() {
        let (_d, root, _outside) = setup();
        // One large file (what a decompression bomb unpacks to), stopped part-way.
        let big = vec![0u8; 1 << 20];
        let l = layer(|b| file(b, "big", &big, 0o644));
        let cap = 300 << 10;
        match apply_layer(&root, &l[..], &mut Cap(cap)) {
            Err(UnpackError::Quota { written, why }) => {
                assert!(written <= cap, "{written}");
                assert_eq!(why, "over the cap");
            }
            other => panic!("not stopped: {other:?}"),
        }
        let on_disk = std::fs::metadata(root.join("big")).expect("big").len();
        assert!(
            on_disk <= cap,
            "{on_disk} bytes written past a {cap}-byte quota"
        );
        // Many empty files cost their headers.
        let l = layer(|b| {
            for i in 0..100 {
                file(b, &format!("f{i}"), b"", 0o644);
            }
        });
        assert!(matches!(
            apply_layer(&root, &l[..], &mut Cap(50 * 512)),
            Err(UnpackError::Quota { .. })
        ));
        // Within its quota, a layer is charged what is read of it: headers, contents,
        // padding (up to the end-of-archive block).
        let (_d, root, _outside) = setup();
        let l = layer(|b| file(b, "small", b"12345", 0o644));
        let charged = apply_layer(&root, &l[..], &mut Cap(l.len() as u64)).expect("fits");
        assert!((1024..=l.len() as u64).contains(&charged), "{charged}");
        assert_eq!(std::fs::read(root.join("small")).expect("small"), b"12345");
    }

    #[test]
    fn a_long_name_is_not_read_into_memory_past_the_header_cap() {
        let (_d, root, _outside) = setup();
        // A GNU long-name entry as long as a decompression bomb makes it.
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        let name = vec![b'a'; (MAX_HEADER_BYTES + 4096) as usize];
        h.set_size(name.len() as u64);
        h.set_entry_type(tar::EntryType::GNULongName);
        h.as_old_mut().name[..13].copy_from_slice(b"././@LongLink");
        h.set_cksum();
        b.append(&h, &name[..]).expect("append");
        file(&mut b, "x", b"1", 0o644);
        let l = b.into_inner().expect("tar");
        match apply_layer(&root, &l[..], &mut Unlimited) {
            Err(UnpackError::Quota { why, .. }) => assert!(why.contains("headers"), "{why}"),
            other => panic!("read whole: {other:?}"),
        }
    }

    /// One entry of a hostile layer.
    #[derive(Debug, Clone)]
    enum Hostile {
        File(String, u32),
        Dir(String, u32),
        Symlink(String, String),
        HardLink(String, String),
        Whiteout(String),
        Opaque(String),
    }

    /// Paths a hostile layer would try: climbing, absolute, through links it planted.
    fn hostile_path() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        (
            any::<bool>(),
            prop::collection::vec(
                prop::sample::select(vec!["a", "b", "..", ".", "etc", "l", "m", "outside", ""]),
                1..5,
            ),
        )
            .prop_map(|(absolute, parts)| {
                let p = parts.join("/");
                if absolute { format!("/{p}") } else { p }
            })
    }

    /// Link targets: out of the root by `..`, by absolute paths (OUTSIDE is the real
    /// directory beside the root), and ordinary ones.
    fn hostile_target() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            prop::sample::select(vec![
                "..",
                "../..",
                "../outside",
                "../../outside/keep",
                "/",
                "/etc",
                "a",
                "a/b",
                "OUTSIDE",
                "OUTSIDE/keep",
                "l/keep",
                "m/..",
            ])
            .prop_map(str::to_owned),
            hostile_path(),
        ]
    }

    fn hostile_entry() -> impl proptest::strategy::Strategy<Value = Hostile> {
        use proptest::prelude::*;
        let mode = prop::sample::select(vec![0o644u32, 0o755, 0o4755, 0o6777, 0o1777, 0o000]);
        prop_oneof![
            (hostile_path(), mode.clone()).prop_map(|(p, m)| Hostile::File(p, m)),
            (hostile_path(), mode).prop_map(|(p, m)| Hostile::Dir(p, m)),
            (hostile_path(), hostile_target()).prop_map(|(p, t)| Hostile::Symlink(p, t)),
            (hostile_path(), hostile_target()).prop_map(|(p, t)| Hostile::HardLink(p, t)),
            hostile_path().prop_map(Hostile::Whiteout),
            hostile_path().prop_map(Hostile::Opaque),
        ]
    }

    fn hostile_layer(entries: &[Hostile], outside: &Path) -> Vec<u8> {
        let outside = outside.display().to_string();
        let target = |t: &str| t.replace("OUTSIDE", &outside);
        let beside = |p: &str, name: &str| match p.rsplit_once('/') {
            Some((dir, _)) => format!("{dir}/{name}"),
            None => name.to_owned(),
        };
        layer(|b| {
            for e in entries {
                match e {
                    Hostile::File(p, m) => file(b, p, b"pwned", *m),
                    Hostile::Dir(p, m) => {
                        let mut h = tar::Header::new_gnu();
                        h.set_size(0);
                        h.set_mode(*m);
                        h.set_entry_type(tar::EntryType::Directory);
                        h.as_old_mut().name[..p.len()].copy_from_slice(p.as_bytes());
                        h.set_cksum();
                        b.append(&h, &[][..]).expect("append");
                    }
                    Hostile::Symlink(p, t) => link(b, tar::EntryType::Symlink, p, &target(t)),
                    Hostile::HardLink(p, t) => link(b, tar::EntryType::Link, p, &target(t)),
                    Hostile::Whiteout(p) => {
                        let name = p.rsplit('/').next().unwrap_or("x");
                        file(b, &beside(p, &format!(".wh.{name}")), b"", 0o644);
                    }
                    Hostile::Opaque(p) => file(b, &format!("{p}/.wh..wh..opq"), b"", 0o644),
                }
            }
        })
    }

    /// Every path under `dir`, links not followed.
    fn walk(dir: &Path, out: &mut Vec<(PathBuf, std::fs::Metadata)>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let Ok(m) = std::fs::symlink_metadata(e.path()) else {
                continue;
            };
            if m.is_dir() {
                walk(&e.path(), out);
            }
            out.push((e.path(), m));
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]

        /// Whatever layers an image stacks, applying them writes nothing outside the root
        /// (no file changed, created, removed or hard-linked there), leaves no
        /// set-user-ID or set-group-ID bit, and fails cleanly rather than panicking.
        #[test]
        fn hostile_layers_stay_inside_the_root(
            layers in proptest::collection::vec(
                proptest::collection::vec(hostile_entry(), 1..12),
                1..4,
            ),
        ) {
            let (_d, root, outside) = setup();
            for entries in &layers {
                let _ = apply_layer(&root, &hostile_layer(entries, &outside)[..], &mut Unlimited);
            }
            outside_is_untouched(&outside);
            let keep = std::fs::metadata(outside.join("keep")).expect("keep");
            proptest::prop_assert_eq!(
                std::os::unix::fs::MetadataExt::nlink(&keep),
                1,
                "no hard link to a file outside"
            );
            let mut all = Vec::new();
            walk(&root, &mut all);
            for (path, m) in all {
                if !m.file_type().is_symlink() {
                    proptest::prop_assert_eq!(
                        m.permissions().mode() & 0o6000,
                        0,
                        "{} keeps a set-ID bit",
                        path.display()
                    );
                }
            }
        }
    }
}
