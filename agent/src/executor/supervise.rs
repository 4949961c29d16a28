//! What the supervisor (`gantry-supervise --server`, [`super::server`]) does for one task, and
//! the task's arguments as the agent sends them ([`command_line`], read back by [`parse_args`]:
//! `--sandbox DIR --meta DIR [--cgroup-procs FILE]... [--cgroup-base JSON] [--uid U --gid G
//! --groups G,...] [--argv] -- COMMAND...`, one module for both sides).
//!
//! The task — `/bin/sh -c COMMAND`, or with `--argv` the words after `--` executed directly —
//! starts as the leader of a new process group, joined to the task's cgroups and switched to
//! the task's user (supplementary groups, gid, then uid) between clone and `exec`, with stdout
//! and stderr in `SANDBOX/stdout` and `SANDBOX/stderr` (`task_command`, started by [`super::spawn`]). The supervisor
//! claims the launch in its record ([`super::record`], `META/launch.claim`) with its own pid
//! (and the task cgroup's baseline the agent handed over, `--cgroup-base`), then records the
//! task's pid and, once the task ended, its exit status there.
//!
//! The record lives in META, a root-owned directory apart from the sandbox, because the
//! sandbox belongs to the task's user: a task must not be able to forge its pid (the agent
//! signals that process group) or plant symlinks where the supervisor writes.

use std::ffi::{OsStr, OsString};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::spawn::TaskProcess;

use gantry_proto::Program;

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
    /// The counters the task's reused cgroup held when the agent gave it the task's limits
    /// (JSON, one line; `None` when all zero): written with the claim, for a restarted agent.
    pub cgroup_base: Option<String>,
    pub program: Program,
    pub identity: Option<Identity>,
}

/// The supervisor's arguments for `spec` (after the program name, or after `supervise`).
pub fn command_line(spec: &Supervised) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![
        "--sandbox".into(),
        spec.sandbox.clone().into(),
        "--meta".into(),
        spec.meta.clone().into(),
    ];
    for p in &spec.cgroup_procs {
        args.push("--cgroup-procs".into());
        args.push(p.clone().into());
    }
    if let Some(base) = &spec.cgroup_base {
        args.push("--cgroup-base".into());
        args.push(base.into());
    }
    if let Some(id) = &spec.identity {
        let groups: Vec<String> = id.groups.iter().map(u32::to_string).collect();
        args.extend(
            [
                "--uid".to_string(),
                id.uid.to_string(),
                "--gid".into(),
                id.gid.to_string(),
                "--groups".into(),
                groups.join(","),
            ]
            .map(OsString::from),
        );
    }
    match &spec.program {
        Program::Shell(s) => {
            args.push("--".into());
            args.push(s.into());
        }
        Program::Argv(v) => {
            args.push("--argv".into());
            args.push("--".into());
            args.extend(v.iter().map(OsString::from));
        }
    }
    args
}

