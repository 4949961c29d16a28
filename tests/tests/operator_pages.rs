//! Operator pages and checked input on a live cluster (issue 30), through `gantryctl` run as a
//! non-root operator (uid 65534 with its own copy of the operator certificate: nothing here
//! needs root). One cluster for every case, in order:
//!
//! - `gantryctl -V` / `--help` name gantryctl; `completion bash` prints a completion script;
//! - `task`, `framework`, `agent`, `offers` pages by name, with names and full GPU UUIDs, and
//!   `GET /api/v1/tasks/{id}`; unknown names exit 3;
//! - a task the master refuses (`ERROR`) is kept with its reason and a message in words;
//! - filters naming nothing (`tasks --state bogus`, `--framework NAME`, `--agent NAME`) exit 2;
//! - quotas and reservations naming an unknown resource kind are refused with the known ones;
//!   a quota change keeps the part it does not name; a limit below use warns;
//! - `mark-gone` of a connected agent with tasks and `teardown` of a connected framework are
//!   refused without a terminal unless `--yes`;
//! - a drain deadline kill reads `drain-deadline`, an operator's teardown `operator-kill`;
//! - `gantryctl events` prints times and agent names and reconnects on its own when the master
//!   restarts.

use std::io::BufRead;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use gantry_master::client::{Credentials, OperatorClient};
use gantry_tests::{bin, https_client, start_recorder, task, Cluster};
use serde_json::Value;

const T: Duration = Duration::from_secs(60);
/// The unprivileged operator's uid and gid (`nobody`).
const NOBODY: u32 = 65534;

/// The operator's own directory (owned by `nobody`): the CA and the `admin` operator
/// certificate, copied from the cluster's TLS directory. Removed on drop.
struct OperatorHome(PathBuf);

