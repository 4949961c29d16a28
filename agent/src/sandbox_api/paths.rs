//! Paths inside a sandbox, opened so they cannot leave it: the kernel resolves them beneath
//! the sandbox's directory with no symlink followed (`openat2` with `RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`), and only what the sandbox's owner owns is
//! served (a hard link to someone else's file is refused).

use std::os::fd::OwnedFd;
use std::path::{Component, Path};

use gantry_proto::{SandboxEntry, SandboxErrorKind, SandboxReply};
use rustix::fs::{fstat, openat2, statat, AtFlags, Dir, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use super::refuse;

/// Checks a relative path's shape: no absolute path, no `..` (said plainly before the kernel
/// would refuse it anyway).
pub fn check_relative(path: &str) -> Result<&str, SandboxReply> {
    if path.contains('\0') {
        return Err(refuse(
            SandboxErrorKind::BadRequest,
            "a path with a NUL byte",
        ));
    }
    let p = Path::new(path);
    for c in p.components() {
        match c {
            Component::RootDir | Component::Prefix(_) => {
                return Err(refuse(
                    SandboxErrorKind::Forbidden,
                    format!("{path:?}: paths are relative to the sandbox"),
                ))
            }
            Component::ParentDir => {
                return Err(refuse(
                    SandboxErrorKind::Forbidden,
                    format!("{path:?}: `..` may not leave the sandbox"),
                ))
            }
            _ => {}
        }
    }
    Ok(if path.is_empty() { "." } else { path })
}

fn errno_reply(path: &str, e: Errno) -> SandboxReply {
    match e {
        Errno::NOENT => refuse(
            SandboxErrorKind::NotFound,
            format!("{path:?}: no such file"),
        ),
        Errno::LOOP | Errno::XDEV => refuse(
            SandboxErrorKind::Forbidden,
            format!("{path:?} goes through a symlink or leaves the sandbox: refused"),
        ),
        Errno::NOTDIR => refuse(
            SandboxErrorKind::BadRequest,
            format!("{path:?}: not a directory"),
        ),
        Errno::ISDIR => refuse(
            SandboxErrorKind::BadRequest,
            format!("{path:?} is a directory"),
        ),
        e => refuse(SandboxErrorKind::Failed, format!("{path:?}: {e}")),
    }
}

/// The sandbox's directory, and its owner.
fn open_sandbox(sandbox: &Path) -> Result<(OwnedFd, u32), SandboxReply> {
    let fd = rustix::fs::open(
        sandbox,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
    )
    .map_err(|e| match e {
        Errno::NOENT => refuse(
            SandboxErrorKind::NotFound,
            "the task has no sandbox on this agent (never launched here, or collected)",
        ),
        e => refuse(SandboxErrorKind::Failed, format!("the sandbox: {e}")),
    })?;
    let owner = fstat(&fd)
        .map_err(|e| refuse(SandboxErrorKind::Failed, e.to_string()))?
        .st_uid;
    Ok((fd, owner))
}

/// Opens `path` beneath the sandbox (`dir`: as a directory), refusing what its owner does not
/// own.
fn open_beneath(sandbox: &Path, path: &str, dir: bool) -> Result<OwnedFd, SandboxReply> {
    let rel = check_relative(path)?;
    let (root, owner) = open_sandbox(sandbox)?;
    let mut flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NONBLOCK;
    if dir {
        flags |= OFlags::DIRECTORY;
    }
    let fd = openat2(
        &root,
        rel,
        flags,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|e| {
        // O_NOFOLLOW | O_DIRECTORY on a symlink says "not a directory": say what it is.
        let symlink = statat(&root, rel, AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Symlink);
        if symlink {
            errno_reply(path, Errno::LOOP)
        } else {
            errno_reply(path, e)
        }
    })?;
    let st = fstat(&fd).map_err(|e| refuse(SandboxErrorKind::Failed, e.to_string()))?;
    if st.st_uid != owner {
        return Err(refuse(
            SandboxErrorKind::Forbidden,
            format!("{path:?} is not owned by the task's user: refused"),
        ));
    }
    let kind = FileType::from_raw_mode(st.st_mode);
    if !dir && kind != FileType::RegularFile {
        return Err(refuse(
            SandboxErrorKind::BadRequest,
            format!("{path:?} is not a regular file"),
        ));
    }
    Ok(fd)
}

/// A regular file of the sandbox, for reading.
pub fn open_file(sandbox: &Path, path: &str) -> Result<std::fs::File, SandboxReply> {
    let fd = open_beneath(sandbox, path, false)?;
    // Reads block again (the open was non-blocking only so a FIFO could not hang it).
    let fl = rustix::fs::fcntl_getfl(&fd)
        .map_err(|e| refuse(SandboxErrorKind::Failed, e.to_string()))?;
    rustix::fs::fcntl_setfl(&fd, fl - OFlags::NONBLOCK)
        .map_err(|e| refuse(SandboxErrorKind::Failed, e.to_string()))?;
    Ok(std::fs::File::from(fd))
}

/// A page of a sandbox directory: entries by name, `offset` skipped, at most `limit`.
pub fn list(
    sandbox: &Path,
    path: &str,
    offset: u32,
    limit: u32,
) -> Result<SandboxReply, SandboxReply> {
    let fd = open_beneath(sandbox, path, true)?;
    let mut dir = Dir::read_from(&fd).map_err(|e| errno_reply(path, e))?;
    let mut names = Vec::new();
    while let Some(entry) = dir.read() {
        let entry = entry.map_err(|e| errno_reply(path, e))?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        names.push(entry.file_name().to_owned());
        // Bounded: a directory of millions of entries is listed in part.
        if names.len() >= 100_000 {
            break;
        }
    }
    names.sort();
    let total = u32::try_from(names.len()).unwrap_or(u32::MAX);
    let entries = names
        .iter()
        .skip(offset as usize)
        .take(limit as usize)
        .map(|name| {
            let st = statat(&fd, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW).ok();
            let kind = st.map(|s| FileType::from_raw_mode(s.st_mode));
            SandboxEntry {
                name: name.to_string_lossy().into_owned(),
                kind: match kind {
                    Some(FileType::RegularFile) => "file",
                    Some(FileType::Directory) => "dir",
                    Some(FileType::Symlink) => "symlink",
                    _ => "other",
                }
                .to_string(),
                size: st.map_or(0, |s| s.st_size as u64),
                mode: st.map_or(0, |s| s.st_mode & 0o7777),
                mtime_ms: st.map_or(0, |s| {
                    (s.st_mtime as u64).saturating_mul(1000) + s.st_mtime_nsec / 1_000_000
                }),
            }
        })
        .collect();
    Ok(SandboxReply::Entries { entries, total })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(r: Result<impl std::fmt::Debug, SandboxReply>) -> SandboxErrorKind {
        match r {
            Err(SandboxReply::Error { kind, .. }) => kind,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn paths_that_leave_the_sandbox_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let sb = d.path().join("sb");
        std::fs::create_dir(&sb).unwrap();
        std::fs::write(d.path().join("secret"), "x").unwrap();
        std::fs::write(sb.join("ok"), "hello").unwrap();
        std::fs::create_dir(sb.join("sub")).unwrap();
        std::os::unix::fs::symlink(d.path().join("secret"), sb.join("link")).unwrap();
        std::os::unix::fs::symlink(d.path(), sb.join("up")).unwrap();
        assert_eq!(
            kind(open_file(&sb, "../secret")),
            SandboxErrorKind::Forbidden
        );
        assert_eq!(
            kind(open_file(&sb, "sub/../../secret")),
            SandboxErrorKind::Forbidden
        );
        assert_eq!(
            kind(open_file(&sb, "/etc/passwd")),
            SandboxErrorKind::Forbidden
        );
        assert_eq!(kind(open_file(&sb, "link")), SandboxErrorKind::Forbidden);
        assert_eq!(
            kind(open_file(&sb, "up/secret")),
            SandboxErrorKind::Forbidden
        );
        assert_eq!(kind(open_file(&sb, "missing")), SandboxErrorKind::NotFound);
        assert_eq!(kind(open_file(&sb, "sub")), SandboxErrorKind::BadRequest);
        assert_eq!(kind(list(&sb, "up", 0, 10)), SandboxErrorKind::Forbidden);
        let mut s = String::new();
        std::io::Read::read_to_string(&mut open_file(&sb, "ok").unwrap(), &mut s).unwrap();
        assert_eq!(s, "hello");
        let Ok(SandboxReply::Entries { entries, total }) = list(&sb, "", 1, 2) else {
            panic!()
        };
        assert_eq!(total, 4);
        let names: Vec<_> = entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["ok", "sub"]);
        assert_eq!(entries[0].kind, "file");
        assert_eq!(entries[0].size, 5);
    }
}
