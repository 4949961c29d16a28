//! Task logs, files and exec through the master (issue 30 item 1), on one live cluster, with
//! `gantryctl` run as a non-root operator (uid 65534 with its own copy of the operator
//! certificate: nothing an operator does here needs root). In order:
//!
//! - `gantryctl logs -f` prints a task's output while the task writes, and ends with the task;
//!   `--stderr` reads standard error, also once the task has ended (sandboxes stay readable);
//! - `gantryctl fs` lists the sandbox and reads a file from an offset;
//! - paths leaving the sandbox (`../`, absolute, a symlink, a symlinked directory) are refused;
//! - the task's own framework principal may read its logs, another framework's may not;
//! - `gantryctl exec` runs in the running task: its output, its exit status, the task's user,
//!   cgroups, working directory and environment; with `-t` on a terminal of the size asked; exec into an ended task is refused;
//! - exec sessions past the per-principal limit are refused (429).

use std::io::BufRead;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gantry_master::client::{Credentials, OperatorClient};
use gantry_sdk::protocol::exec_frame;
use gantry_tests::{bin, https_client, start_recorder, task, Cluster};
use gantry_transport::tls::{self, PeerIdentity};
use serde_json::Value;

const T: Duration = Duration::from_secs(60);
/// The unprivileged operator's uid and gid (`nobody`), also the agent's default task user.
const NOBODY: u32 = 65534;

/// The operator's own directory (owned by `nobody`): the CA and the `admin` operator
/// certificate, copied from the cluster's TLS directory. Removed on drop.
struct OperatorHome(PathBuf);

