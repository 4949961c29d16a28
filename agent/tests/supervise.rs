//! The `gantry-supervise` binary: it runs a task and records its pid and exit, and a late
//! supervisor whose launch a restarted agent has already claimed (and reported FAILED) backs off
//! without running the task.

use std::process::Command;

use gantry_agent::executor::{self, supervise};

fn supervisor(sandbox: &std::path::Path, meta: &std::path::Path, shell: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gantry-supervise"));
    cmd.args(supervise::command_line(&supervise::Supervised {
        sandbox: sandbox.to_path_buf(),
        meta: meta.to_path_buf(),
        cgroup_procs: Vec::new(),
        program: gantry_sdk::protocol::Program::Shell(shell.into()),
        identity: None,
    }));
    cmd
}

#[test]
fn runs_the_task_and_reports_its_pid_on_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let (sandbox, meta) = (dir.path().join("s"), dir.path().join("m"));
    std::fs::create_dir_all(&sandbox).unwrap();
    std::fs::create_dir_all(&meta).unwrap();
    let out = supervisor(&sandbox, &meta, "echo hi; exit 4")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let pid: i32 = String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(executor::read_task_pgid(&meta), Some(pid));
    assert_eq!(executor::read_exit(&meta).unwrap().code, Some(4));
    assert_eq!(
        std::fs::read_to_string(sandbox.join("stdout")).unwrap(),
        "hi\n"
    );
    // It claimed the launch: a restarted agent finds it instead of failing the task.
    assert!(!executor::claim(&meta));
}

#[test]
fn a_late_supervisor_does_not_start_the_task() {
    let dir = tempfile::tempdir().unwrap();
    let (sandbox, meta) = (dir.path().join("s"), dir.path().join("m"));
    std::fs::create_dir_all(&sandbox).unwrap();
    std::fs::create_dir_all(&meta).unwrap();
    // The restarted agent found no supervisor and claimed the launch first.
    assert_eq!(executor::find_launched(&meta), None);
    let out = supervisor(&sandbox, &meta, "touch ran").output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(out.stdout.is_empty());
    assert!(!sandbox.join("ran").exists());
    assert!(executor::read_exit(&meta).is_none());
}

#[test]
fn bad_arguments_are_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_gantry-supervise"))
        .args(["--sandbox", "/tmp"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("COMMAND"));
}
