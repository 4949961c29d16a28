//! Least privilege (issue 10, finding 8): tasks run as an unprivileged user.
//!
//! The attack: with `--isolation none` (no cgroups, no mount namespace) a task reads the
//! agent's TLS key and the cluster CA's key from the agent's TLS directory — it could then
//! impersonate the agent or issue certificates for anyone. With tasks running as the agent's
//! `--task-user` (default `nobody` for a root agent) the read fails, while the same framework's
//! legitimate tasks finish; a principal the `run_tasks` ACL does not allow to run as root gets
//! ERROR for a root task; only a principal granted `root` explicitly may run as root. Sandboxes
//! belong to the task's user.

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use gantry_sdk::protocol::{CommandInfo, TaskInfo, TaskReason, TaskState};
use gantry_tests::{start_recorder, task, Cluster, TempDir};

const T: Duration = Duration::from_secs(60);

const ACLS: &str = r#"
[[register_frameworks]]
principals = ["*"]
roles = ["*"]

[[run_tasks]]
principals = ["tenant"]
users = ["nobody"]

[[run_tasks]]
principals = ["admin"]
users = ["root"]
"#;

/// `nobody`'s uid and gid on this host.
fn nobody() -> (u32, u32) {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    let fields: Vec<&str> = passwd
        .lines()
        .find(|l| l.starts_with("nobody:"))
        .expect("a nobody user")
        .split(':')
        .collect();
    (fields[2].parse().unwrap(), fields[3].parse().unwrap())
}