impl OperatorHome {
    fn new(cluster: &Cluster) -> Self {
        let dir = std::env::temp_dir().join(format!("gantry-logs-op-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for f in ["ca.pem", "operator-admin.pem", "operator-admin.key"] {
            std::fs::copy(cluster.tls_dir.join(f), dir.join(f)).unwrap();
            std::os::unix::fs::chown(dir.join(f), Some(NOBODY), Some(NOBODY)).unwrap();
        }
        std::os::unix::fs::chown(&dir, Some(NOBODY), Some(NOBODY)).unwrap();
        Self(dir)
    }

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

async fn wait_for(
    cluster: &Cluster,
    c: &OperatorClient,
    path: &str,
    what: &str,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + T;
    loop {
        if let Ok(Ok(v)) = c.get(path).await.map(|b| serde_json::from_str::<Value>(&b)) {
            if pred(&v) {
                return v;
            }
        }
        if Instant::now() > deadline {
            cluster.dump_logs();
            panic!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An HTTPS client presenting the certificate of framework `principal` (from the cluster's
/// TLS directory).
fn framework_http(cluster: &Cluster, principal: &str) -> reqwest::Client {
    let roots = tls::load_roots(&cluster.tls_dir).unwrap();
    let id =
        tls::load_identity(&cluster.tls_dir, &PeerIdentity::Framework(principal.into())).unwrap();
    reqwest::Client::builder()
        .use_preconfigured_tls(tls::https_client_config(roots, Some(&id)).unwrap())
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

/// The status of a `GET path` and its body.
async fn status_of(c: &OperatorClient, path: &str) -> (u16, String) {
    match c.get(path).await {
        Ok(body) => (200, body),
        Err(e) => (e.status().unwrap_or(0), e.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_files_and_exec_through_the_master_as_a_non_root_operator() {
    let cluster = Cluster::start_with(
        &[("logs-a1", "cpus:4;mem:2048")],
        &["--http-max-exec-sessions-per-principal", "2"],
        &[],
    )
    .unwrap();
    let home = OperatorHome::new(&cluster);
    let api = https_client(
        cluster.master.http,
        &cluster.tls_dir,
        Credentials::Certificate("admin".into()),
    );
    let ctl = |args: &[&str]| home.run(&cluster, args);

    // A task that writes for a while (and leaves a file, a symlink out, a directory), and one
    // that runs on for exec.
    let writer = task(
        "writer",
        "printf 0123456789abcdef > data.txt; ln -s /etc/passwd link; ln -s / root; mkdir sub; \
         i=0; while [ $i -lt 25 ]; do i=$((i+1)); echo line-$i; echo err-$i >&2; sleep 0.3; done",
        "cpus:1;mem:64",
    );
    let sleeper =
        task("sleeper", "echo ready; sleep 300", "cpus:1;mem:64").with_env("MARK", "from-the-task");
    let (_updates, _handle, _driver) = start_recorder(
        cluster.driver_config("logs-fw", &["eng"]),
        vec![writer, sleeper],
    );
    wait_for(
        &cluster,
        &api,
        "/api/v1/tasks?state=RUNNING",
        "2 running tasks",
        |v| v["total"] == 2,
    )
    .await;

    // Logs followed while the task writes: the first line arrives while it still runs, and the
    // follow ends once it has ended, with every line.
    let mut follow = home
        .command(&cluster, &["logs", "-f", "writer"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(follow.stdout.take().unwrap()).lines();
    let first = tokio::task::block_in_place(|| lines.next())
        .unwrap()
        .unwrap();
    assert_eq!(first, "line-1");
    let t = api.get("/api/v1/tasks/writer").await.unwrap();
    let t: Value = serde_json::from_str(&t).unwrap();
    assert_eq!(
        t["state"], "RUNNING",
        "the follow printed before the task ended: {t:#}"
    );
    let rest: Vec<String> = tokio::task::block_in_place(|| lines.map(|l| l.unwrap()).collect());
    let status = tokio::task::block_in_place(|| follow.wait()).unwrap();
    assert!(status.success(), "logs -f: {status:?}");
    assert_eq!(rest.len(), 24, "{rest:?}");
    assert_eq!(rest.last().map(String::as_str), Some("line-25"));
    wait_for(
        &cluster,
        &api,
        "/api/v1/tasks/writer",
        "writer finished",
        |v| v["state"] == "FINISHED",
    )
    .await;

    // The ended task's sandbox stays readable: stderr, the listing, a file from an offset.
    let (code, out, err) = ctl(&["logs", "writer", "--stderr"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("err-1\n") && out.ends_with("err-25\n"),
        "{out}"
    );
    let (code, out, err) = ctl(&["logs", "writer", "--tail", "8"]);
    assert_eq!((code, out.as_str()), (0, "line-25\n"), "{err}");
    let (code, out, err) = ctl(&["fs", "writer"]);
    assert_eq!(code, 0, "{err}");
    for name in ["data.txt", "link", "stdout", "stderr", "sub/"] {
        assert!(out.lines().any(|l| l.ends_with(name)), "{name}: {out}");
    }
    let (code, out, err) = ctl(&["fs", "writer", "data.txt", "--offset", "4", "--length", "6"]);
    assert_eq!((code, out.as_str()), (0, "456789"), "{err}");
    let (_, body) = status_of(&api, "/api/v1/tasks/writer/files?path=sub").await;
    assert!(body.contains("\"total\":0"), "{body}");

    // Paths that leave the sandbox are refused, whatever the spelling.
    for path in [
        "../../meta",
        "sub/../../x",
        "/etc/passwd",
        "link",
        "root/etc/passwd",
        "root",
    ] {
        let q = format!("/api/v1/tasks/writer/files/read?path={}", urlenc(path));
        let (status, body) = status_of(&api, &q).await;
        assert_eq!(status, 403, "{path}: {body}");
        let (code, _, err) = ctl(&["fs", "writer", path]);
        assert_eq!(code, 4, "{path}: {err}");
    }
    let (status, body) = status_of(&api, "/api/v1/tasks/writer/files/read?path=missing").await;
    assert_eq!(status, 404, "{body}");

    // The task's own framework may read its logs; another framework may not.
    let logs_url = format!("https://{}/api/v1/tasks/writer/logs", cluster.master.http);
    let own = framework_http(&cluster, "logs-fw")
        .get(&logs_url)
        .send()
        .await
        .unwrap();
    assert_eq!(own.status(), 200);
    assert!(own.text().await.unwrap().ends_with("line-25\n"));
    let _other = cluster.driver_config("other-fw", &["eng"]);
    let other = framework_http(&cluster, "other-fw")
        .get(&logs_url)
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 403);
    assert!(other.text().await.unwrap().contains("its own tasks"));

    // Exec in the running task: its output and exit status, as the task's user, in its
    // cgroups, working directory and environment.
    let (code, out, err) = ctl(&[
        "exec",
        "sleeper",
        "--",
        "sh",
        "-c",
        "id -u; pwd; echo $MARK; cat /proc/self/cgroup; echo oops >&2; exit 7",
    ]);
    assert_eq!(code, 7, "{out} {err}");
    assert!(err.contains("oops"), "{err}");
    let mut out_lines = out.lines();
    assert_eq!(out_lines.next(), Some(NOBODY.to_string().as_str()), "{out}");
    let sleeper = api.get("/api/v1/tasks/sleeper").await.unwrap();
    let sleeper: Value = serde_json::from_str(&sleeper).unwrap();
    let id = sleeper["id"].as_str().unwrap();
    let sandbox = cluster.agents[0].work_dir.join("sandboxes").join(id);
    assert_eq!(out_lines.next(), Some(sandbox.to_str().unwrap()), "{out}");
    assert_eq!(out_lines.next(), Some("from-the-task"), "{out}");
    let exec_cgroups: Vec<&str> = out_lines.collect();
    let record = std::fs::read_to_string(
        cluster.agents[0]
            .work_dir
            .join("meta")
            .join(id)
            .join("launch.claim"),
    )
    .unwrap();
    let pgid: i32 = record
        .lines()
        .find_map(|l| l.strip_prefix("task "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let task_cgroups = std::fs::read_to_string(format!("/proc/{pgid}/cgroup")).unwrap();
    for line in task_cgroups
        .lines()
        .filter(|l| l.contains(":memory:") || l.contains(":pids:"))
    {
        assert!(
            exec_cgroups.contains(&line),
            "{line} not in {exec_cgroups:?}"
        );
    }
    // Exec on a terminal (-t): the command's standard input is a tty of the size asked for,
    // it runs as the task's user, its output comes back as one stream, and its exit status is
    // returned; a zero size is a usage error.
    let (code, out, err) = ctl(&[
        "exec",
        "-t",
        "--tty-size",
        "33x101",
        "sleeper",
        "--",
        "sh",
        "-c",
        "test -t 0 && echo tty; stty size; id -u; echo oops >&2; exit 5",
    ]);
    assert_eq!(code, 5, "{out} {err}");
    let lines: Vec<&str> = out.lines().map(str::trim_end).collect();
    let nobody = NOBODY.to_string();
    assert_eq!(lines, ["tty", "33 101", &nobody, "oops"], "{out} {err}");
    let (code, _, err) = ctl(&["exec", "-t", "--tty-size", "0x80", "sleeper", "--", "true"]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = ctl(&["exec", "writer", "--", "true"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("not running"), "{err}");
    // (Not found, or permission denied when a directory of the task's PATH is closed to its
    // user: what execvp says.)
    let (code, _, err) = ctl(&["exec", "sleeper", "--", "no-such-program"]);
    assert!(code != 0 && err.contains("no-such-program"), "{err}");

    // A live session on a terminal (gantryctl exec -it, standard input a pipe here): lines
    // written after the shell started are run and echoed back as they come; its exit status
    // arrives.
    let mut live = home
        .command(
            &cluster,
            &["exec", "-it", "--tty-size", "20x70", "sleeper", "--", "sh"],
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut live_in = live.stdin.take().unwrap();
    let mut live_out = live.stdout.take().unwrap();
    let seen = tokio::task::block_in_place(|| {
        use std::io::{Read, Write};
        live_in.write_all(b"echo live-$((6*7))\n").unwrap();
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&seen).contains("live-42") {
            let n = live_out.read(&mut buf).unwrap();
            assert!(n > 0, "{}", String::from_utf8_lossy(&seen));
            seen.extend_from_slice(&buf[..n]);
        }
        // The shell is still there: a second line, then its exit.
        live_in.write_all(b"stty size; exit 3\n").unwrap();
        live_out.read_to_end(&mut seen).unwrap();
        String::from_utf8_lossy(&seen).into_owned()
    });
    let status = tokio::task::block_in_place(|| live.wait()).unwrap();
    assert_eq!(status.code(), Some(3), "{seen}");
    assert!(
        seen.contains("echo live-$((6*7))"),
        "the pty echoes: {seen}"
    );
    assert!(seen.contains("20 70"), "{seen}");

    // The same session through a raw client of the upgraded connection: the window size
    // changes while the shell runs (stty sees it), and the exit frame ends the session.
    let attach = format!(
        "/api/v1/tasks/sleeper/exec/attach?command={}&rows=24&cols=80",
        urlenc("[\"sh\"]")
    );
    let mut io = api.upgrade(&attach, "gantry-exec").await.unwrap();
    send_frame(&mut io, exec_frame::STDIN, b"stty size\n").await;
    let out = frames_until(&mut io, |o, _| o.contains("24 80")).await;
    assert!(out.0.contains("24 80"), "{out:?}");
    let mut size = 40u16.to_be_bytes().to_vec();
    size.extend_from_slice(&132u16.to_be_bytes());
    send_frame(&mut io, exec_frame::RESIZE, &size).await;
    send_frame(&mut io, exec_frame::STDIN, b"stty size; exit 4\n").await;
    let (out, end) = frames_until(&mut io, |_, end| end.is_some()).await;
    assert!(out.contains("40 132"), "{out}");
    assert_eq!(
        end.as_ref().map(|(k, v)| (*k, v["exit_code"].clone())),
        Some((exec_frame::EXIT, Value::from(4))),
        "{out} {end:?}"
    );
    // A raw client that sends an oversized frame gets a clear error and the session ends.
    let mut io = api.upgrade(&attach, "gantry-exec").await.unwrap();
    let mut header = vec![exec_frame::STDIN];
    header.extend_from_slice(&((exec_frame::MAX_PAYLOAD as u32) + 1).to_be_bytes());
    tokio::io::AsyncWriteExt::write_all(&mut io, &header)
        .await
        .unwrap();
    let (_, end) = frames_until(&mut io, |_, end| end.is_some()).await;
    let (kind, v) = end.unwrap();
    assert_eq!(kind, exec_frame::ERROR, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("at most 65536 bytes"),
        "{v}"
    );
    // Without the upgrade headers: 426.
    let (status, body) = status_of(&api, &attach).await;
    assert_eq!(status, 426, "{body}");

    // Exec sessions per principal: two at once (the master's flag), a third is refused.
    let mut long: Vec<std::process::Child> = (0..2)
        .map(|_| {
            home.command(
                &cluster,
                &["exec", "sleeper", "--", "sh", "-c", "echo started; sleep 8"],
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
        })
        .collect();
    let mut outputs = Vec::new();
    for child in &mut long {
        let mut l = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let started = tokio::task::block_in_place(|| l.next()).unwrap().unwrap();
        assert_eq!(started, "started");
        outputs.push(l);
    }
    let (code, _, err) = ctl(&["exec", "sleeper", "--", "true"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("429") && err.contains("exec sessions"),
        "{err}"
    );
    for mut child in long {
        let status = tokio::task::block_in_place(|| child.wait()).unwrap();
        assert!(status.success(), "{status:?}");
    }
    drop(outputs);
    let (code, out, err) = ctl(&["exec", "sleeper", "--", "echo", "free again"]);
    assert_eq!((code, out.as_str()), (0, "free again\n"), "{err}");
    let log = std::fs::read_to_string(&cluster.master.log).unwrap();
    assert!(
        log.contains("exec in a task") && log.contains("operator:admin"),
        "exec sessions are logged"
    );
}

/// Sends one frame of a live exec.
async fn send_frame(io: &mut reqwest::Upgraded, kind: u8, payload: &[u8]) {
    tokio::io::AsyncWriteExt::write_all(io, &exec_frame::encode(kind, payload))
        .await
        .unwrap();
}

/// Reads a live exec's frames until `done(output so far, last frame)` holds or the session
/// ends: the output and the exit or error frame (kind, JSON) if one came.
async fn frames_until(
    io: &mut reqwest::Upgraded,
    done: impl Fn(&str, &Option<(u8, Value)>) -> bool,
) -> (String, Option<(u8, Value)>) {
    use tokio::io::AsyncReadExt;
    let mut out = String::new();
    let mut end = None;
    let read = async {
        while !done(&out, &end) && end.is_none() {
            let mut h = [0u8; 5];
            if io.read_exact(&mut h).await.is_err() {
                break;
            }
            let (kind, len) = exec_frame::header(h).unwrap();
            let mut payload = vec![0u8; len];
            io.read_exact(&mut payload).await.unwrap();
            match kind {
                exec_frame::STDOUT | exec_frame::STDERR => {
                    out.push_str(&String::from_utf8_lossy(&payload))
                }
                k => end = Some((k, serde_json::from_slice(&payload).unwrap())),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .unwrap_or_else(|_| panic!("no end of session within 30 s: {out}"));
    (out, end)
}

fn urlenc(s: &str) -> String {
    form_urlencoded_lite(s)
}

/// Percent-encodes everything but unreserved characters.
fn form_urlencoded_lite(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            b => format!("%{b:02X}"),
        })
        .collect()
}
