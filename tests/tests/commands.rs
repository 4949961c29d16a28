//! A user's command runs as typed (Mesos `CommandInfo`): the real `batch` binary against a real
//! cluster. `batch -- ONE_STRING` runs the string with `/bin/sh -c`; `batch -- PROG ARG...`
//! executes the argv directly, every word exactly as given (read back from the task's sandbox).

use std::process::Command;
use std::time::Duration;

use gantry_tests::{bin, Cluster};

/// Runs the `batch` binary with one copy of `command` as framework `name`; returns its exit
/// code and output.
fn batch(cluster: &Cluster, name: &str, command: &[&str]) -> (i32, String) {
    batch_with(cluster, name, &[], command)
}

/// [`batch`] with extra `batch` flags before the `--`.
fn batch_with(cluster: &Cluster, name: &str, flags: &[&str], command: &[&str]) -> (i32, String) {
    let out = Command::new(bin("batch").unwrap())
        .args(flags)
        .arg("--master")
        .arg(cluster.master.quic.to_string())
        .arg("--tls-dir")
        .arg(&cluster.tls_dir)
        .args(["--role", "cmds", "--name", name, "--count", "1"])
        .args(["--cpus", "0.5", "--mem", "64", "--"])
        .args(command)
        .output()
        .expect("running batch");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// The `/state` record of the completed task named `name`.
fn completed(cluster: &Cluster, name: &str) -> serde_json::Value {
    let s = cluster
        .master
        .wait_state(Duration::from_secs(30), name, |s| {
            s["completed_tasks"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t["name"] == name))
        })
        .unwrap();
    s["completed_tasks"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["name"] == name).cloned())
        .unwrap()
}

/// A file of the task named `name` in its sandbox.
fn sandbox_file(cluster: &Cluster, name: &str, file: &str) -> String {
    let id = completed(cluster, name)["id"].as_str().unwrap().to_string();
    let path = cluster.agents[0]
        .work_dir
        .join("sandboxes")
        .join(id)
        .join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn batch_runs_shell_strings_and_argv_exactly_as_typed() {
    let cluster = Cluster::start(&[("cmd1", "cpus:4;mem:1024")]).unwrap();
    let check = |name: &str, command: &[&str]| {
        let (code, out) = batch(&cluster, name, command);
        if code != 0 {
            cluster.dump_logs();
            panic!("batch {name} -- {command:?} exited {code}:\n{out}");
        }
        let t = completed(&cluster, &format!("{name}-0"));
        assert_eq!(t["state"], "FINISHED", "{t:#}");
        assert_eq!(t["exit_code"], 0, "{t:#}");
    };
    // argv: `sh -c 'sleep 0.2'` reaches sh as three words (joined by spaces it was
    // `sleep: missing operand`).
    check("sh-c", &["sh", "-c", "sleep 0.2"]);
    // One word: a shell string, with the shell's syntax.
    check(
        "one-string",
        &["sleep 0.2 && test -n \"$GANTRY_SANDBOX\" && echo ok > ok.txt"],
    );
    assert_eq!(sandbox_file(&cluster, "one-string-0", "ok.txt"), "ok\n");
    // argv with Python's own syntax in one word.
    check("python", &["python3", "-c", "a=[1]; print(a)"]);
    assert_eq!(sandbox_file(&cluster, "python-0", "stdout"), "[1]\n");
    // Spaces, quotes, `$`, globs and an empty word reach the program exactly.
    let words = ["a b", "it's", "\"q\"", "$HOME", "*", "", "  x  "];
    let mut argv = vec!["printf", "[%s]\\n"];
    argv.extend(words);
    check("argv", &argv);
    let expected: String = words.iter().map(|w| format!("[{w}]\n")).collect();
    assert_eq!(sandbox_file(&cluster, "argv-0", "stdout"), expected);
    // `--user` names the task's user (dev mode allows any; root only for a root agent).
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let (code, out) = batch_with(&cluster, "as-root", &["--user", "root"], &["id", "-un"]);
        assert_eq!(code, 0, "{out}");
        assert_eq!(sandbox_file(&cluster, "as-root-0", "stdout"), "root\n");
        assert_eq!(completed(&cluster, "as-root-0")["user"], "root");
        let (code, out) = batch(&cluster, "default-user", &["id", "-un"]);
        assert_eq!(code, 0, "{out}");
        assert_eq!(
            sandbox_file(&cluster, "default-user-0", "stdout"),
            "nobody\n"
        );
    }
}

#[test]
fn empty_and_missing_programs_are_clear_errors() {
    let cluster = Cluster::start(&[("cmd2", "cpus:4;mem:1024")]).unwrap();
    // An empty program is refused by the master: ERROR, with the reason.
    let (code, out) = batch(&cluster, "empty-program", &["", "x"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("empty program"), "{out}");
    // An empty shell string as well.
    let (code, out) = batch(&cluster, "empty-shell", &["  "]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("empty shell command"), "{out}");
    // A program that does not exist fails on the agent (exit 127), saying why in stderr.
    let (code, out) = batch(&cluster, "missing", &["/no/such/program", "arg"]);
    assert_eq!(code, 1, "{out}");
    let t = completed(&cluster, "missing-0");
    assert_eq!(t["state"], "FAILED", "{t:#}");
    assert_eq!(t["exit_code"], 127, "{t:#}");
    assert_eq!(t["reason"], "command-failed", "{t:#}");
    let stderr = sandbox_file(&cluster, "missing-0", "stderr");
    assert!(
        stderr.contains("could not start the task \"/no/such/program\""),
        "{stderr}"
    );
}