/// A task reading the file `path` into its stdout.
fn reader(name: &str, path: &std::path::Path) -> TaskInfo {
    let mut t = task(name, "cat \"$SECRET\"", "cpus:0.5;mem:32");
    t.env.insert("SECRET".into(), path.display().to_string());
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_run_as_the_task_user_and_cannot_read_the_agents_keys() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test needs root (the agent switches task users)"
    );
    let scratch = TempDir::new("gantry-task-user").unwrap();
    let acls = scratch.path().join("acls.toml");
    std::fs::write(&acls, ACLS).unwrap();
    let cluster = Cluster::start_with(
        &[("user1", "cpus:4;mem:1024")],
        &["--acls", acls.to_str().unwrap()],
        &["--isolation", "none"],
    )
    .unwrap();
    let agent = &cluster.agents[0];
    let agent_key = cluster.tls_dir.join("agent-user1.key");
    let ca_key = cluster.tls_dir.join("ca.key");
    assert!(agent_key.exists() && ca_key.exists());

    // The tenant: one legitimate task, two attacks on the keys, one root task.
    let legit = task(
        "legit",
        "id -u > uid.txt && id -g > gid.txt && echo work > out.txt",
        "cpus:0.5;mem:32",
    );
    let steal_agent = reader("steal-agent-key", &agent_key);
    let steal_ca = reader("steal-ca-key", &ca_key);
    let mut as_root = reader("as-root", &ca_key);
    as_root.command = CommandInfo::shell("cat \"$SECRET\"").with_user("root");
    let tenant = gantry_tests::driver_config(
        vec![cluster.master.quic.to_string()],
        cluster.tls_dir.clone(),
        "tenant",
        vec!["tenants".into()],
    );
    let tasks = vec![
        legit.clone(),
        steal_agent.clone(),
        steal_ca.clone(),
        as_root.clone(),
    ];
    let (mut updates, handle, run) = start_recorder(tenant, tasks);

    let done = updates
        .wait(legit.task_id, TaskState::Finished, T)
        .await
        .unwrap();
    assert_eq!(done.exit_code, Some(0));
    let (uid, gid) = nobody();
    let read = |name: &str| std::fs::read_to_string(agent.sandbox_file(legit.task_id, name));
    assert_eq!(read("uid.txt").unwrap().trim(), uid.to_string());
    assert_eq!(read("gid.txt").unwrap().trim(), gid.to_string());
    assert_eq!(read("out.txt").unwrap(), "work\n");

    for t in [&steal_agent, &steal_ca] {
        let failed = updates.wait(t.task_id, TaskState::Failed, T).await.unwrap();
        assert_eq!(failed.exit_code, Some(1), "{failed:?}");
        assert_eq!(failed.reason, Some(TaskReason::CommandFailed));
        let stderr = std::fs::read_to_string(agent.sandbox_file(t.task_id, "stderr")).unwrap();
        assert!(stderr.contains("Permission denied"), "{}: {stderr}", t.name);
        let stdout = std::fs::read_to_string(agent.sandbox_file(t.task_id, "stdout")).unwrap();
        assert!(
            !stdout.contains("PRIVATE KEY"),
            "{}: the key leaked",
            t.name
        );
    }

    let refused = updates
        .wait(as_root.task_id, TaskState::Error, T)
        .await
        .unwrap();
    assert_eq!(refused.reason, Some(TaskReason::InvalidTask));
    assert!(
        refused
            .message
            .contains("principal \"tenant\" may not run tasks as user \"root\""),
        "{refused:?}"
    );
    assert!(
        !agent.sandbox_file(as_root.task_id, "").exists(),
        "a refused task never reaches the agent"
    );

    // Sandboxes belong to the task's user (0750); the supervisor's files do not.
    for t in [&legit, &steal_agent] {
        let dir = agent.sandbox_file(t.task_id, "");
        let meta = std::fs::metadata(&dir).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (uid, gid), "{}", dir.display());
        assert_eq!(meta.mode() & 0o777, 0o750, "{}", dir.display());
        let out = std::fs::metadata(dir.join("stdout")).unwrap();
        assert_eq!(out.uid(), uid);
        let control = std::fs::metadata(agent.meta_dir(t.task_id)).unwrap();
        assert_eq!((control.uid(), control.mode() & 0o777), (0, 0o700));
        assert!(agent
            .launch_record(t.task_id)
            .is_some_and(|r| r.exit.is_some()));
    }

    // `/state` shows who each task ran as.
    let state = cluster
        .master
        .wait_state(T, "completed tasks with users", |s| {
            s["completed_tasks"]
                .as_array()
                .is_some_and(|c| c.len() >= 3)
        })
        .unwrap();
    for c in state["completed_tasks"].as_array().unwrap() {
        if c["state"] == "ERROR" {
            // The refused task is kept with who it asked to run as, and why it did not.
            assert_eq!(c["user"], "root", "{c:#}");
            assert_eq!(c["reason"], "invalid-task", "{c:#}");
        } else {
            assert_eq!(c["user"], "nobody", "{c:#}");
        }
    }
    assert_eq!(state["agents"][0]["task_user"], "nobody");
    handle.stop();
    let _ = run.await;

    // Root only when granted explicitly: the admin principal may, and then the read works
    // (which is what the tenant's attack did before tasks stopped running as root).
    let admin = gantry_tests::driver_config(
        vec![cluster.master.quic.to_string()],
        cluster.tls_dir.clone(),
        "admin",
        vec!["ops".into()],
    );
    let mut root_read = reader("root-read", &agent_key);
    root_read.command.user = Some("root".into());
    let (mut updates, handle, run) = start_recorder(admin, vec![root_read.clone()]);
    updates
        .wait(root_read.task_id, TaskState::Finished, T)
        .await
        .unwrap();
    let stdout = std::fs::read_to_string(agent.sandbox_file(root_read.task_id, "stdout")).unwrap();
    assert!(stdout.contains("PRIVATE KEY"));
    handle.stop();
    let _ = run.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_task_user_fails_the_task_with_a_clear_message() {
    let cluster = Cluster::start_with(
        &[("user2", "cpus:4;mem:1024")],
        &[],
        &["--isolation", "none"],
    )
    .unwrap();
    let mut ghost = task("ghost", "true", "cpus:0.5;mem:32");
    ghost.command.user = Some("no-such-user-gantry".into());
    let fine = task("fine", "true", "cpus:0.5;mem:32");
    let config = gantry_tests::driver_config(
        vec![cluster.master.quic.to_string()],
        cluster.tls_dir.clone(),
        "dev",
        vec!["dev".into()],
    );
    let (mut updates, handle, run) = start_recorder(config, vec![ghost.clone(), fine.clone()]);
    let failed = updates
        .wait(ghost.task_id, TaskState::Failed, T)
        .await
        .unwrap();
    assert_eq!(failed.reason, Some(TaskReason::LaunchFailed));
    assert!(
        failed
            .message
            .contains("unknown user \"no-such-user-gantry\" on this agent"),
        "{failed:?}"
    );
    updates
        .wait(fine.task_id, TaskState::Finished, T)
        .await
        .unwrap();
    handle.stop();
    let _ = run.await;
}

