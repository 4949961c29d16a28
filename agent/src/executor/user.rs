//! The Unix users tasks run as: look-ups with `getpwnam_r` / `getpwuid_r` / `getgrouplist`
//! (thread-safe, done before `fork`; the supervisor only calls `setgroups`, `setgid` and
//! `setuid` between `fork` and `exec`).

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A resolved user: what the supervisor switches to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (including the primary group).
    pub groups: Vec<u32>,
    pub home: PathBuf,
}

/// Why a user cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum UserError {
    #[error("unknown user {0:?} on this agent")]
    Unknown(String),
    #[error("invalid user name {0:?}")]
    InvalidName(String),
    /// A uid-0 account under a name other than `root`: the master's ACLs grant users by name
    /// (`"*"` is any user but root), so such an alias would run tasks as root unseen.
    #[error(
        "user {0:?} has uid 0 (root) on this agent: tasks run as uid 0 only under the name \
         \"root\", which the master's run_tasks ACL must grant explicitly"
    )]
    RootAlias(String),
    #[error("looking up user {name:?}: {source}")]
    Lookup {
        name: String,
        source: std::io::Error,
    },
}

/// The passwd entry of `name`.
pub fn lookup(name: &str) -> Result<TaskUser, UserError> {
    let cname = CString::new(name).map_err(|_| UserError::InvalidName(name.to_string()))?;
    let entry = passwd(|pwd, buf, len, result| {
        // SAFETY: all pointers are valid for the call; buf has len bytes.
        unsafe { libc::getpwnam_r(cname.as_ptr(), pwd, buf, len, result) }
    })
    .map_err(|source| UserError::Lookup {
        name: name.to_string(),
        source,
    })?;
    let (_, uid, gid, home) = entry.ok_or_else(|| UserError::Unknown(name.to_string()))?;
    let groups = group_list(&cname, gid);
    Ok(TaskUser {
        name: name.to_string(),
        uid,
        gid,
        groups,
        home,
    })
}

/// The user a task may run as: [`lookup`], and refused when it is uid 0 under another name
/// than `root` (docs/security.md, "Tasks and users").
pub fn lookup_task_user(name: &str) -> Result<TaskUser, UserError> {
    let user = lookup(name)?;
    if user.uid == 0 && name != "root" {
        return Err(UserError::RootAlias(name.to_string()));
    }
    Ok(user)
}

/// How long a resolved task user is reused without asking NSS again ([`UserCache`]).
pub const USER_CACHE_TTL: Duration = Duration::from_secs(5);

/// Recent [`lookup_task_user`] results, reused for [`USER_CACHE_TTL`]: a burst of launches
/// as one user does one NSS look-up (`/etc/nsswitch.conf`, `/etc/passwd`, `/etc/group`, or a
/// directory service) instead of one per task, like `nscd` (whose default is ten minutes).
/// Failures are not cached: an unknown user is asked for again at its next task. Thread-safe
/// (launches prepare on blocking threads); the clock is the caller's.
#[derive(Debug, Default)]
pub struct UserCache {
    entries: Mutex<HashMap<String, (Instant, TaskUser)>>,
}

