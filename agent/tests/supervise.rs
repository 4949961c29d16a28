//! The `gantry-supervise --server` binary, driven as the agent drives it (JSON lines on its
//! stdin and stdout): it runs tasks and records their pids and exits, a launch a restarted
//! agent has already claimed (and reported FAILED) is refused without running the task, a
//! burst of tasks is reaped whole, and it outlives the agent until its last task ended.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};

use gantry_agent::executor::server::{Reply, Request};
use gantry_agent::executor::{self, supervise, ExitStatus};

struct Server {
    child: Child,
    out: BufReader<ChildStdout>,
}

impl Server {
    fn start() -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_gantry-supervise"))
            .arg("--server")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        Server { child, out }
    }

    fn send(&mut self, id: u64, sandbox: &Path, meta: &Path, shell: &str) {
        let args = supervise::command_line(&supervise::Supervised {
            sandbox: sandbox.to_path_buf(),
            meta: meta.to_path_buf(),
            cgroup_procs: Vec::new(),
            // The first task's cgroup, as if reused: its baseline goes into the claim.
            cgroup_base: (id == 1).then(|| BASE.to_string()),
            program: gantry_proto::Program::Shell(shell.into()),
            identity: None,
        })
        .into_iter()
        .map(|a| a.into_string().unwrap())
        .collect();
        let request = Request {
            id,
            args,
            env: vec![
                ("PATH".into(), "/usr/bin:/bin".into()),
                ("GREETING".into(), format!("hi {id}")),
            ],
        };
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{}", serde_json::to_string(&request).unwrap()).unwrap();
    }

    fn reply(&mut self) -> Reply {
        let mut line = String::new();
        assert!(
            self.out.read_line(&mut line).unwrap() > 0,
            "the server ended"
        );
        serde_json::from_str(&line).unwrap()
    }
}

/// A reused cgroup's counters as the agent hands them over (`isolation::Baseline`, JSON).
const BASE: &str = r#"{"oom_kills":1,"cpu_usec":250}"#;

fn dirs(root: &Path, name: &str) -> (PathBuf, PathBuf) {
    let (sandbox, meta) = (root.join(name).join("s"), root.join(name).join("m"));
    std::fs::create_dir_all(&sandbox).unwrap();
    std::fs::create_dir_all(&meta).unwrap();
    (sandbox, meta)
}

#[test]
fn runs_tasks_records_pids_and_exits_and_reaps_a_burst() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start();
    let (sandbox, meta) = dirs(dir.path(), "one");
    server.send(1, &sandbox, &meta, "echo $GREETING; exit 4");
    let Reply::Started { id: 1, pid } = server.reply() else {
        panic!("not started")
    };
    assert!(pid > 1);
    assert_eq!(
        server.reply(),
        Reply::Exited {
            id: 1,
            status: ExitStatus {
                code: Some(4),
                signal: None
            }
        }
    );
    assert_eq!(executor::read_task_pgid(&meta), Some(pid));
    assert_eq!(executor::read_exit(&meta).unwrap().code, Some(4));
    let record = executor::record::read(&meta).unwrap();
    assert_eq!(record.base.as_deref(), Some(BASE), "written with the claim");
    assert_eq!(
        std::fs::read_to_string(sandbox.join("stdout")).unwrap(),
        "hi 1\n"
    );
    // It claimed the launch: a restarted agent finds it (the server's pid) instead of failing it.
    let found = executor::find_launched(&meta).unwrap();
    assert_eq!(found.supervisor_pid, server.child.id() as i32);
    assert_eq!(found.task_pgid, pid);
    assert!(
        !executor::still_running(&found, &meta),
        "its exit is recorded"
    );

    // A burst: every task started once and reaped once, whatever the order (a task can end
    // before its spawner recorded it), a signal reported as such.
    let n = 200u64;
    for id in 10..10 + n {
        let (sandbox, meta) = dirs(dir.path(), &format!("t{id}"));
        let shell = if id == 10 {
            "kill -9 $$"
        } else {
            "exit $((ID % 7))"
        };
        server.send(id, &sandbox, &meta, &shell.replace("ID", &id.to_string()));
    }
    let (mut started, mut exited) = (Vec::new(), std::collections::HashMap::new());
    while exited.len() < n as usize {
        match server.reply() {
            Reply::Started { id, pid } => {
                assert!(pid > 1);
                assert!(!exited.contains_key(&id), "{id}: exited before started");
                started.push(id);
            }
            Reply::Exited { id, status } => {
                assert!(exited.insert(id, status).is_none(), "{id} reaped twice");
            }
            r => panic!("{r:?}"),
        }
    }
    started.sort();
    assert_eq!(started, (10..10 + n).collect::<Vec<_>>());
    assert_eq!(exited[&10].signal, Some(9));
    for id in 11..10 + n {
        assert_eq!(exited[&id].code, Some((id % 7) as i32), "{id}");
        let meta = dir.path().join(format!("t{id}")).join("m");
        assert_eq!(executor::read_exit(&meta), Some(exited[&id]));
    }
    drop(server.child.stdin.take());
    assert!(server.child.wait().unwrap().success());
}

