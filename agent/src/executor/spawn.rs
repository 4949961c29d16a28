//! Starting one task process the way `posix_spawn` does: `clone(CLONE_VM | CLONE_VFORK)`, so the
//! child borrows the supervisor's memory until its `exec` instead of getting a copy of it.
//!
//! `std::process::Command` with a `pre_exec` hook (needed to join cgroups and switch users
//! between fork and exec) forks: the kernel copies the supervisor's page tables for each task,
//! and every page either side touches afterwards is copied on write. With one supervisor
//! starting every task of an agent, that was a third of its CPU per task. A vfork-style child
//! costs a stack of its own and nothing else; the spawning thread sleeps until the child has
//! exec'd (or died trying), and the other threads run on.
//!
//! The child runs on memory it shares with the running supervisor, so it does only what
//! `posix_spawn`'s child does: system calls on data prepared before the clone (no allocation,
//! no lock, no panic path), all signals blocked across the clone and every disposition reset
//! to default before they are unblocked. Credentials change through raw system calls: glibc's
//! `setuid`/`setgid`/`setgroups` would broadcast the change to the supervisor's threads.

use std::ffi::{CString, OsStr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};

/// The child's stack: it only makes system calls before `exec`.
const STACK: usize = 64 * 1024;

/// Signals are 1..NSIG on Linux.
const NSIG: libc::c_int = 65;

/// A task process ready to start: every string and file prepared, nothing left to allocate.
pub struct TaskProcess {
    /// Where to `execve` from, tried in order (one path, or the `PATH` candidates of a bare
    /// program name, as `execvp` tries them).
    candidates: Vec<CString>,
    argv: Vec<CString>,
    envp: Vec<CString>,
    cwd: CString,
    stdin: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
    /// `cgroup.procs` / `tasks` files to join (written `0`: the calling process).
    cgroup_procs: Vec<CString>,
    /// (uid, gid, supplementary groups) to switch to.
    identity: Option<(u32, u32, Vec<libc::gid_t>)>,
}

/// What the child gets: the prepared process and where it leaves the reason it failed.
struct ChildArgs<'a> {
    process: &'a TaskProcess,
    argv: &'a [*const libc::c_char],
    envp: &'a [*const libc::c_char],
    /// errno of the step that failed, 0 while none did (the child exits with 127 then).
    error: AtomicI32,
}

fn c_string(bytes: &[u8], what: &str) -> std::io::Result<CString> {
    CString::new(bytes).map_err(|_| std::io::Error::other(format!("{what} has a NUL byte")))
}

impl TaskProcess {
    /// `program` with `args` (argv\[0\] is `program`), in `cwd`, with exactly `env`, stdin
    /// from /dev/null and the given stdout and stderr. A program name without `/` is looked up
    /// in `env`'s `PATH` (or `/usr/bin:/bin` without one), as `std::process::Command` does.
    pub fn new(
        program: &OsStr,
        args: &[&OsStr],
        env: &[(String, String)],
        cwd: &Path,
        stdout: OwnedFd,
        stderr: OwnedFd,
    ) -> std::io::Result<Self> {
        let name = program.as_bytes();
        let candidates = if name.contains(&b'/') {
            vec![c_string(name, "the program")?]
        } else {
            let path = env
                .iter()
                .rev()
                .find(|(k, _)| k == "PATH")
                .map_or("/usr/bin:/bin", |(_, v)| v.as_str());
            path.split(':')
                .map(|dir| {
                    let mut p = if dir.is_empty() {
                        b".".to_vec()
                    } else {
                        dir.as_bytes().to_vec()
                    };
                    p.push(b'/');
                    p.extend_from_slice(name);
                    c_string(&p, "a PATH entry")
                })
                .collect::<Result<_, _>>()?
        };
        let argv = std::iter::once(name)
            .chain(args.iter().map(|a| a.as_bytes()))
            .map(|a| c_string(a, "an argument"))
            .collect::<Result<_, _>>()?;
        let envp = env
            .iter()
            .map(|(k, v)| c_string(format!("{k}={v}").as_bytes(), "the environment"))
            .collect::<Result<_, _>>()?;
        let stdin = std::fs::File::open("/dev/null")?.into();
        Ok(Self {
            candidates,
            argv,
            envp,
            cwd: c_string(cwd.as_os_str().as_bytes(), "the working directory")?,
            stdin,
            stdout,
            stderr,
            cgroup_procs: Vec::new(),
            identity: None,
        })
    }

