//! The per-task supervisor (`gantry-agent supervise --sandbox DIR [--cgroup-procs FILE]... -- CMD`).
//!
//! Runs in its own session so it outlives the agent. Starts `/bin/sh -c CMD` as the leader of a
//! new process group, joined to the task's cgroups before exec, with stdout and stderr in
//! `DIR/stdout` and `DIR/stderr`; writes the task's pid to `DIR/task.pid`; waits; writes the
//! exit status to `DIR/exit.json` (atomically) and exits.

use std::ffi::CString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};

use super::ExitStatus;

pub const PID_FILE: &str = "task.pid";
pub const EXIT_FILE: &str = "exit.json";

fn write_atomic(path: &Path, data: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, data)?;
    std::fs::rename(tmp, path)
}

/// Entry point of the `supervise` subcommand. Never returns an error to a caller that could
/// lose it: failures are recorded in `exit.json` (code 127, as a shell does).
pub fn run(sandbox: &Path, cgroup_procs: &[PathBuf], command: &str) -> i32 {
    // SAFETY: setsid and signal only change this process's session and dispositions.
    unsafe {
        libc::setsid();
        libc::signal(libc::SIGHUP, libc::SIG_IGN);
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGTERM, libc::SIG_IGN);
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    let status = match spawn_and_wait(sandbox, cgroup_procs, command) {
        Ok(s) => s,
        Err(e) => {
            let _ = std::fs::write(
                sandbox.join("stderr"),
                format!("gantry: could not start the task: {e}\n"),
            );
            ExitStatus {
                code: Some(127),
                signal: None,
            }
        }
    };
    let json = serde_json::to_string(&status).unwrap_or_else(|_| "{}".into());
    match write_atomic(&sandbox.join(EXIT_FILE), &json) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

fn spawn_and_wait(
    sandbox: &Path,
    cgroup_procs: &[PathBuf],
    command: &str,
) -> std::io::Result<ExitStatus> {
    let stdout = std::fs::File::create(sandbox.join("stdout"))?;
    let stderr = std::fs::File::create(sandbox.join("stderr"))?;
    let procs: Vec<CString> = cgroup_procs
        .iter()
        .map(|p| {
            CString::new(p.as_os_str().as_encoded_bytes())
                .map_err(|_| std::io::Error::other("cgroup path has a NUL byte"))
        })
        .collect::<Result<_, _>>()?;
    let mut cmd = std::process::Command::new("/bin/sh");
    cmd.arg("-c")
        .arg(command)
        .current_dir(sandbox)
        .stdin(std::process::Stdio::null())
        .stdout(stdout)
        .stderr(stderr);
    // SAFETY: the closure only calls async-signal-safe functions (setpgid, signal, open,
    // write, close) on memory prepared before fork.
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
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    write_atomic(&sandbox.join(PID_FILE), &child.id().to_string())?;
    let status = child.wait()?;
    Ok(ExitStatus {
        code: status.code(),
        signal: status.signal(),
    })
}