/// A uid-0 account under another name (`toor`-style), removed when the test ends.
struct RootAlias(&'static str);

impl RootAlias {
    fn create(name: &'static str) -> Self {
        let _ = std::process::Command::new("userdel")
            .args(["-f", name])
            .status();
        let ok = std::process::Command::new("useradd")
            .args([
                "-o", "-u", "0", "-g", "0", "-M", "-N", "-s", "/bin/sh", name,
            ])
            .status()
            .expect("useradd");
        assert!(ok.success(), "useradd -o -u 0 {name}");
        Self(name)
    }
}

impl Drop for RootAlias {
    fn drop(&mut self) {
        let _ = std::process::Command::new("userdel")
            .args(["-f", self.0])
            .status();
    }
}

/// The attack: `"*"` in `run_tasks` means any user but root, and the master can only compare
/// names. A host account with uid 0 under another name would pass it and run the task as root
/// (reading the CA key here). The agent refuses a uid-0 account under any name but `root`; the
/// same principal's task as `nobody` finishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_uid_0_account_under_another_name_is_not_any_user_but_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test needs root");
    let alias = RootAlias::create("gantry-r00t");
    let scratch = TempDir::new("gantry-root-alias").unwrap();
    let acls = scratch.path().join("acls.toml");
    std::fs::write(
        &acls,
        r#"
[[register_frameworks]]
principals = ["*"]
roles = ["*"]

[[run_tasks]]
principals = ["wild"]
users = ["*"]
"#,
    )
    .unwrap();
    let cluster = Cluster::start_with(
        &[("user3", "cpus:4;mem:1024")],
        &["--acls", acls.to_str().unwrap()],
        &["--isolation", "none"],
    )
    .unwrap();
    let agent = &cluster.agents[0];
    let mut sneaky = reader("sneaky", &cluster.tls_dir.join("ca.key"));
    sneaky.command.user = Some(alias.0.into());
    let mut fine = task("fine", "id -u > uid.txt", "cpus:0.5;mem:32");
    fine.command.user = Some("nobody".into());
    let config = gantry_tests::driver_config(
        vec![cluster.master.quic.to_string()],
        cluster.tls_dir.clone(),
        "wild",
        vec!["wild".into()],
    );
    let (mut updates, handle, run) = start_recorder(config, vec![sneaky.clone(), fine.clone()]);
    let failed = updates
        .wait(sneaky.task_id, TaskState::Failed, T)
        .await
        .unwrap();
    assert_eq!(failed.reason, Some(TaskReason::LaunchFailed), "{failed:?}");
    assert!(failed.message.contains("uid 0"), "{failed:?}");
    let stdout =
        std::fs::read_to_string(agent.sandbox_file(sneaky.task_id, "stdout")).unwrap_or_default();
    assert!(!stdout.contains("PRIVATE KEY"), "the CA key leaked");
    updates
        .wait(fine.task_id, TaskState::Finished, T)
        .await
        .unwrap();
    let uid = std::fs::read_to_string(agent.sandbox_file(fine.task_id, "uid.txt")).unwrap();
    assert_eq!(uid.trim(), nobody().0.to_string());
    handle.stop();
    let _ = run.await;
}
