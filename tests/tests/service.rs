//! The `service` example (issue 15) on a real cluster of 4 agents: 3 instances of a TCP server
//! (python3 http.server on the port its agent gave it, `ports:1`), spread one per agent and checked
//! over TCP, stay up through `kill -9` of an instance's process and of an agent (the instance
//! comes back elsewhere), and a changed definition rolls them one at a time (never more than
//! one down, sampled every 100 ms) until all run the new version.

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use gantry_tests::{driver_config, AgentProc, MasterProc, TempDir};

fn status(path: &Path) -> Option<serde_json::Value> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

fn wait_status(
    path: &Path,
    what: &str,
    timeout: Duration,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(s) = status(path) {
            if pred(&s) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; status: {s:#}"
            );
        } else {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn definition(dir: &Path, version: &str) -> String {
    serde_json::json!({
        "instances": 3,
        "command": format!(
            "echo $$ > {}/pid-$SERVICE_INSTANCE; exec python3 -m http.server $PORT --bind 127.0.0.1",
            dir.display()
        ),
        "cpus": 0.1,
        "mem": 64,
        "spread": true,
        "ports": 1,
        "env": {"APP_VERSION": version},
        "health": {"tcp": true, "interval_secs": 0.5, "grace_secs": 20, "failures": 3}
    })
    .to_string()
}

fn all_up(s: &serde_json::Value) -> bool {
    s["up"] == 3 && !s["rolling"].as_bool().unwrap_or(true)
}

fn agents_of(s: &serde_json::Value) -> HashSet<String> {
    s["slots"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["up"] == true)
        .filter_map(|x| x["agent"].as_str().map(str::to_string))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_stay_up_through_kills_and_roll_one_at_a_time() {
    let dir = TempDir::new("gantry-service").unwrap();
    let tls = dir.path().join("tls");
    let master = MasterProc::start(dir.path(), &tls, &["--agent-reregister-timeout", "2"]).unwrap();
    let mut agents: Vec<AgentProc> = (0..4)
        .map(|i| {
            AgentProc::start(
                dir.path(),
                &tls,
                master.quic,
                &format!("svc-{i}"),
                "cpus:1;mem:512",
                // Agents sharing a host need ranges of their own.
                &[
                    "--isolation",
                    "none",
                    "--ports",
                    &format!("{}-{}", 29500 + 10 * i, 29509 + 10 * i),
                ],
            )
            .unwrap()
        })
        .collect();
    master
        .wait_state(Duration::from_secs(30), "4 agents", |s| {
            s["agents"].as_array().is_some_and(|a| a.len() == 4)
        })
        .unwrap();
    // Instances run as the agent's task user (`nobody` under root): they record their pids in a
    // directory that user can write.
    let pids = std::env::temp_dir().join(format!("gantry-service-pids-{}", std::process::id()));
    std::fs::create_dir_all(&pids).unwrap();
    std::fs::set_permissions(&pids, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let def_path = dir.path().join("web.json");
    let status_path = dir.path().join("web.status.json");
    std::fs::write(&def_path, definition(&pids, "1")).unwrap();
    let config = driver_config(
        vec![master.quic.to_string()],
        tls.clone(),
        "web",
        vec!["svc".into()],
    );
    let run = tokio::spawn(gantry_examples::service::run(
        config,
        def_path.clone(),
        status_path.clone(),
    ));

    // Three instances up, one per agent, healthy over TCP.
    let s = wait_status(
        &status_path,
        "3 instances up",
        Duration::from_secs(90),
        all_up,
    );
    assert_eq!(agents_of(&s).len(), 3, "spread: {s:#}");
    // Each instance's port came from its agent's range (learned from its RUNNING update).
    for slot in s["slots"].as_array().unwrap() {
        let port = slot["port"].as_u64().unwrap_or(0);
        assert!((29500..=29539).contains(&port), "{slot:#}");
    }
    let v1 = s["version"].as_u64().unwrap();
    let st = master.state().unwrap();
    let mut names: Vec<String> = st["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["state"] == "RUNNING")
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    assert_eq!(names, vec!["web/0", "web/1", "web/2"]);

    // kill -9 of instance 0's process: it is restarted (with its backoff) and all are up again.
    let pid: i32 = std::fs::read_to_string(pids.join("pid-0"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    unsafe { libc::kill(pid, libc::SIGKILL) };
    wait_status(
        &status_path,
        "instance 0 down",
        Duration::from_secs(30),
        |s| s["up"].as_u64() < Some(3),
    );
    let s = wait_status(
        &status_path,
        "instance 0 restarted",
        Duration::from_secs(90),
        |s| all_up(s) && s["slots"][0]["restarts"].as_u64() >= Some(1),
    );
    assert_eq!(agents_of(&s).len(), 3);

    // kill -9 of the agent running instance 1: it comes back on the spare agent.
    let victim = s["slots"][1]["agent"].as_str().unwrap().to_string();
    let st = master.state().unwrap();
    let victim_name = st["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["id"] == victim.as_str())
        .unwrap()["name"]
        .as_str()
        .unwrap()
        .to_string();
    let pid1 = std::fs::read_to_string(pids.join("pid-1")).unwrap();
    let k = agents.iter().position(|a| a.name == victim_name).unwrap();
    agents[k].kill9();
    // The orphaned instance would keep its port: stop it too (the host is "gone").
    if let Ok(p) = pid1.trim().parse::<i32>() {
        unsafe { libc::kill(p, libc::SIGKILL) };
    }
    let s = wait_status(
        &status_path,
        "instance 1 back on another agent",
        Duration::from_secs(120),
        |s| all_up(s) && s["slots"][1]["agent"].as_str() != Some(victim.as_str()),
    );
    assert_eq!(agents_of(&s).len(), 3);
    assert!(!agents_of(&s).contains(&victim));

    // Rolling update: never more than one instance down.
    std::fs::write(&def_path, definition(&pids, "2")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut min_up = 3;
    let mut saw_rolling = false;
    loop {
        if let Some(s) = status(&status_path) {
            let up = s["up"].as_u64().unwrap_or(0);
            let v = s["version"].as_u64().unwrap_or(0);
            if v != v1 {
                saw_rolling |= s["rolling"] == true;
                min_up = min_up.min(up);
                let done = s["slots"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|x| x["version"].as_u64() == Some(v) && x["up"] == true);
                if done && up == 3 {
                    break;
                }
            }
        }
        assert!(Instant::now() < deadline, "the roll did not finish");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(saw_rolling);
    assert!(
        min_up >= 2,
        "{min_up} instances up at one point of the roll"
    );

    run.abort();
    let _ = run.await;
    let _ = std::fs::remove_dir_all(&pids);
}
