//! Atomic task groups (Mesos `LAUNCH_GROUP`, issue 29) on a real cluster: one master, one agent
//! with four stand-in GPUs, cgroups and the port range 29410-29413, and an in-process framework
//! that launches groups with `gantry_sdk::group::place_group` and `DriverHandle::launch_group`.
//!
//! - A group with an invalid member (an empty command) is refused whole: both members end
//!   `ERROR` with one reason naming the bad member; nothing runs.
//! - A group the agent cannot start whole (three of the four ports are held by a process
//!   outside Gantry, the two members ask one port each) starts no member: both end `FAILED`
//!   with one reason naming the member that could not get its port.
//! - A group of 2 tasks x 2 GPUs starts whole: four distinct GPUs, each member reads the other's
//!   address from `GANTRY_GROUP_ADDRS` and connects to its port; then one member exits non-zero
//!   and its sibling is killed (`KILLED`, the message names the failed member).
//!
//! One test in this binary: the stand-in's configuration path is a process-wide variable.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gantry_sdk::group::{place_group, GroupPolicy, TaskGroup};
use gantry_sdk::placement::offers::AgentView;
use gantry_sdk::protocol::*;
use gantry_sdk::{DriverHandle, Scheduler};
use gantry_tests::{
    cgroups_available, standin_lib, task, CgroupRoot, Cluster, Standin, TempDir, Updates,
};

const T: Duration = Duration::from_secs(60);

/// A member: binds `$PORT`, writes its group environment to `DIR/NAME.env`, answers every
/// connection with its name and connects to each other member's port (from
/// `GANTRY_GROUP_ADDRS`, on loopback), appending what the peer answered to `DIR/NAME.peer`;
/// exits with the code written to `DIR/NAME.exit` once that file exists.
const MEMBER: &str = r#"
import os, socket, sys, threading, time
out, name = sys.argv[1], sys.argv[2]
me = int(os.environ["GANTRY_GROUP_INDEX"])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(os.environ["PORT"])))
s.listen()
def serve():
    # Answers on its own thread, so a member waiting on its peer's answer never keeps its
    # own from being given (two members dialling each other in step would wait forever).
    while True:
        try:
            c, _ = s.accept()
            c.sendall(name.encode())
            c.close()
        except OSError:
            pass
threading.Thread(target=serve, daemon=True).start()
keys = ["GANTRY_GROUP_ID", "GANTRY_GROUP_INDEX", "GANTRY_GROUP_SIZE", "GANTRY_GROUP_ADDRS",
        "GANTRY_GROUP_MEMBERS", "PORT", "CUDA_VISIBLE_DEVICES", "GANTRY_TASK_ID"]
with open(f"{out}/{name}.env.tmp", "w") as f:
    f.write("\n".join(f"{k}={os.environ.get(k, '')}" for k in keys))
os.rename(f"{out}/{name}.env.tmp", f"{out}/{name}.env")
peers = [a for i, a in enumerate(os.environ["GANTRY_GROUP_ADDRS"].split(",")) if i != me]
reached = set()
while True:
    for p in peers:
        if p in reached:
            continue
        try:
            c = socket.create_connection(("127.0.0.1", int(p.rsplit(":", 1)[1])), timeout=2)
            got = c.recv(100).decode()
            c.close()
            if got:
                reached.add(p)
                with open(f"{out}/{name}.peer", "a") as f:
                    f.write(got + "\n")
        except OSError:
            pass
    if os.path.exists(f"{out}/{name}.exit"):
        sys.exit(int(open(f"{out}/{name}.exit").read()))
    time.sleep(0.1)
"#;

/// Launches the groups pushed into `queue` (each on one agent, with `place_group`), declines
/// the rest, and forwards updates and errors.
struct GroupLauncher {
    queue: Arc<Mutex<Vec<TaskGroup>>>,
    updates: tokio::sync::mpsc::UnboundedSender<StatusUpdate>,
    errors: tokio::sync::mpsc::UnboundedSender<String>,
}