    /// Joins these `cgroup.procs` (v2) / `tasks` (v1) files before exec.
    pub fn cgroups(mut self, procs: &[impl AsRef<Path>]) -> std::io::Result<Self> {
        self.cgroup_procs = procs
            .iter()
            .map(|p| c_string(p.as_ref().as_os_str().as_bytes(), "a cgroup path"))
            .collect::<Result<_, _>>()?;
        Ok(self)
    }

    /// Switches to this user (supplementary groups, gid, then uid) last before exec: after
    /// joining the cgroups and entering the working directory.
    pub fn user(mut self, uid: u32, gid: u32, groups: &[u32]) -> Self {
        self.identity = Some((uid, gid, groups.to_vec()));
        self
    }

    /// Starts the process as the leader of a new process group and returns its pid once it
    /// has exec'd. When a step before the exec failed (a cgroup, the user, the program), the
    /// child has already exited with code 127 and the pid comes back with the error: the
    /// caller still reaps it.
    pub fn spawn(&self) -> Result<i32, SpawnError> {
        let ptrs = |v: &[CString]| {
            v.iter()
                .map(|s| s.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect::<Vec<_>>()
        };
        let (argv, envp) = (ptrs(&self.argv), ptrs(&self.envp));
        let args = ChildArgs {
            process: self,
            argv: &argv,
            envp: &envp,
            error: AtomicI32::new(0),
        };
        let mut stack = vec![0u8; STACK];
        // SAFETY: the stack grows down from its end (16-byte aligned); `args` and `stack`
        // outlive the child's use of them: with CLONE_VFORK this thread resumes only once the
        // child has exec'd or exited. All signals are blocked across the clone so that no
        // handler runs on the shared memory in the child before it resets them.
        let pid = unsafe {
            let top = stack.as_mut_ptr().add(STACK);
            let top = top.sub(top as usize % 16);
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
            let pid = libc::clone(
                child,
                top.cast(),
                libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                (&args as *const ChildArgs<'_>).cast_mut().cast(),
            );
            let clone_error = std::io::Error::last_os_error();
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
            if pid < 0 {
                return Err(SpawnError::Clone(clone_error));
            }
            pid
        };
        drop(stack);
        match args.error.load(Ordering::Acquire) {
            0 => Ok(pid),
            errno => Err(SpawnError::Child {
                pid,
                error: std::io::Error::from_raw_os_error(errno),
            }),
        }
    }
}

/// Why a task process did not start.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// No child was made.
    #[error("{0}")]
    Clone(std::io::Error),
    /// The child failed before or at exec and exited with code 127 (still to be reaped).
    #[error("{error}")]
    Child { pid: i32, error: std::io::Error },
}

/// The child, between clone and exec: system calls only.
extern "C" fn child(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the parent's `ChildArgs`, alive until this child exec'd or exited.
    let args = unsafe { &*(arg as *const ChildArgs<'_>) };
    let errno = unsafe { run_child(args) };
    args.error.store(errno.max(1), Ordering::Release);
    // SAFETY: _exit ends this process only (a thread group of its own) without running the
    // parent's atexit handlers or flushing its buffers.
    unsafe { libc::_exit(127) }
}

/// The child's steps; returns the errno of the one that failed (exec only returns on failure).
///
/// # Safety
/// Only in the vfork child made by [`TaskProcess::spawn`].
unsafe fn run_child(args: &ChildArgs<'_>) -> i32 {
    let p = args.process;
    let errno = || {
        std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EINVAL)
    };
    // Every disposition back to default (the supervisor ignores the terminal's signals and
    // SIGPIPE), then every signal unblocked: what a freshly exec'd program expects.
    // (glibc's `sigaction` is a thin wrapper: posix_spawn's child uses it too; it refuses
    // glibc's two internal signals, which keep their default in the child anyway.)
    let mut action: libc::sigaction = std::mem::zeroed();
    action.sa_sigaction = libc::SIG_DFL;
    for sig in 1..NSIG {
        if sig != libc::SIGKILL && sig != libc::SIGSTOP {
            libc::sigaction(sig, &action, std::ptr::null_mut());
        }
    }
    let empty: u64 = 0;
    if libc::syscall(
        libc::SYS_rt_sigprocmask,
        libc::SIG_SETMASK,
        &empty as *const u64,
        std::ptr::null_mut::<u64>(),
        8usize,
    ) != 0
    {
        return errno();
    }
    if libc::setpgid(0, 0) != 0 {
        return errno();
    }
    for procs in &p.cgroup_procs {
        let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return errno();
        }
        let n = libc::write(fd, b"0".as_ptr().cast(), 1);
        let e = errno();
        libc::close(fd);
        if n != 1 {
            return e;
        }
    }
    for (from, to) in [
        (p.stdin.as_raw_fd(), 0),
        (p.stdout.as_raw_fd(), 1),
        (p.stderr.as_raw_fd(), 2),
    ] {
        if libc::dup2(from, to) < 0 {
            return errno();
        }
    }
    // The working directory as root (as std's Command does): the task's user may not search
    // the directories above its sandbox.
    if libc::chdir(p.cwd.as_ptr()) != 0 {
        return errno();
    }
    if let Some((uid, gid, groups)) = &p.identity {
        if libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) != 0
            || libc::syscall(libc::SYS_setresgid, *gid, *gid, *gid) != 0
            || libc::syscall(libc::SYS_setresuid, *uid, *uid, *uid) != 0
        {
            return errno();
        }
    }
    // As execvp: a candidate that is not there (or not ours to run) lets the next one try.
    let mut denied = false;
    let mut last = libc::ENOENT;
    for path in &p.candidates {
        libc::execve(path.as_ptr(), args.argv.as_ptr(), args.envp.as_ptr());
        last = errno();
        match last {
            libc::EACCES => denied = true,
            libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
            _ => return last,
        }
    }
    if denied {
        libc::EACCES
    } else {
        last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(dir: &Path, name: &str) -> OwnedFd {
        std::fs::File::create(dir.join(name)).unwrap().into()
    }

    fn wait(pid: i32) -> i32 {
        let mut status = 0;
        // SAFETY: waits for our own child into a local.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        status
    }

    #[test]
    fn runs_in_its_directory_with_its_environment_and_outputs() {
        let dir = tempfile::tempdir().unwrap();
        let env = vec![
            ("PATH".to_string(), "/nonexistent:/usr/bin:/bin".to_string()),
            ("GREETING".to_string(), "hi there".to_string()),
        ];
        let p = TaskProcess::new(
            OsStr::new("sh"),
            &[
                OsStr::new("-c"),
                OsStr::new("echo \"$GREETING\" $# \"$1\" >&1; pwd; echo oops >&2; read x; exit 3"),
                OsStr::new("sh"),
                OsStr::new("a b"),
            ],
            &env,
            dir.path(),
            output(dir.path(), "out"),
            output(dir.path(), "err"),
        )
        .unwrap();
        let pid = p.spawn().unwrap();
        let status = wait(pid);
        assert!(libc::WIFEXITED(status));
        assert_eq!(libc::WEXITSTATUS(status), 3);
        let out = std::fs::read_to_string(dir.path().join("out")).unwrap();
        let here = dir.path().canonicalize().unwrap();
        assert_eq!(out, format!("hi there 1 a b\n{}\n", here.display()));
        assert_eq!(
            std::fs::read_to_string(dir.path().join("err")).unwrap(),
            "oops\n"
        );
    }

    #[test]
    fn leads_its_own_process_group_with_default_signals() {
        let dir = tempfile::tempdir().unwrap();
        // SAFETY: ignoring SIGUSR2 (used by nothing else) in this test process; the child must
        // not inherit it.
        let old = unsafe { libc::signal(libc::SIGUSR2, libc::SIG_IGN) };
        // grep reads its own status: what the spawned process got, unchanged by exec (no
        // shell in between: a shell waiting for its child blocks signals for a moment, and
        // its status read then shows them blocked).
        let p = TaskProcess::new(
            OsStr::new("grep"),
            &[
                OsStr::new("-E"),
                OsStr::new("^(Pid|NSpgid|SigIgn|SigBlk):"),
                OsStr::new("/proc/self/status"),
            ],
            &[("PATH".into(), "/usr/bin:/bin".into())],
            dir.path(),
            output(dir.path(), "out"),
            output(dir.path(), "err"),
        )
        .unwrap();
        let pid = p.spawn().unwrap();
        assert_eq!(libc::WEXITSTATUS(wait(pid)), 0);
        // SAFETY: restores this process's disposition.
        unsafe { libc::signal(libc::SIGUSR2, old) };
        let out = std::fs::read_to_string(dir.path().join("out")).unwrap();
        let field = |name: &str| {
            out.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_string())
                .unwrap_or_else(|| panic!("no {name} in {out}"))
        };
        assert_eq!(field("Pid:"), pid.to_string(), "{out}");
        assert_eq!(
            field("NSpgid:"),
            pid.to_string(),
            "its own process group: {out}"
        );
        // SIGUSR2 (bit 12) is not ignored, and nothing is blocked.
        let ignored = u64::from_str_radix(&field("SigIgn:"), 16).unwrap();
        assert_eq!(ignored & (1 << (libc::SIGUSR2 - 1)), 0, "{out}");
        assert_eq!(
            u64::from_str_radix(&field("SigBlk:"), 16).unwrap(),
            0,
            "{out}"
        );
    }

