//! The per-task supervisor (`gantry-agent supervise --sandbox DIR --meta DIR
//! [--cgroup-procs FILE]... [--uid U --gid G --groups G,...] [--argv] -- COMMAND...`).
//!
//! Runs in its own session so it outlives the agent. Starts the task — `/bin/sh -c COMMAND`,
//! or with `--argv` the words after `--` executed directly — as the leader of a new process
//! group, joined to the task's cgroups and switched to the task's user (supplementary groups,
//! gid, then uid) between `fork` and `exec`, with stdout and stderr in `SANDBOX/stdout` and
//! `SANDBOX/stderr`; writes the task's pid to `META/task.pid`; waits; writes the exit status to
//! `META/exit.json` (atomically) and exits.
//!
//! The control files live in META, a root-owned directory apart from the sandbox, because the
//! sandbox belongs to the task's user: a task must not be able to forge its pid file (the agent
//! signals that process group) or plant symlinks where the supervisor writes.

use std::ffi::CString;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};

use gantry_sdk::protocol::Program;

use super::ExitStatus;

/// The user a task switches to before exec (resolved by the agent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// What the supervisor runs, and where.
#[derive(Debug, Clone)]
pub struct Supervised {
    pub sandbox: PathBuf,
    pub meta: PathBuf,
    pub cgroup_procs: Vec<PathBuf>,
    pub program: Program,
    pub identity: Option<Identity>,
}

pub const PID_FILE: &str = "task.pid";
/// The supervisor's own pid and start time (`PID START`), written first: an agent killed
/// between starting the supervisor and recording it finds its task through this file.
pub const SUPERVISOR_FILE: &str = "supervisor.pid";
/// Created (exclusively) by whoever decides the launch's fate first: the supervisor, before it
/// starts the task, or a restarted agent that found the launch unrecorded and reports it
/// FAILED. The loser backs off, so a task never runs unseen.
pub const CLAIM_FILE: &str = "launch.claim";
pub const EXIT_FILE: &str = "exit.json";

fn write_atomic(path: &Path, data: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, data)?;
    std::fs::rename(tmp, path)
}

/// Entry point of the `supervise` subcommand. Never returns an error to a caller that could
/// lose it: failures are recorded in `exit.json` (code 127, as a shell does) with the reason
/// in the sandbox's `stderr`.
pub fn run(spec: &Supervised) -> i32 {
    // SAFETY: setsid and signal only change this process's session and dispositions.
    unsafe {
        libc::setsid();
        libc::signal(libc::SIGHUP, libc::SIG_IGN);
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGTERM, libc::SIG_IGN);
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    let me = std::process::id() as i32;
    let start = super::process_start_time(me).unwrap_or(0);
    if write_atomic(&spec.meta.join(SUPERVISOR_FILE), &format!("{me} {start}")).is_err() {
        return 1;
    }
    if !super::claim(&spec.meta) {
        // A restarted agent gave this launch up (and reported it) before we got here.
        return 0;
    }
    let status = match spawn_and_wait(spec) {
        Ok(s) => s,
        Err(e) => {
            let what = match &spec.program {
                Program::Argv(v) => format!(" {:?}", v.first().map(String::as_str).unwrap_or("")),
                Program::Shell(_) => String::new(),
            };
            if let Ok(mut f) =
                open_output(&spec.sandbox.join("stderr"), spec.identity.as_ref(), true)
            {
                use std::io::Write;
                let _ = writeln!(f, "gantry: could not start the task{what}: {e}");
            }
            ExitStatus {
                code: Some(127),
                signal: None,
            }
        }
    };
    let json = serde_json::to_string(&status).unwrap_or_else(|_| "{}".into());
    match write_atomic(&spec.meta.join(EXIT_FILE), &json) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

/// Opens a task's output file in its (user-owned) sandbox without following symlinks, checks
/// that it is a plain file with one link before truncating it, and hands it to the task's user.
fn open_output(
    path: &Path,
    identity: Option<&Identity>,
    append: bool,
) -> std::io::Result<std::fs::File> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .append(append)
        .truncate(false)
        .mode(0o640)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    // Only a plain file of ours: never a hard link to some other file (which fchown would
    // hand to the task's user).
    let meta = file.metadata()?;
    if !meta.file_type().is_file() || std::os::unix::fs::MetadataExt::nlink(&meta) != 1 {
        return Err(std::io::Error::other(format!(
            "{} is not a plain file of its own",
            path.display()
        )));
    }
    if !append {
        file.set_len(0)?;
    }
    if let Some(id) = identity {
        std::os::unix::fs::fchown(&file, Some(id.uid), Some(id.gid))?;
    }
    Ok(file)
}