impl Scheduler for GroupLauncher {
    async fn offers(&mut self, driver: &DriverHandle, offers: Vec<Offer>) {
        let mut views = AgentView::from_offers(&offers, &|_, _| false);
        let mut used: Vec<OfferId> = Vec::new();
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        queue.retain(|g| match place_group(&mut views, g) {
            Some(p) if !p.offer_ids.iter().any(|o| used.contains(o)) => {
                used.extend(&p.offer_ids);
                driver.launch_group(p.offer_ids, g.clone());
                false
            }
            _ => true,
        });
        let rest: Vec<OfferId> = offers
            .iter()
            .map(|o| o.id)
            .filter(|o| !used.contains(o))
            .collect();
        driver.decline(rest, Some(1.0));
    }

    async fn status_update(&mut self, _driver: &DriverHandle, update: &StatusUpdate) {
        let _ = self.updates.send(update.clone());
    }

    async fn error(&mut self, _driver: &DriverHandle, kind: ErrorKind, message: &str) {
        let _ = self.errors.send(format!("{kind:?}: {message}"));
    }
}

fn wait_file(path: &Path) -> String {
    try_wait_file(path).unwrap_or_else(|| panic!("timed out waiting for {path:?}"))
}

/// The file's text once it exists, or `None` after [`T`].
fn try_wait_file(path: &Path) -> Option<String> {
    let deadline = Instant::now() + T;
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            return Some(s);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `KEY=value` lines a member wrote.
fn env_of(files: &Path, name: &str) -> std::collections::BTreeMap<String, String> {
    wait_file(&files.join(format!("{name}.env")))
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A 0777 directory the tasks (run as the agent's task user) can write, removed on drop.
struct Shared(PathBuf);

impl Drop for Shared {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn member(files: &Path, name: &str) -> TaskInfo {
    task(
        name,
        &format!(
            "exec python3 {}/member.py {} {name}",
            files.display(),
            files.display()
        ),
        "cpus:0.25;mem:64;gpus:2;ports:1",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_start_whole_or_not_at_all_see_each_other_and_fail_together() {
    if !cgroups_available("task_groups") {
        return;
    }
    let scratch = TempDir::new("gantry-groups").unwrap();
    let _standin = Standin::four_gpus(scratch.path()).unwrap();
    let root = CgroupRoot::new("groups");
    let lib = standin_lib();
    let cluster = Cluster::start_with(
        &[("groups-0", "cpus:4;mem:4096")],
        &[],
        &[
            "--nvml-lib",
            lib.to_str().unwrap(),
            "--cgroup-root",
            &root.name,
            "--ports",
            "29410-29413",
        ],
    )
    .unwrap();
    let shared = Shared(std::env::temp_dir().join(format!("gantry-groups-{}", std::process::id())));
    let files = shared.0.clone();
    std::fs::create_dir_all(&files).unwrap();
    std::fs::set_permissions(&files, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    std::fs::write(files.join("member.py"), MEMBER).unwrap();

    let queue = Arc::new(Mutex::new(Vec::new()));
    let (up_tx, up_rx) = tokio::sync::mpsc::unbounded_channel();
    let (err_tx, mut err_rx) = tokio::sync::mpsc::unbounded_channel();
    let driver = gantry_sdk::Driver::new(cluster.gpu_framework_config("groups", &["g"]));
    let handle = driver.handle();
    let run = tokio::spawn(driver.run(GroupLauncher {
        queue: queue.clone(),
        updates: up_tx,
        errors: err_tx,
    }));
    let mut updates = Updates::new(up_rx);
    let push = |g: TaskGroup| {
        queue.lock().unwrap().push(g);
        handle.revive(vec![]);
    };

    // 1. An invalid member refuses the whole group.
    let good = member(&files, "i0");
    let mut bad = member(&files, "i1");
    bad.command = CommandInfo::shell(" ");
    push(TaskGroup::new("invalid", vec![good.clone(), bad.clone()]));
    let e0 = updates
        .wait(good.task_id, TaskState::Error, T)
        .await
        .unwrap();
    let e1 = updates
        .wait(bad.task_id, TaskState::Error, T)
        .await
        .unwrap();
    assert_eq!(e0.message, e1.message, "one reason for the whole group");
    assert!(
        e0.message.contains("refused as a whole") && e0.message.contains("\"i1\""),
        "{}",
        e0.message
    );
    assert_eq!(e0.reason, Some(TaskReason::InvalidTask));
    let err = tokio::time::timeout(T, err_rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(err.contains("\"i1\""), "{err}");
    assert!(!files.join("i0.env").exists(), "nothing ran");

    // 2. The agent cannot start the whole group (three of its four ports are held outside
    //    Gantry): no member starts, both fail with one reason naming the member.
    {
        let _held: Vec<std::net::TcpListener> = [29410, 29411, 29412]
            .into_iter()
            .map(|p| std::net::TcpListener::bind(("0.0.0.0", p)).unwrap())
            .collect();
        let p0 = member(&files, "p0");
        let p1 = member(&files, "p1");
        push(TaskGroup::new("ports", vec![p0.clone(), p1.clone()]));
        let f0 = updates
            .wait(p0.task_id, TaskState::Failed, T)
            .await
            .unwrap();
        let f1 = updates
            .wait(p1.task_id, TaskState::Failed, T)
            .await
            .unwrap();
        assert_eq!(f0.message, f1.message);
        assert!(
            f0.message.contains("\"p1\"") && f0.message.contains("no member was started"),
            "{}",
            f0.message
        );
        assert_eq!(f1.reason, Some(TaskReason::PortUnavailable));
        assert!(
            !updates
                .seen
                .iter()
                .any(|u| [p0.task_id, p1.task_id].contains(&u.task_id)
                    && u.state == TaskState::Running),
            "no member ran: {:?}",
            updates.seen
        );
        assert!(!files.join("p0.env").exists());
    }

    // 3. Two members of two GPUs each start together, find each other, and when one exits
    //    non-zero the other is killed.
    let a0 = member(&files, "a0");
    let a1 = member(&files, "a1");
    push(
        TaskGroup::new("eval", vec![a0.clone(), a1.clone()])
            .with_policy(GroupPolicy::KillOnFailure),
    );
    let r0 = updates.wait(a0.task_id, TaskState::Running, T).await;
    let r1 = updates.wait(a1.task_id, TaskState::Running, T).await;
    if r0.is_err() || r1.is_err() {
        cluster.dump_logs();
        panic!("{r0:?} {r1:?}");
    }
    let (env0, env1) = (env_of(&files, "a0"), env_of(&files, "a1"));
    assert_eq!(
        (
            env0["GANTRY_GROUP_ID"].as_str(),
            env0["GANTRY_GROUP_INDEX"].as_str()
        ),
        ("eval", "0")
    );
    assert_eq!(env1["GANTRY_GROUP_INDEX"], "1");
    assert_eq!(env0["GANTRY_GROUP_ADDRS"], env1["GANTRY_GROUP_ADDRS"]);
    let addrs: Vec<&str> = env0["GANTRY_GROUP_ADDRS"].split(',').collect();
    assert!(
        addrs[0].ends_with(&format!(":{}", env0["PORT"])),
        "{addrs:?}"
    );
    assert!(
        addrs[1].ends_with(&format!(":{}", env1["PORT"])),
        "{addrs:?}"
    );
    let members: serde_json::Value = serde_json::from_str(&env0["GANTRY_GROUP_MEMBERS"]).unwrap();
    assert_eq!(members[1]["task_id"], a1.task_id.to_string());
    assert_eq!(members[1]["name"], "a1");
    // Four distinct GPUs, two each.
    let mut gpus: Vec<&str> = [&env0, &env1]
        .iter()
        .flat_map(|e| e["CUDA_VISIBLE_DEVICES"].split(','))
        .collect();
    assert_eq!(gpus.len(), 4, "{env0:?} {env1:?}");
    gpus.sort();
    gpus.dedup();
    assert_eq!(gpus.len(), 4);
    // Each reached the other on the port it read from its environment.
    for (me, peer) in [("a0", "a1"), ("a1", "a0")] {
        let Some(got) = try_wait_file(&files.join(format!("{me}.peer"))) else {
            cluster.dump_logs();
            panic!("{me} never reached {peer}; updates: {:?}", updates.seen);
        };
        assert_eq!(got.trim(), peer);
    }
    // a0 fails: a1 is killed for it.
    std::fs::write(files.join("a0.exit"), "3").unwrap();
    let f = updates
        .wait(a0.task_id, TaskState::Failed, T)
        .await
        .unwrap();
    assert_eq!(f.exit_code, Some(3));
    let k = updates
        .wait(a1.task_id, TaskState::Killed, T)
        .await
        .unwrap();
    assert!(
        k.message.contains(&a0.task_id.to_string()) && k.message.contains("FAILED"),
        "{}",
        k.message
    );

    handle.stop();
    let _ = tokio::time::timeout(T, run).await;
    drop(cluster);
}
