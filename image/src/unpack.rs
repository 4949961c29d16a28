//! Unpacking one layer archive into an overlay-ready directory.
//!
//! The archive (tar, gzip-compressed or not: detected by its magic bytes) is read entry by entry
//! with the `tar` crate, and every entry is written by this module, not by `tar`'s own unpacker,
//! so that the rules below hold:
//!
//! - **Nothing escapes the layer.** A path with `..`, an absolute path, or a path whose parent is
//!   (through) a symbolic link is refused, and so is a hard link whose target is such a path.
//!   Symbolic links are created as they are (absolute targets included: they are resolved inside
//!   the container's root at run time), and are never followed while unpacking.
//! - **Whiteouts become overlayfs whiteouts**: `.wh.NAME` becomes a character device 0:0 named
//!   `NAME`, and `.wh..wh..opq` marks its directory opaque (`trusted.overlay.opaque=y`), so the
//!   layers stack with overlayfs exactly as the image says.
//! - **Metadata**: modes (setuid/setgid/sticky included), owners (`lchown`, we run as root), and
//!   modification times; directory modes are applied last, so a read-only directory in the image
//!   can still be filled.

use std::ffi::CString;
use std::fs::{self, File};
use std::io::{self, BufReader, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use tar::EntryType;

/// An unpacking failure, before the caller attaches the layer's digest.
#[derive(Debug)]
pub(crate) struct UnpackError(pub(crate) String);

impl From<io::Error> for UnpackError {
    fn from(e: io::Error) -> Self {
        UnpackError(e.to_string())
    }
}

fn refuse<T>(message: impl Into<String>) -> Result<T, UnpackError> {
    Err(UnpackError(message.into()))
}

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE_MARKER: &str = ".wh..wh..opq";

/// Unpacks the archive at `blob` into `dest` (an empty, existing directory). Returns the bytes
/// the layer takes (file contents plus a block per entry), the figure the cache bound counts.
pub(crate) fn unpack_layer(blob: &Path, dest: &Path) -> Result<u64, UnpackError> {
    let mut file = BufReader::new(File::open(blob)?);
    let mut magic = [0u8; 4];
    let n = read_up_to(&mut file, &mut magic)?;
    let head = io::Cursor::new(magic[..n].to_vec());
    let reader = head.chain(file);
    if n >= 2 && magic[..2] == GZIP_MAGIC {
        unpack_tar(flate2::read::MultiGzDecoder::new(reader), dest)
    } else if n >= 4 && magic == ZSTD_MAGIC {
        refuse("zstd-compressed layers are not supported (use gzip or uncompressed tar)")
    } else {
        unpack_tar(reader, dest)
    }
}

fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// A path inside the layer, checked: relative, no `..`, no root, `.` components dropped.
pub(crate) fn clean_path(raw: &Path) -> Result<PathBuf, UnpackError> {
    let mut out = PathBuf::new();
    for c in raw.components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::CurDir => {}
            Component::ParentDir => return refuse(format!("path {} contains `..`", raw.display())),
            Component::RootDir | Component::Prefix(_) => {
                return refuse(format!("path {} is absolute", raw.display()))
            }
        }
    }
    Ok(out)
}

/// Makes sure every ancestor of `rel` under `root` is a real directory (creating missing ones),
/// refusing any that is a symbolic link or not a directory.
fn ensure_parents(root: &Path, rel: &Path) -> Result<(), UnpackError> {
    let mut at = root.to_path_buf();
    let Some(parent) = rel.parent() else {
        return Ok(());
    };
    for c in parent.components() {
        at.push(c);
        match fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_symlink() => {
                return refuse(format!(
                    "{} goes through the symbolic link {}",
                    rel.display(),
                    at.strip_prefix(root).unwrap_or(&at).display()
                ))
            }
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return refuse(format!(
                    "{} has a parent that is not a directory",
                    rel.display()
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::create_dir(&at)?;
                fs::set_permissions(&at, fs::Permissions::from_mode(0o755))?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Removes whatever is at `path` (a later layer entry replaces an earlier one of this layer).
fn remove_existing(path: &Path, keep_dir: bool) -> Result<(), UnpackError> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() && keep_dir => Ok(()),
        Ok(m) if m.is_dir() => Ok(fs::remove_dir_all(path)?),
        Ok(_) => Ok(fs::remove_file(path)?),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn cstring(path: &Path) -> Result<CString, UnpackError> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| UnpackError(format!("path {} contains a NUL byte", path.display())))
}

fn mknod(path: &Path, mode: libc::mode_t, major: u32, minor: u32) -> Result<(), UnpackError> {
    let c = cstring(path)?;
    // SAFETY: `c` is a valid NUL-terminated path; mknod does not retain it.
    let rc = unsafe { libc::mknod(c.as_ptr(), mode, libc::makedev(major, minor)) };
    if rc != 0 {
        return Err(io::Error::last_os_error().into());
    }
    Ok(())
}

fn set_opaque(dir: &Path) -> Result<(), UnpackError> {
    let c = cstring(dir)?;
    let name = c"trusted.overlay.opaque";
    let value = b"y";
    // SAFETY: valid NUL-terminated strings and a 1-byte value buffer of the given length.
    let rc = unsafe {
        libc::lsetxattr(
            c.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error().into());
    }
    Ok(())
}

fn lchown(path: &Path, uid: u64, gid: u64) -> Result<(), UnpackError> {
    let (Ok(uid), Ok(gid)) = (u32::try_from(uid), u32::try_from(gid)) else {
        return refuse(format!("{}: owner out of range", path.display()));
    };
    let c = cstring(path)?;
    // SAFETY: valid NUL-terminated path.
    let rc = unsafe { libc::lchown(c.as_ptr(), uid, gid) };
    if rc != 0 {
        return Err(io::Error::last_os_error().into());
    }
    Ok(())
}

fn set_mtime(path: &Path, mtime: u64) -> Result<(), UnpackError> {
    let c = cstring(path)?;
    let secs = libc::time_t::try_from(mtime).unwrap_or(0);
    let t = libc::timespec {
        tv_sec: secs,
        tv_nsec: 0,
    };
    let times = [t, t];
    // SAFETY: valid path and a two-element timespec array, as utimensat requires.
    let rc = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error().into());
    }
    Ok(())
}