    #[test]
    fn a_missing_program_or_cgroup_fails_with_its_reason_and_exit_127() {
        let dir = tempfile::tempdir().unwrap();
        let missing = TaskProcess::new(
            OsStr::new("no-such-program-here"),
            &[],
            &[("PATH".into(), "/usr/bin:/bin".into())],
            dir.path(),
            output(dir.path(), "out"),
            output(dir.path(), "err"),
        )
        .unwrap();
        let Err(SpawnError::Child { pid, error }) = missing.spawn() else {
            panic!("spawned a missing program");
        };
        assert_eq!(error.kind(), std::io::ErrorKind::NotFound);
        assert_eq!(libc::WEXITSTATUS(wait(pid)), 127);
        let no_cgroup = TaskProcess::new(
            OsStr::new("/bin/true"),
            &[],
            &[],
            dir.path(),
            output(dir.path(), "out"),
            output(dir.path(), "err"),
        )
        .unwrap()
        .cgroups(&[dir.path().join("no/such/cgroup.procs")])
        .unwrap();
        let Err(SpawnError::Child { pid, error }) = no_cgroup.spawn() else {
            panic!("joined a missing cgroup");
        };
        assert_eq!(error.kind(), std::io::ErrorKind::NotFound);
        assert_eq!(libc::WEXITSTATUS(wait(pid)), 127);
    }