/// Reads the supervisor's arguments (as written by [`command_line`]).
pub fn parse_args(args: impl IntoIterator<Item = OsString>) -> Result<Supervised, String> {
    let mut args = args.into_iter();
    let (mut sandbox, mut meta) = (None, None);
    let mut cgroup_procs = Vec::new();
    let mut cgroup_base = None;
    let (mut uid, mut gid, mut groups) = (None, None, Vec::new());
    let mut argv = false;
    let text = |v: OsString, what: &str| {
        v.into_string()
            .map_err(|_| format!("{what} is not valid UTF-8"))
    };
    let number = |v: &str, what: &str| {
        v.parse::<u32>()
            .map_err(|_| format!("{what}: {v:?} is not a number"))
    };
    loop {
        let Some(flag) = args.next() else {
            return Err("missing `-- COMMAND`".into());
        };
        let flag = text(flag, "a flag")?;
        if flag == "--" {
            break;
        }
        if flag == "--argv" {
            argv = true;
            continue;
        }
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--sandbox" => sandbox = Some(PathBuf::from(value)),
            "--meta" => meta = Some(PathBuf::from(value)),
            "--cgroup-procs" => cgroup_procs.push(PathBuf::from(value)),
            "--cgroup-base" => {
                let v = text(value, "--cgroup-base")?;
                if v.contains('\n') {
                    return Err("--cgroup-base must be one line".into());
                }
                cgroup_base = Some(v);
            }
            "--uid" => uid = Some(number(&text(value, "--uid")?, "--uid")?),
            "--gid" => gid = Some(number(&text(value, "--gid")?, "--gid")?),
            "--groups" => {
                let v = text(value, "--groups")?;
                groups = v
                    .split(',')
                    .filter(|g| !g.is_empty())
                    .map(|g| number(g, "--groups"))
                    .collect::<Result<_, _>>()?;
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let words: Vec<String> = args
        .map(|w| text(w, "the command"))
        .collect::<Result<_, _>>()?;
    if words.is_empty() {
        return Err("missing `-- COMMAND`".into());
    }
    let identity = match (uid, gid) {
        (Some(uid), Some(gid)) => Some(Identity { uid, gid, groups }),
        (None, None) => None,
        _ => return Err("--uid and --gid go together".into()),
    };
    Ok(Supervised {
        sandbox: sandbox.ok_or("missing --sandbox")?,
        meta: meta.ok_or("missing --meta")?,
        cgroup_procs,
        cgroup_base,
        program: if argv {
            Program::Argv(words)
        } else {
            Program::Shell(words.join(" "))
        },
        identity,
    })
}

/// Records in the sandbox's `stderr` why a task could not start (its `exit.json` says 127, as a
/// shell does).
pub(super) fn report_start_failure(spec: &Supervised, e: &std::io::Error) {
    let what = match &spec.program {
        Program::Argv(v) => format!(" {:?}", v.first().map(String::as_str).unwrap_or("")),
        Program::Shell(_) => String::new(),
    };
    if let Ok(mut f) = open_output(&spec.sandbox.join("stderr"), spec.identity.as_ref(), true) {
        use std::io::Write;
        let _ = writeln!(f, "gantry: could not start the task{what}: {e}");
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

/// The task's process, ready to spawn ([`TaskProcess`]): its program (`/bin/sh -c` or argv)
/// with exactly `env`, the sandbox as working directory, stdout and stderr in the sandbox;
/// between clone and `exec` the child leads a new process group, restores every signal to its
/// default, joins the task's cgroups and switches to the task's user.
pub(super) fn task_command(
    spec: &Supervised,
    env: &[(String, String)],
) -> std::io::Result<TaskProcess> {
    let identity = spec.identity.as_ref();
    let stdout = open_output(&spec.sandbox.join("stdout"), identity, false)?;
    let stderr = open_output(&spec.sandbox.join("stderr"), identity, false)?;
    let process = match &spec.program {
        Program::Shell(command) => TaskProcess::new(
            OsStr::new("/bin/sh"),
            &[OsStr::new("-c"), OsStr::new(command)],
            env,
            &spec.sandbox,
            stdout.into(),
            stderr.into(),
        )?,
        Program::Argv(argv) => {
            let (program, args) = argv
                .split_first()
                .ok_or_else(|| std::io::Error::other("empty argv"))?;
            let args: Vec<&OsStr> = args.iter().map(OsStr::new).collect();
            TaskProcess::new(
                OsStr::new(program),
                &args,
                env,
                &spec.sandbox,
                stdout.into(),
                stderr.into(),
            )?
        }
    };
    let process = process.cgroups(&spec.cgroup_procs)?;
    Ok(match identity {
        Some(id) => process.user(id.uid, id.gid, &id.groups),
        None => process,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::spawn::SpawnError;
    use crate::executor::ExitStatus;

    fn wait(pid: i32) -> ExitStatus {
        let mut raw = 0;
        // SAFETY: waits for our own child into a local.
        assert_eq!(unsafe { libc::waitpid(pid, &mut raw, 0) }, pid);
        ExitStatus {
            code: libc::WIFEXITED(raw).then(|| libc::WEXITSTATUS(raw)),
            signal: libc::WIFSIGNALED(raw).then(|| libc::WTERMSIG(raw)),
        }
    }

    /// Starts the task and waits for it (what the supervisor process does, without its reaper).
    fn spawn_and_wait(spec: &Supervised) -> std::io::Result<ExitStatus> {
        match task_command(spec, &[])?.spawn() {
            Ok(pid) => Ok(wait(pid)),
            Err(SpawnError::Clone(e)) => Err(e),
            Err(SpawnError::Child { pid, error }) => {
                assert_eq!(wait(pid).code, Some(127));
                Err(error)
            }
        }
    }

    fn spec(dir: &Path, program: Program) -> Supervised {
        let sandbox = dir.join("sandbox");
        let meta = dir.join("meta");
        std::fs::create_dir_all(&sandbox).unwrap();
        std::fs::create_dir_all(&meta).unwrap();
        Supervised {
            sandbox,
            meta,
            cgroup_procs: Vec::new(),
            cgroup_base: None,
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

        let s = spec(dir.path(), Program::Shell("echo $((1 + 2)); exit 3".into()));
        assert_eq!(spawn_and_wait(&s).unwrap().code, Some(3));
        assert_eq!(
            std::fs::read_to_string(s.sandbox.join("stdout")).unwrap(),
            "3\n"
        );
    }

    #[test]
    fn the_command_line_reads_back_exactly() {
        for (program, identity) in [
            (Program::Shell("echo 'a b' $X; exit 3".into()), None),
            (
                Program::Argv(vec!["printf".into(), "--".into(), "".into(), "a b".into()]),
                Some(Identity {
                    uid: 65534,
                    gid: 65534,
                    groups: vec![1, 2],
                }),
            ),
            (
                Program::Argv(vec!["--argv".into(), "--sandbox".into()]),
                Some(Identity {
                    uid: 1,
                    gid: 2,
                    groups: vec![],
                }),
            ),
        ] {
            let spec = Supervised {
                sandbox: "/w/sandboxes/t".into(),
                meta: "/w/meta/t".into(),
                cgroup_procs: vec!["/sys/fs/cgroup/g/t/cgroup.procs".into()],
                cgroup_base: identity
                    .as_ref()
                    .map(|_| r#"{"oom_kills":1,"cpu_usec":7}"#.to_string()),
                program,
                identity,
            };
            let back = parse_args(command_line(&spec)).unwrap();
            assert_eq!(back.sandbox, spec.sandbox);
            assert_eq!(back.meta, spec.meta);
            assert_eq!(back.cgroup_procs, spec.cgroup_procs);
            assert_eq!(back.cgroup_base, spec.cgroup_base);
            assert_eq!(back.program, spec.program);
            assert_eq!(back.identity, spec.identity);
        }
        let bad = |a: &[&str]| parse_args(a.iter().map(OsString::from)).unwrap_err();
        assert!(bad(&["--sandbox", "s", "--meta", "m"]).contains("COMMAND"));
        assert!(bad(&["--meta", "m", "--", "true"]).contains("--sandbox"));
        assert!(bad(&["--uid", "x", "--", "true"]).contains("not a number"));
        assert!(
            bad(&["--uid", "1", "--sandbox", "s", "--meta", "m", "--", "t"]).contains("together")
        );
        assert!(bad(&["--frobnicate", "1", "--", "true"]).contains("unknown"));
        assert!(bad(&["--cgroup-base", "{\n}", "--", "true"]).contains("one line"));
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
