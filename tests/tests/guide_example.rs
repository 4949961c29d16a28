//! The guide's complete example runs: docs/framework-guide.md ("A complete example") is
//! `examples/src/bin/hello.rs` word for word, and that binary, against a real cluster (a
//! master and an agent over QUIC, mutual TLS, real cgroups), launches its task, sees it finish
//! and tears the framework down.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gantry_sdk::transport::PeerIdentity;
use gantry_tests::{bin, Cluster};

/// The workspace root (this crate is `tests/`).
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
}

/// The first `rust` code block after the heading `heading` in `markdown`.
fn code_block<'a>(markdown: &'a str, heading: &str) -> Option<&'a str> {
    let section = &markdown[markdown.find(heading)?..];
    let start = section.find("```rust")?;
    let body = &section[start..];
    let body = &body[body.find('\n')? + 1..];
    Some(&body[..body.find("\n```")? + 1])
}

#[test]
fn the_guide_example_is_the_hello_binary_word_for_word() {
    let guide = std::fs::read_to_string(root().join("docs/framework-guide.md")).expect("guide");
    let example =
        std::fs::read_to_string(root().join("examples/src/bin/hello.rs")).expect("hello.rs");
    let block = code_block(&guide, "## A complete example").expect("the complete example");
    assert_eq!(
        block, example,
        "docs/framework-guide.md's complete example and examples/src/bin/hello.rs differ: \
         change both"
    );
}

#[test]
fn the_guide_example_runs_its_task_to_completion_on_a_real_cluster() -> anyhow::Result<()> {
    let cluster = Cluster::start(&[("guide-agent", "cpus:2;mem:512")])?;
    // The certificate `gantryctl certs framework hello` would issue (dev CA of the cluster).
    gantry_pki::load_or_issue(
        &cluster.tls_dir,
        &PeerIdentity::Framework("hello".into()),
        &[],
    )?;
    let mut child = Command::new(bin("hello")?)
        .arg(cluster.master.quic.to_string())
        .arg(&cluster.tls_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            cluster.dump_logs();
            anyhow::bail!("the guide example did not finish within 120 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = child.wait_with_output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !status.success() || !stdout.contains(" is FINISHED") {
        cluster.dump_logs();
    }
    assert!(status.success(), "exit {status}\n{stdout}\n{stderr}");
    assert!(
        stdout.contains(" is RUNNING") && stdout.contains(" is FINISHED"),
        "{stdout}\n{stderr}"
    );
    // It tore itself down: the master forgets it, and its task ran once, completed.
    cluster.master.wait_state(
        Duration::from_secs(30),
        "the hello framework torn down",
        |s| {
            s["frameworks"]
                .as_array()
                .is_some_and(|f| !f.iter().any(|f| f["name"] == "hello"))
        },
    )?;
    Ok(())
}