impl OperatorHome {
    fn new(cluster: &Cluster) -> Self {
        let dir = std::env::temp_dir().join(format!("gantry-operator-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for f in ["ca.pem", "operator-admin.pem", "operator-admin.key"] {
            std::fs::copy(cluster.tls_dir.join(f), dir.join(f)).unwrap();
            std::os::unix::fs::chown(dir.join(f), Some(NOBODY), Some(NOBODY)).unwrap();
        }
        std::os::unix::fs::chown(&dir, Some(NOBODY), Some(NOBODY)).unwrap();
        Self(dir)
    }

    /// `gantryctl ARGS` as `nobody`, without a terminal: the command to run or spawn.
    fn command(&self, cluster: &Cluster, args: &[&str]) -> Command {
        let mut cmd = Command::new(bin("gantryctl").unwrap());
        cmd.arg("--master")
            .arg(format!("https://{}", cluster.master.http))
            .arg("--tls-dir")
            .arg(&self.0)
            .args(args)
            .env_clear()
            .env("HOME", &self.0)
            .env("PATH", "/usr/bin:/bin")
            .stdin(Stdio::null())
            .uid(NOBODY)
            .gid(NOBODY);
        cmd
    }

    /// (exit code, stdout, stderr).
    fn run(&self, cluster: &Cluster, args: &[&str]) -> (i32, String, String) {
        let out = self.command(cluster, args).output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

impl Drop for OperatorHome {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn get(c: &OperatorClient, path: &str) -> Value {
    let body = c
        .get(path)
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e:#}"));
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
}

/// Polls `GET path` until `pred` holds.
async fn wait_for(
    cluster: &Cluster,
    c: &OperatorClient,
    path: &str,
    what: &str,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + T;
    loop {
        if let Ok(v) = c.get(path).await.map(|b| serde_json::from_str::<Value>(&b)) {
            match v {
                Ok(v) if pred(&v) => return v,
                Ok(v) if Instant::now() > deadline => {
                    cluster.dump_logs();
                    panic!("timed out waiting for {what}; last {path}: {v:#}")
                }
                _ => {}
            }
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `gantryctl events` (tables) in the background: its stdout and stderr lines.
struct Follower {
    child: std::process::Child,
    lines: std_mpsc::Receiver<(bool, String)>,
    out: Vec<String>,
    err: Vec<String>,
}

impl Follower {
    fn start(home: &OperatorHome, cluster: &Cluster) -> Self {
        let mut child = home
            .command(cluster, &["events"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = std_mpsc::channel();
        for (is_err, pipe) in [
            (
                false,
                Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            ),
            (true, Box::new(child.stderr.take().unwrap())),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(pipe).lines() {
                    let Ok(line) = line else { return };
                    if tx.send((is_err, line)).is_err() {
                        return;
                    }
                }
            });
        }
        Self {
            child,
            lines,
            out: Vec::new(),
            err: Vec::new(),
        }
    }

    /// Waits until `n` stdout lines match `pred`.
    async fn wait(&mut self, what: &str, n: usize, pred: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + T;
        loop {
            while let Ok((is_err, l)) = self.lines.try_recv() {
                if is_err {
                    self.err.push(l);
                } else {
                    self.out.push(l);
                }
            }
            if self.out.iter().filter(|l| pred(l)).count() >= n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "no {what} within {T:?}; stdout: {:#?}; stderr: {:#?}",
                self.out,
                self.err
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_pages_checked_input_and_reasons_as_a_non_root_operator() {
    // Two agents; each task takes 3 of an agent's 4 cpus, so each agent runs one.
    let mut cluster = Cluster::start(&[
        ("pages-a1", "cpus:4;mem:2048"),
        ("pages-a2", "cpus:4;mem:2048"),
    ])
    .unwrap();
    let home = OperatorHome::new(&cluster);
    let api = https_client(
        cluster.master.http,
        &cluster.tls_dir,
        Credentials::Certificate("admin".into()),
    );
    let ctl = |args: &[&str]| home.run(&cluster, args);

    // gantryctl says what it is.
    let (code, out, _) = ctl(&["-V"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("gantryctl "), "{out}");
    let (code, out, _) = ctl(&["--help"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("gantryctl: the operator's tool") && !out.contains("Gantry master"),
        "{out}"
    );
    let (code, out, _) = ctl(&["completion", "bash"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("_gantryctl") && out.contains("mark-gone"),
        "{out}"
    );
    let (code, _, _) = ctl(&["completion", "tcsh"]);
    assert_eq!(code, 2);

    // A framework with two long tasks and one the master refuses (an empty command).
    let cfg = cluster.framework_config("pages-fw", &["eng"]);
    let (_updates, _handle, _driver) = start_recorder(
        cfg,
        vec![
            task("long-1", "sleep 300", "cpus:3;mem:64"),
            task("long-2", "sleep 300", "cpus:3;mem:64"),
            task("bad", "", "cpus:0.1;mem:16"),
        ],
    );
    wait_for(
        &cluster,
        &api,
        "/api/v1/tasks?state=RUNNING",
        "2 running tasks",
        |v| v["total"] == 2,
    )
    .await;

    // The task page, by name: names, not just ids.
    let t1 = get(&api, "/api/v1/tasks/long-1").await;
    assert_eq!(t1["active"], true, "{t1:#}");
    assert_eq!(t1["framework_name"], "pages-fw", "{t1:#}");
    let a1 = t1["agent_name"].as_str().unwrap().to_string();
    assert!(a1.starts_with("pages-a"), "{t1:#}");
    let by_id = get(
        &api,
        &format!("/api/v1/tasks/{}", t1["id"].as_str().unwrap()),
    )
    .await;
    assert_eq!(by_id["name"], "long-1");
    let (code, out, err) = ctl(&["task", "long-1"]);
    assert_eq!(code, 0, "{err}");
    for want in ["RUNNING", "pages-fw", a1.as_str(), "cpus:3"] {
        assert!(out.contains(want), "{want}: {out}");
    }
    let (code, _, err) = ctl(&["task", "no-such-task"]);
    assert_eq!(code, 3, "{err}");
    let (code, out, err) = ctl(&["framework", "pages-fw"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("connected") && out.contains("long-2"), "{out}");
    let (code, out, err) = ctl(&["agent", &a1]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("long-1") && !out.contains("long-2"), "{out}");
    let (code, out, err) = ctl(&["offers"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("OFFER"), "{out}");

    // The refused task is kept with its reason and a message in words.
    let errors = wait_for(
        &cluster,
        &api,
        "/api/v1/tasks?state=ERROR",
        "the ERROR task",
        |v| v["total"] == 1,
    )
    .await;
    let bad = &errors["tasks"][0];
    assert_eq!(bad["name"], "bad");
    assert_eq!(bad["reason"], "invalid-task");
    assert!(
        bad["message"]
            .as_str()
            .unwrap()
            .contains("empty shell command"),
        "{bad:#}"
    );
    let (code, out, _) = ctl(&["task", "bad"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("ERROR") && out.contains("empty shell command"),
        "{out}"
    );

    // Filters that name nothing are errors, not empty tables.
    let (code, _, err) = ctl(&["tasks", "--state", "bogus"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("RUNNING"), "{err}");
    let (code, _, err) = ctl(&["tasks", "--framework", "no-such-fw"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("pages-fw"),
        "the known frameworks are listed: {err}"
    );
    let (code, _, err) = ctl(&["tasks", "--agent", "no-such-agent"]);
    assert_eq!(code, 2, "{err}");
    let (code, out, err) = ctl(&["tasks", "--framework", "pages-fw", "--state", "running"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("long-1") && out.contains("(2 shown of 2"),
        "{out}"
    );

    // Resource kinds are checked; a quota change keeps what it does not name.
    let (code, _, err) = ctl(&["quota", "etl", "--limit", "cpu:8"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("\"cpu\"") && err.contains("cpus"), "{err}");
    let (code, _, err) = ctl(&["reserve", &a1, "--role", "ml", "gpu:1"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("gpus"), "{err}");
    let (code, _, err) = ctl(&["quota", "eng", "--guarantee", "cpus:1"]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = ctl(&["quota", "eng", "--limit", "cpus:8"]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("warning"), "{err}");
    let q = get(&api, "/api/v1/quotas").await;
    let eng = q
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["role"] == "eng")
        .unwrap_or_else(|| panic!("{q:#}"));
    assert_eq!(
        eng["guarantee"]["cpus"], 1.0,
        "the guarantee was kept: {q:#}"
    );
    assert_eq!(eng["limit"]["cpus"], 8.0, "{q:#}");
    // Below what eng's tasks hold (6 cpus): accepted, with a warning.
    let (code, _, err) = ctl(&["quota", "eng", "--limit", "cpus:2"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("warning") && err.contains("cpus:6"), "{err}");
    let (code, _, err) = ctl(&["quota", "eng"]);
    assert_eq!(code, 2, "nothing to change: {err}");
    let (code, _, err) = ctl(&["quota", "eng", "--no-guarantee", "--no-limit"]);
    assert_eq!(code, 0, "{err}");
    assert!(get(&api, "/api/v1/quotas")
        .await
        .as_array()
        .unwrap()
        .is_empty());

    // Destructive commands on live things need --yes without a terminal.
    let (code, _, err) = ctl(&["mark-gone", &a1]);
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("--yes") && err.contains("1 task"), "{err}");
    let (code, _, err) = ctl(&["teardown", "pages-fw"]);
    assert_eq!(code, 5, "{err}");
    assert_eq!(get(&api, "/api/v1/summary").await["agents"]["total"], 2);
    assert_eq!(
        get(&api, "/api/v1/summary").await["frameworks"]["active"],
        1
    );

    // A drain deadline kill says so.
    let (code, _, err) = ctl(&["drain", &a1, "--deadline", "1s"]);
    assert_eq!(code, 0, "{err}");
    let killed = wait_for(
        &cluster,
        &api,
        "/api/v1/tasks/long-1",
        "long-1 KILLED",
        |v| v["state"] == "KILLED",
    )
    .await;
    assert_eq!(killed["reason"], "drain-deadline", "{killed:#}");
    assert!(
        killed["message"]
            .as_str()
            .unwrap()
            .contains("drain deadline"),
        "{killed:#}"
    );
    let (code, _, err) = ctl(&["undrain", &a1]);
    assert_eq!(code, 0, "{err}");

    // So does an operator's teardown (confirmed with --yes).
    let (code, _, err) = ctl(&["teardown", "pages-fw", "--yes"]);
    assert_eq!(code, 0, "{err}");
    let killed = wait_for(
        &cluster,
        &api,
        "/api/v1/tasks/long-2",
        "long-2 KILLED",
        |v| v["state"] == "KILLED",
    )
    .await;
    assert_eq!(killed["reason"], "operator-kill", "{killed:#}");
    let fw = get(&api, "/api/v1/frameworks/pages-fw").await;
    assert_eq!(fw["completed"], true, "{fw:#}");
    let (code, out, _) = ctl(&["tasks", "--state", "KILLED"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("drain-deadline") && out.contains("operator-kill"),
        "{out}"
    );

    // Events: times and agent names; a master restart is followed by a reconnection.
    let mut events = Follower::start(&home, &cluster);
    events
        .wait("a snapshot", 1, |l| l.contains("snapshot:"))
        .await;
    let first = events.out[0].clone();
    assert!(
        first.starts_with("20") && first.contains("Z  snapshot: 2 agents"),
        "a time first: {first}"
    );
    cluster.master.restart().unwrap();
    events
        .wait("a second snapshot", 2, |l| l.contains("snapshot:"))
        .await;
    events
        .wait("an agent event by name", 1, |l| {
            l.contains("agent_") && l.contains("pages-a")
        })
        .await;
    assert!(
        events.err.iter().any(|l| l.contains("reconnecting")),
        "{:#?}",
        events.err
    );
    assert!(
        !events.err.iter().any(|l| l.starts_with("error")),
        "{:#?}",
        events.err
    );
}