#[test]
fn a_launch_claimed_by_a_restarted_agent_is_refused_and_bad_requests_too() {
    let dir = tempfile::tempdir().unwrap();
    let (sandbox, meta) = dirs(dir.path(), "late");
    // The restarted agent found no supervisor and claimed the launch first.
    assert_eq!(executor::find_launched(&meta), None);
    let mut server = Server::start();
    server.send(1, &sandbox, &meta, "touch ran");
    assert!(matches!(server.reply(), Reply::Refused { id: 1, .. }));
    assert!(!sandbox.join("ran").exists());
    assert!(executor::read_exit(&meta).is_none());
    // Arguments it cannot read: refused, and the server goes on.
    let stdin = server.child.stdin.as_mut().unwrap();
    writeln!(
        stdin,
        "{}",
        serde_json::to_string(&Request {
            id: 2,
            args: vec!["--sandbox".into()],
            env: vec![],
        })
        .unwrap()
    )
    .unwrap();
    writeln!(stdin, "not json").unwrap();
    let Reply::Refused { id: 2, reason } = server.reply() else {
        panic!()
    };
    assert!(reason.contains("--sandbox"), "{reason}");
    // A program that cannot start: started as pid 0, exit 127, the reason in its stderr.
    let (sandbox, meta) = dirs(dir.path(), "missing");
    let args = supervise::command_line(&supervise::Supervised {
        sandbox: sandbox.clone(),
        meta: meta.clone(),
        cgroup_procs: Vec::new(),
        cgroup_base: None,
        program: gantry_proto::Program::Argv(vec!["/no/such/program".into()]),
        identity: None,
    })
    .into_iter()
    .map(|a| a.into_string().unwrap())
    .collect();
    writeln!(
        server.child.stdin.as_mut().unwrap(),
        "{}",
        serde_json::to_string(&Request {
            id: 3,
            args,
            env: vec![],
        })
        .unwrap()
    )
    .unwrap();
    assert_eq!(server.reply(), Reply::Started { id: 3, pid: 0 });
    assert!(matches!(server.reply(), Reply::Exited { id: 3, status } if status.code == Some(127)));
    assert!(std::fs::read_to_string(sandbox.join("stderr"))
        .unwrap()
        .contains("could not start the task"));
    drop(server.child.stdin.take());
    assert!(server.child.wait().unwrap().success());
    // Not run by hand.
    let out = Command::new(env!("CARGO_BIN_EXE_gantry-supervise"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn it_outlives_the_agent_until_its_last_task_ended() {
    let dir = tempfile::tempdir().unwrap();
    let (sandbox, meta) = dirs(dir.path(), "long");
    let mut server = Server::start();
    server.send(1, &sandbox, &meta, "sleep 0.5; touch done");
    assert!(matches!(server.reply(), Reply::Started { id: 1, .. }));
    // The agent goes away: its pipes close.
    drop(server.child.stdin.take());
    drop(server.out);
    // SAFETY: getsid reads a process's session id.
    let (ours, its) = unsafe { (libc::getsid(0), libc::getsid(server.child.id() as i32)) };
    assert_ne!(ours, its, "the server runs in its own session");
    assert!(server.child.wait().unwrap().success());
    assert!(sandbox.join("done").exists());
    assert_eq!(executor::read_exit(&meta).unwrap().code, Some(0));
}