fn spawn_and_wait(spec: &Supervised) -> std::io::Result<ExitStatus> {
    let identity = spec.identity.clone();
    let stdout = open_output(&spec.sandbox.join("stdout"), identity.as_ref(), false)?;
    let stderr = open_output(&spec.sandbox.join("stderr"), identity.as_ref(), false)?;
    let procs: Vec<CString> = spec
        .cgroup_procs
        .iter()
        .map(|p| {
            CString::new(p.as_os_str().as_encoded_bytes())
                .map_err(|_| std::io::Error::other("cgroup path has a NUL byte"))
        })
        .collect::<Result<_, _>>()?;
    let mut cmd = match &spec.program {
        Program::Shell(command) => {
            let mut c = std::process::Command::new("/bin/sh");
            c.arg("-c").arg(command);
            c
        }
        Program::Argv(argv) => {
            let (program, args) = argv
                .split_first()
                .ok_or_else(|| std::io::Error::other("empty argv"))?;
            let mut c = std::process::Command::new(program);
            c.args(args);
            c
        }
    };
    cmd.current_dir(&spec.sandbox)
        .stdin(std::process::Stdio::null())
        .stdout(stdout)
        .stderr(stderr);
    // The user switch happens in the closure, after joining the cgroups (which needs root),
    // not through Command::uid/gid (std runs those before pre_exec closures).
    let groups: Vec<libc::gid_t> = identity
        .as_ref()
        .map(|i| i.groups.clone())
        .unwrap_or_default();
    // SAFETY: the closure only calls async-signal-safe functions (setpgid, signal, open,
    // write, close, setgroups, setgid, setuid) on memory prepared before fork.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setpgid(0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            for sig in [libc::SIGHUP, libc::SIGINT, libc::SIGTERM, libc::SIGPIPE] {
                libc::signal(sig, libc::SIG_DFL);
            }
            for p in &procs {
                let fd = libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let n = libc::write(fd, b"0".as_ptr().cast(), 1);
                libc::close(fd);
                if n != 1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if let Some(id) = &identity {
                if libc::setgroups(groups.len() as _, groups.as_ptr()) != 0
                    || libc::setgid(id.gid) != 0
                    || libc::setuid(id.uid) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    write_atomic(&spec.meta.join(PID_FILE), &child.id().to_string())?;
    let status = child.wait()?;
    Ok(ExitStatus {
        code: status.code(),
        signal: status.signal(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(dir: &Path, program: Program) -> Supervised {
        let sandbox = dir.join("sandbox");
        let meta = dir.join("meta");
        std::fs::create_dir_all(&sandbox).unwrap();
        std::fs::create_dir_all(&meta).unwrap();
        Supervised {
            sandbox,
            meta,
            cgroup_procs: Vec::new(),
            program,
            identity: None,
        }
    }

    #[test]
    fn argv_reaches_the_program_exactly_and_shell_strings_use_the_shell() {
        let dir = tempfile::tempdir().unwrap();
        let words = ["a b", "it's", "$HOME", "*", ""];
        let mut argv = vec!["printf".to_string(), "[%s]\\n".to_string()];
        argv.extend(words.iter().map(|w| w.to_string()));
        let s = spec(dir.path(), Program::Argv(argv));
        let status = spawn_and_wait(&s).unwrap();
        assert_eq!(status.code, Some(0));
        let out = std::fs::read_to_string(s.sandbox.join("stdout")).unwrap();
        let expected: String = words.iter().map(|w| format!("[{w}]\n")).collect();
        assert_eq!(out, expected);
        assert!(s.meta.join(PID_FILE).exists());
        assert!(!s.sandbox.join(PID_FILE).exists());

        let s = spec(dir.path(), Program::Shell("echo $((1 + 2)); exit 3".into()));
        assert_eq!(spawn_and_wait(&s).unwrap().code, Some(3));
        assert_eq!(
            std::fs::read_to_string(s.sandbox.join("stdout")).unwrap(),
            "3\n"
        );
    }

    #[test]
    fn planted_links_and_missing_programs_do_not_start() {
        let dir = tempfile::tempdir().unwrap();
        let s = spec(dir.path(), Program::Shell("true".into()));
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "keep me").unwrap();
        // A symlink where stdout goes is not followed.
        std::os::unix::fs::symlink(&victim, s.sandbox.join("stdout")).unwrap();
        assert!(spawn_and_wait(&s).is_err());
        std::fs::remove_file(s.sandbox.join("stdout")).unwrap();
        // Nor is a hard link truncated.
        std::fs::hard_link(&victim, s.sandbox.join("stdout")).unwrap();
        assert!(spawn_and_wait(&s).is_err());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");

        let missing = spec(
            &dir.path().join("m"),
            Program::Argv(vec!["/no/such/program".into()]),
        );
        assert!(spawn_and_wait(&missing).is_err());
    }
}