impl UserCache {
    /// [`lookup_task_user`], from the cache when it was resolved less than
    /// [`USER_CACHE_TTL`] before `now`.
    pub fn lookup_task_user(&self, name: &str, now: Instant) -> Result<TaskUser, UserError> {
        let fresh = |at: &Instant| now.saturating_duration_since(*at) < USER_CACHE_TTL;
        if let Some((_, user)) = self
            .lock()
            .get(name)
            .filter(|(at, _)| fresh(at) && *at <= now)
        {
            return Ok(user.clone());
        }
        let user = lookup_task_user(name)?;
        let mut entries = self.lock();
        // Bounded by the users tasks ran as recently.
        entries.retain(|_, (at, _)| fresh(at));
        entries.insert(name.to_string(), (now, user.clone()));
        Ok(user)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Instant, TaskUser)>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The name of the user this process runs as (its effective uid).
pub fn current_name() -> Result<String, UserError> {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let entry = passwd(|pwd, buf, len, result| {
        // SAFETY: all pointers are valid for the call; buf has len bytes.
        unsafe { libc::getpwuid_r(uid, pwd, buf, len, result) }
    })
    .map_err(|source| UserError::Lookup {
        name: format!("uid {uid}"),
        source,
    })?;
    entry
        .map(|(name, ..)| name)
        .ok_or_else(|| UserError::Unknown(format!("uid {uid}")))
}

/// True when this process may switch to other users (it runs as root).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Calls a `getpw*_r` function with a growing buffer; returns name, uid, gid and home.
fn passwd(
    mut call: impl FnMut(
        *mut libc::passwd,
        *mut libc::c_char,
        libc::size_t,
        *mut *mut libc::passwd,
    ) -> libc::c_int,
) -> std::io::Result<Option<(String, u32, u32, PathBuf)>> {
    let mut len = 1024usize;
    loop {
        let mut buf = vec![0 as libc::c_char; len];
        // SAFETY: passwd is plain old data; zeroed is a valid (empty) value.
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let rc = call(&mut pwd, buf.as_mut_ptr(), len, &mut result);
        if rc == libc::ERANGE && len < 1 << 20 {
            len *= 4;
            continue;
        }
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(rc));
        }
        if result.is_null() {
            return Ok(None);
        }
        let text = |p: *const libc::c_char| {
            if p.is_null() {
                String::new()
            } else {
                // SAFETY: the entry's strings are NUL-terminated and live in buf, alive here.
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            }
        };
        let home = Some(text(pwd.pw_dir))
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "/".into());
        return Ok(Some((
            text(pwd.pw_name),
            pwd.pw_uid,
            pwd.pw_gid,
            PathBuf::from(home),
        )));
    }
}

/// The user's groups (`getgrouplist`), always including `gid`.
fn group_list(name: &CStr, gid: u32) -> Vec<u32> {
    let mut n: libc::c_int = 32;
    loop {
        let mut groups = vec![0 as libc::gid_t; n as usize];
        let mut count = n;
        // SAFETY: groups has room for `count` entries; getgrouplist updates count.
        let rc = unsafe { libc::getgrouplist(name.as_ptr(), gid, groups.as_mut_ptr(), &mut count) };
        if rc >= 0 {
            groups.truncate(count.max(0) as usize);
            if !groups.contains(&gid) {
                groups.push(gid);
            }
            return groups;
        }
        if count <= n || n > 65536 {
            return vec![gid];
        }
        n = count;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_and_unknown_users() {
        let root = lookup("root").unwrap();
        assert_eq!((root.uid, root.gid), (0, 0));
        assert!(root.groups.contains(&0));
        assert!(matches!(
            lookup("no-such-user-gantry"),
            Err(UserError::Unknown(_))
        ));
        assert!(matches!(lookup("a\0b"), Err(UserError::InvalidName(_))));
        assert!(!current_name().unwrap().is_empty());
    }

    #[test]
    fn root_runs_tasks_only_under_its_name() {
        assert_eq!(lookup_task_user("root").unwrap().uid, 0);
        assert!(lookup_task_user("nobody").is_ok_and(|u| u.uid != 0));
        // Any uid-0 alias in this host's passwd is refused (tests/task_user.rs makes one).
        let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
        for alias in passwd
            .lines()
            .filter_map(|l| {
                l.split(':')
                    .collect::<Vec<_>>()
                    .get(..3)
                    .map(|f| f.to_vec())
            })
            .filter(|f| f[2] == "0" && f[0] != "root")
        {
            assert!(matches!(
                lookup_task_user(alias[0]),
                Err(UserError::RootAlias(_))
            ));
        }
    }

    #[test]
    fn the_cache_serves_a_user_for_its_ttl_then_asks_again_and_keeps_no_failure() {
        let cache = UserCache::default();
        let t0 = Instant::now();
        // A planted entry tells a cached answer from NSS's.
        let planted = TaskUser {
            name: "root".into(),
            uid: 4242,
            gid: 4242,
            groups: vec![4242],
            home: "/planted".into(),
        };
        cache.lock().insert("root".into(), (t0, planted.clone()));
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(cache.lookup_task_user("root", at(1)).unwrap(), planted);
        let again = cache.lookup_task_user("root", t0 + USER_CACHE_TTL).unwrap();
        assert_eq!(again.uid, 0, "expired: looked up again");
        assert_eq!(cache.lookup_task_user("root", at(6)).unwrap().uid, 0);
        assert!(cache
            .lookup_task_user("no-such-user-gantry", at(6))
            .is_err());
        assert!(!cache.lock().contains_key("no-such-user-gantry"));
        // An invalid name is refused as before.
        assert!(cache.lookup_task_user("a\0b", at(6)).is_err());
    }
}