    #[test]
    fn switches_user_after_entering_a_directory_only_root_may_reach() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root (CI runs as root)");
            return;
        }
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let sandbox = dir.path().join("sandbox");
        std::fs::create_dir(&sandbox).unwrap();
        std::os::unix::fs::chown(&sandbox, Some(65534), Some(65534)).unwrap();
        let p = TaskProcess::new(
            OsStr::new("/bin/sh"),
            &[
                OsStr::new("-c"),
                OsStr::new("id -u; id -g; id -G; touch mine"),
            ],
            &[],
            &sandbox,
            output(dir.path(), "out"),
            output(dir.path(), "err"),
        )
        .unwrap()
        .user(65534, 65534, &[65534]);
        let pid = p.spawn().unwrap();
        assert_eq!(libc::WEXITSTATUS(wait(pid)), 0);
        assert_eq!(
            std::fs::read_to_string(dir.path().join("out")).unwrap(),
            "65534\n65534\n65534\n"
        );
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            std::fs::metadata(sandbox.join("mine")).unwrap().uid(),
            65534
        );
        // The supervisor's own credentials did not change (raw system calls, not glibc's
        // process-wide broadcast).
        // SAFETY: as above.
        assert_eq!(unsafe { libc::geteuid() }, 0);
    }

    #[test]
    fn many_threads_spawn_at_once() {
        let dir = tempfile::tempdir().unwrap();
        std::thread::scope(|s| {
            for t in 0..4 {
                let dir = dir.path();
                s.spawn(move || {
                    for i in 0..25 {
                        let p = TaskProcess::new(
                            OsStr::new("/bin/sh"),
                            &[
                                OsStr::new("-c"),
                                OsStr::new("exit $0"),
                                OsStr::new(&format!("{}", (t * 25 + i) % 7)),
                            ],
                            &[],
                            dir,
                            output(dir, &format!("out{t}")),
                            output(dir, &format!("err{t}")),
                        )
                        .unwrap();
                        let pid = p.spawn().unwrap();
                        assert_eq!(libc::WEXITSTATUS(wait(pid)), (t * 25 + i) % 7);
                    }
                });
            }
        });
    }
}