/// Per-entry cost in the size accounting (an inode and a directory slot, roughly a block).
const ENTRY_COST: u64 = 512;

fn unpack_tar(reader: impl Read, root: &Path) -> Result<u64, UnpackError> {
    let mut archive = tar::Archive::new(reader);
    let mut total = 0u64;
    // Directory modes and times are applied after every entry is written.
    let mut dirs: Vec<(PathBuf, u32, u64)> = Vec::new();
    for entry in archive.entries()? {
        let mut entry = entry?;
        let header = entry.header();
        let kind = header.entry_type();
        let raw = entry.path()?.into_owned();
        let rel = clean_path(&raw)?;
        let mode = header.mode().unwrap_or(0o644) & 0o7777;
        let uid = header.uid().unwrap_or(0);
        let gid = header.gid().unwrap_or(0);
        let mtime = header.mtime().unwrap_or(0);
        total = total.saturating_add(ENTRY_COST);
        if rel.as_os_str().is_empty() {
            // The layer's root (`./`): its mode applies to the layer dir.
            if kind == EntryType::Directory {
                dirs.push((root.to_path_buf(), mode, mtime));
            }
            continue;
        }
        if matches!(kind, EntryType::XGlobalHeader | EntryType::XHeader) {
            continue;
        }
        ensure_parents(root, &rel)?;
        let name = rel
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let dest = root.join(&rel);
        if name == OPAQUE_MARKER {
            let dir = dest.parent().unwrap_or(root);
            set_opaque(dir)?;
            continue;
        }
        if let Some(hidden) = name.strip_prefix(WHITEOUT_PREFIX) {
            if hidden.is_empty() || hidden == "." || hidden == ".." {
                return refuse(format!("bad whiteout {}", raw.display()));
            }
            let target = dest.with_file_name(hidden);
            remove_existing(&target, false)?;
            mknod(&target, libc::S_IFCHR, 0, 0)?;
            continue;
        }
        match kind {
            EntryType::Directory => {
                remove_existing(&dest, true)?;
                if !dest.is_dir() {
                    fs::create_dir(&dest)?;
                }
                lchown(&dest, uid, gid)?;
                dirs.push((dest, mode, mtime));
                continue;
            }
            EntryType::Regular | EntryType::Continuous => {
                remove_existing(&dest, false)?;
                let mut out = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .custom_flags(libc::O_NOFOLLOW)
                    .mode(0o600)
                    .open(&dest)?;
                let n = io::copy(&mut entry, &mut out)?;
                total = total.saturating_add(n);
                drop(out);
            }
            EntryType::Symlink => {
                let Some(target) = entry.link_name()? else {
                    return refuse(format!("symbolic link {} has no target", raw.display()));
                };
                remove_existing(&dest, false)?;
                std::os::unix::fs::symlink(&target, &dest)?;
                lchown(&dest, uid, gid)?;
                set_mtime(&dest, mtime)?;
                continue;
            }
            EntryType::Link => {
                let Some(target) = entry.link_name()? else {
                    return refuse(format!("hard link {} has no target", raw.display()));
                };
                let target_rel = clean_path(&target)
                    .map_err(|e| UnpackError(format!("hard link {}: {}", raw.display(), e.0)))?;
                ensure_parents(root, &target_rel)?;
                let source = root.join(&target_rel);
                match fs::symlink_metadata(&source) {
                    Ok(m) if !m.is_dir() => {}
                    _ => {
                        return refuse(format!(
                            "hard link {} points at {}, which is not a file of this layer",
                            raw.display(),
                            target_rel.display()
                        ))
                    }
                }
                remove_existing(&dest, false)?;
                // link(2) does not follow a symbolic link at `source`.
                fs::hard_link(&source, &dest)?;
                continue;
            }
            EntryType::Fifo => {
                remove_existing(&dest, false)?;
                mknod(&dest, libc::S_IFIFO, 0, 0)?;
            }
            EntryType::Char | EntryType::Block => {
                let major = entry.header().device_major()?.unwrap_or(0);
                let minor = entry.header().device_minor()?.unwrap_or(0);
                let ty = if kind == EntryType::Char {
                    libc::S_IFCHR
                } else {
                    libc::S_IFBLK
                };
                remove_existing(&dest, false)?;
                mknod(&dest, ty, major, minor)?;
            }
            other => {
                return refuse(format!(
                    "entry {} has an unsupported type {other:?}",
                    raw.display()
                ))
            }
        }
        // Files, fifos and devices: owner, then mode (chown clears setuid bits), then time.
        lchown(&dest, uid, gid)?;
        fs::set_permissions(&dest, fs::Permissions::from_mode(mode))?;
        set_mtime(&dest, mtime)?;
    }
    // Deepest first, so a parent's time is set after its children changed it.
    dirs.sort_by_key(|d| std::cmp::Reverse(d.0.components().count()));
    for (dir, mode, mtime) in dirs {
        fs::set_permissions(&dir, fs::Permissions::from_mode(mode))?;
        set_mtime(&dir, mtime)?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_with(entries: &[(&str, EntryType, &[u8], Option<&str>)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, kind, data, link) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(*kind);
            h.set_mode(if *kind == EntryType::Directory {
                0o755
            } else {
                0o644
            });
            h.set_size(data.len() as u64);
            h.set_mtime(1_700_000_000);
            // Write the name bytes directly so hostile names (`..`, absolute) survive.
            let name = h.as_old_mut();
            name.name[..path.len()].copy_from_slice(path.as_bytes());
            if let Some(l) = link {
                name.linkname[..l.len()].copy_from_slice(l.as_bytes());
            }
            h.set_cksum();
            b.append(&h, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    fn unpack_bytes(bytes: &[u8]) -> (tempfile::TempDir, Result<u64, UnpackError>) {
        let dir = tempfile::tempdir().unwrap();
        let blob = dir.path().join("blob");
        fs::write(&blob, bytes).unwrap();
        let root = dir.path().join("root");
        fs::create_dir(&root).unwrap();
        let r = unpack_layer(&blob, &root);
        (dir, r)
    }

    #[test]
    fn clean_path_refuses_escapes() {
        assert!(clean_path(Path::new("../etc/passwd")).is_err());
        assert!(clean_path(Path::new("a/../../b")).is_err());
        assert!(clean_path(Path::new("/etc/passwd")).is_err());
        assert_eq!(
            clean_path(Path::new("./a/./b")).unwrap(),
            PathBuf::from("a/b")
        );
    }

    #[test]
    fn files_dirs_links_and_whiteouts() {
        let t = tar_with(&[
            ("bin/", EntryType::Directory, b"", None),
            ("bin/busybox", EntryType::Regular, b"ELF", None),
            ("bin/sh", EntryType::Link, b"", Some("bin/busybox")),
            ("bin/ls", EntryType::Symlink, b"", Some("/bin/busybox")),
            ("etc/.wh.motd", EntryType::Regular, b"", None),
            ("var/.wh..wh..opq", EntryType::Regular, b"", None),
        ]);
        let (dir, r) = unpack_bytes(&t);
        r.unwrap();
        let root = dir.path().join("root");
        assert_eq!(fs::read(root.join("bin/busybox")).unwrap(), b"ELF");
        assert_eq!(fs::read(root.join("bin/sh")).unwrap(), b"ELF");
        assert_eq!(
            fs::read_link(root.join("bin/ls")).unwrap(),
            PathBuf::from("/bin/busybox")
        );
        use std::os::unix::fs::FileTypeExt;
        use std::os::unix::fs::MetadataExt;
        let wh = fs::symlink_metadata(root.join("etc/motd")).unwrap();
        assert!(wh.file_type().is_char_device());
        assert_eq!(wh.rdev(), 0);
        assert!(!root.join("etc/.wh.motd").exists());
        assert!(!root.join("var/.wh..wh..opq").exists());
    }

    #[test]
    fn hostile_entries_are_refused() {
        for bad in [
            tar_with(&[("../escape", EntryType::Regular, b"x", None)]),
            tar_with(&[("/abs", EntryType::Regular, b"x", None)]),
            tar_with(&[
                ("link", EntryType::Symlink, b"", Some("/tmp")),
                ("link/owned", EntryType::Regular, b"x", None),
            ]),
            tar_with(&[
                ("up", EntryType::Symlink, b"", Some("..")),
                ("up/owned", EntryType::Regular, b"x", None),
            ]),
            tar_with(&[("hl", EntryType::Link, b"", Some("../../etc/shadow"))]),
        ] {
            let (dir, r) = unpack_bytes(&bad);
            assert!(r.is_err(), "a hostile layer was unpacked");
            assert!(!dir.path().join("escape").exists());
            assert!(!Path::new("/tmp/owned").exists());
        }
    }
}
