//! `gantryctl`: operator tool. Talks to the master's HTTPS operator API `/api/v1` (`status`,
//! `agents`, `agent ID`, `frameworks`, `framework ID`, `tasks`, `task ID`, `offers`, `roles`,
//! `weight`, `quota`, `reserve`, `unreserve`, `deactivate`, `reactivate`, `mark-gone`,
//! `clear-gpu`, `teardown`, `drain`, `undrain`, `maintenance`, `volume list|destroy`, `events`; `state` is the raw
//! `/state`) with an operator certificate or a bearer token, and issues certificates (`certs`)
//! and tokens (`token`) offline, and prints shell completion scripts (`completion bash|zsh|fish`,
//! made by `clap_complete` from the same command definitions, so they never drift). Tables by default, the API's JSON with `--json`. Agents,
//! frameworks and tasks are named by id or name wherever one is asked for.
//!
//! Destructive commands on something live (`mark-gone` of a connected agent with tasks,
//! `teardown` of a connected framework) ask for confirmation on a terminal and are refused
//! without one unless `--yes`. `events` reconnects on its own when the master restarts or
//! leadership moves (a new snapshot follows each reconnection).
//!
//! The master and credentials come from flags, the environment (`GANTRY_MASTER`,
//! `GANTRY_TLS_DIR`, `GANTRY_OPERATOR`, `GANTRY_TOKEN`) or a config file (`--config FILE`, or
//! `$GANTRY_CONFIG`, or `~/.config/gantry/gantryctl.toml` when it exists; keys are the flag
//! names: `master = "https://m:5051"`).
//!
//! Exit codes: 0 ok, 1 error, 2 usage or bad input (the master answered 400: an unknown
//! resource kind, task state, framework or agent in a filter...), 3 not found, 4 forbidden
//! (not authenticated or not allowed by the ACLs), 5 not confirmed.

#[path = "gantryctl/print.rs"]
mod print;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use gantry_master::client::{ClientConfig, ClientError, Credentials, OperatorClient};
use gantry_pki::CertAuthority;
use gantry_transport::tls::PeerIdentity;

#[path = "gantryctl/maintenance.rs"]
mod maintenance;
#[path = "gantryctl/offline.rs"]
mod offline;
#[path = "gantryctl/sandbox.rs"]
mod sandbox;
#[path = "gantryctl/volume.rs"]
mod volume;
#[path = "gantryctl/watch.rs"]
mod watch;

use offline::*;
use sandbox::*;
use watch::*;

/// gantryctl: the operator's tool for Gantry clusters.
///
/// Reads and changes a cluster through the master's HTTPS operator API (agents, frameworks,
/// tasks, offers, roles, quotas, weights, reservations, maintenance, the event stream), and
/// issues TLS certificates and operator tokens offline. See docs/operations.md.
#[derive(Parser, Debug)]
#[command(
    name = "gantryctl",
    version,
    about,
    long_about,
    args_override_self = true
)]
struct Cli {
    #[command(flatten)]
    conn: Connection,
    #[command(subcommand)]
    cmd: Cmd,
}

/// Where the master is and who we are (also from `--config FILE.toml` or the environment).
#[derive(clap::Args, Debug)]
struct Connection {
    /// The master's operator API.
    #[arg(
        long,
        global = true,
        env = "GANTRY_MASTER",
        default_value = "https://127.0.0.1:5051"
    )]
    master: String,
    /// TLS directory with ca.pem and the operator certificate operator-NAME.pem/.key (a dev
    /// master writes operator-admin into its own --tls-dir).
    #[arg(long, global = true, env = "GANTRY_TLS_DIR")]
    tls_dir: Option<PathBuf>,
    /// Operator certificate name in --tls-dir.
    #[arg(long, global = true, env = "GANTRY_OPERATOR", default_value = "admin")]
    operator: String,
    /// Bearer token (instead of a certificate); see `gantryctl token create`.
    #[arg(long, global = true, env = "GANTRY_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Print the API's JSON instead of tables (one JSON object per line for `events`).
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Issue TLS certificates (files follow the --tls-dir naming convention).
    #[command(subcommand)]
    Certs(Certs),
    /// Create operator bearer tokens for the master's --operator-tokens file.
    #[command(subcommand)]
    Token(Token),
    /// Print a shell completion script: `gantryctl completion bash > /etc/bash_completion.d/gantryctl`
    /// (zsh: into a directory of `$fpath` as `_gantryctl`; fish: `~/.config/fish/completions/`).
    Completion {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Set a role's weight (its dominant share is divided by it).
    Weight {
        role: String,
        #[arg(allow_negative_numbers = true)]
        weight: f64,
    },
    /// Change a role's quota: a guarantee held back for it and a limit it never exceeds. A
    /// part not named is kept; `--no-guarantee` / `--no-limit` remove one. Resource kinds must
    /// be ones the cluster knows (the error lists them); a limit below what the role's tasks
    /// hold is accepted with a warning (they keep running).
    Quota {
        role: String,
        /// e.g. "cpus:8;mem:16384". A parent role's guarantee includes its subroles': the sum
        /// of the subroles' guarantees may not exceed it.
        #[arg(long, conflicts_with = "no_guarantee")]
        guarantee: Option<String>,
        /// e.g. "cpus:16;gpus:4"; "cpus:0" means no cpus at all, kinds not named are unlimited.
        #[arg(long, conflicts_with = "no_limit")]
        limit: Option<String>,
        /// Remove the guarantee.
        #[arg(long)]
        no_guarantee: bool,
        /// Remove the limit.
        #[arg(long)]
        no_limit: bool,
    },
    /// Agent maintenance: drain, undrain, maintenance.
    #[command(flatten)]
    Maintenance(maintenance::MaintenanceCmd),
    /// Persistent volumes on an agent: list, destroy.
    #[command(subcommand)]
    Volume(volume::VolumeCmd),
    /// Show the raw cluster view (`/state`): agents, frameworks with their dominant shares,
    /// tasks by state.
    State,
    /// The cluster at a glance: agents, GPUs, frameworks, tasks by state, offers, roles.
    Status,
    /// Agents with their GPUs (model, memory, utilization, health, the task holding each).
    Agents {
        /// Only this agent (id or name).
        agent: Option<String>,
    },
    /// One agent (id or name): its resources, GPUs (full UUIDs), tasks and offers.
    Agent { agent: String },
    /// Frameworks with their dominant shares.
    Frameworks,
    /// One framework (id or name; active or removed): roles, shares, tasks and offers held.
    Framework { framework: String },
    /// One task (id or name; active or completed): state, reason, message, exit status,
    /// framework, agent, GPUs (full UUIDs), times.
    Task { task: String },
    /// Outstanding offers: which framework holds what of which agent, and for how long.
    Offers,
    /// Tasks, active first, then completed (one page).
    Tasks {
        /// Only tasks in this state.
        #[arg(long, value_parser = task_state)]
        state: Option<String>,
        /// Only tasks of this framework (id or name; unknown: an error).
        #[arg(long)]
        framework: Option<String>,
        /// Only tasks on this agent (id or name).
        #[arg(long)]
        agent: Option<String>,
        /// Page size (at most 1000).
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Tasks to skip.
        #[arg(long, default_value_t = 0)]
        offset: usize,
        /// Leave completed tasks out.
        #[arg(long)]
        active: bool,
    },
    /// Roles with their dominant shares, weights, allocations and quotas.
    Roles,
    /// Reserve unreserved resources of an agent for a role (persisted).
    Reserve {
        /// Agent id or name.
        agent: String,
        #[arg(long)]
        role: String,
        /// e.g. "cpus:2;gpus:1".
        resources: String,
    },
    /// Return resources an operator or framework reserved for a role on an agent.
    Unreserve {
        agent: String,
        #[arg(long)]
        role: String,
        resources: String,
    },
    /// Stop offering an agent (its tasks keep running) until `reactivate`.
    Deactivate { agent: String },
    /// Offer a deactivated agent again.
    Reactivate { agent: String },
    /// Remove an agent for good: its tasks are LOST. Asks first when the agent is connected
    /// and runs tasks (refused without a terminal unless --yes).
    MarkGone {
        agent: String,
        /// Do not ask.
        #[arg(long, short = 'y')]
        yes: bool,
    },
    /// Bring an unhealthy GPU of a connected agent back into service.
    ClearGpu { agent: String, gpu: String },
    /// Tear down a framework (id, or a name only one framework has): its tasks are killed.
    /// Asks first when the framework is connected (refused without a terminal unless --yes).
    Teardown {
        framework: String,
        /// Do not ask.
        #[arg(long, short = 'y')]
        yes: bool,
    },
    /// A task's standard output (or error): its last MiB, or all of it followed while the task
    /// runs (`-f`, like `tail -f`; ends when the task has ended and all is printed). Works
    /// for ended tasks until their agent collects the sandbox.
    Logs {
        task: String,
        /// Keep printing what the task writes until it ends.
        #[arg(long, short = 'f')]
        follow: bool,
        /// Standard error instead of standard output.
        #[arg(long)]
        stderr: bool,
        /// Bytes from the end to start with (default: the last MiB; with -f: all of it).
        #[arg(long)]
        tail: Option<u64>,
    },
    /// A task's sandbox: list a directory (default: the sandbox itself) or print a file
    /// (`--offset`, `--length`: a part of it, at most 1 MiB).
    Fs {
        task: String,
        /// A path relative to the sandbox.
        path: Option<String>,
        /// Where to start reading a file (default: the last --length bytes).
        #[arg(long)]
        offset: Option<u64>,
        /// Bytes to read at most.
        #[arg(long)]
        length: Option<u64>,
    },
    /// Run a command inside a running task (its user, cgroups, working directory and
    /// environment); exits with the command's exit status.
    Exec {
        task: String,
        /// Send this terminal's standard input (read to its end first, at most 256 KiB).
        #[arg(short = 'i', long)]
        interactive: bool,
        /// Run the command on a terminal (a pty on the agent): the window size of this terminal
        /// (or `--tty-size`, or 24x80), this terminal in raw mode while it runs, its output as
        /// one stream.
        #[arg(short = 't', long)]
        tty: bool,
        /// With `-t`: the terminal's size, ROWSxCOLS (default: this terminal's, else 24x80).
        #[arg(long, value_name = "ROWSxCOLS", value_parser = parse_tty_size)]
        tty_size: Option<(u16, u16)>,
        /// Kill the command after this long (default: the agent's limit, 1 h).
        #[arg(long, value_parser = humantime::parse_duration)]
        timeout: Option<std::time::Duration>,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// CPU-, memory- and GPU-hours used by tasks over a window, per role, framework or user,
    /// from the master's persistent history; resources held in offers are shown apart, and
    /// `--cost` adds what the use cost (agents' `price_per_hour`) and each agent's idle cost.
    Usage {
        /// The window's start: a duration back from now (`30d`), an RFC 3339 time, or Unix ms.
        #[arg(long, default_value = "30d")]
        since: String,
        /// The window's end (default: now).
        #[arg(long)]
        until: Option<String>,
        /// role, framework or user.
        #[arg(long, default_value = "role", value_parser = ["role", "framework", "user"])]
        by: String,
        /// Comma-separated values instead of a table.
        #[arg(long)]
        csv: bool,
        /// Add a COST column and the idle cost per agent.
        #[arg(long)]
        cost: bool,
    },
    /// Follow the event stream: a snapshot, then task, agent and framework changes, each line
    /// with the time it arrived. Reconnects on its own when the master restarts or another
    /// master takes over (then a new snapshot).
    Events {
        /// Stop when the stream ends instead of reconnecting.
        #[arg(long)]
        no_reconnect: bool,
        /// First print the history kept since then (a duration back from now such as `1h`, an
        /// RFC 3339 time, or Unix milliseconds), each event with the time it happened.
        #[arg(long)]
        since: Option<String>,
    },
}

/// Exit codes (documented in docs/operations.md).
const EXIT_ERROR: u8 = 1;
const EXIT_USAGE: u8 = 2;
const EXIT_NOT_FOUND: u8 = 3;
const EXIT_FORBIDDEN: u8 = 4;
const EXIT_NOT_CONFIRMED: u8 = 5;

// The task states `tasks --state` takes (any case): the API's own list.
use gantry_master::server::api::views::TASK_STATES;

fn task_state(s: &str) -> Result<String, String> {
    TASK_STATES
        .iter()
        .find(|x| x.eq_ignore_ascii_case(s))
        .map(|x| x.to_string())
        .ok_or_else(|| {
            format!(
                "unknown task state; the states are {}",
                TASK_STATES.join(", ")
            )
        })
}

/// The operator declined (or could not be asked): nothing was done.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct NotConfirmed(String);

/// Asks `question` on the terminal unless `yes`; without a terminal, refuses unless `yes`.
fn confirm(question: &str, yes: bool) -> anyhow::Result<()> {
    use std::io::{BufRead, IsTerminal, Write};
    if yes {
        return Ok(());
    }
    if !std::io::stdin().is_terminal() {
        return Err(NotConfirmed(format!(
            "{question}: refused without a terminal to confirm on; add --yes to do it"
        ))
        .into());
    }
    eprint!("{question} [y/N] ");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    if matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes") {
        Ok(())
    } else {
        Err(NotConfirmed("not confirmed; nothing was done".into()).into())
    }
}

fn client(conn: &Connection) -> anyhow::Result<OperatorClient> {
    let credentials = match &conn.token {
        Some(t) => Credentials::Token(t.clone()),
        None if conn.master.starts_with("http://") && conn.tls_dir.is_none() => Credentials::None,
        None => Credentials::Certificate(conn.operator.clone()),
    };
    let config = ClientConfig {
        master: conn.master.clone(),
        tls_dir: conn.tls_dir.clone(),
        credentials,
        timeout: std::time::Duration::from_secs(30),
    };
    Ok(OperatorClient::new(&config)?)
}

/// A path segment (agent names and ids, GPU UUIDs) percent-encoded.
fn seg(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

/// Prints `body` as JSON (`--json`) or through `table`.
fn show(json: bool, body: &str, table: fn(&serde_json::Value) -> String) -> anyhow::Result<()> {
    if json {
        println!("{}", body.trim_end());
        return Ok(());
    }
    let v: serde_json::Value = serde_json::from_str(body).context("parsing the answer")?;
    print!("{}", table(&v));
    Ok(())
}

/// Prints the warnings of a write's answer (`{"ok": true, "warnings": [...]}`) to stderr.
fn warn(answer: &str) {
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(answer) {
        for w in v["warnings"].as_array().into_iter().flatten() {
            if let Some(w) = w.as_str() {
                eprintln!("warning: {w}");
            }
        }
    }
}

/// A write: prints the API's answer with `--json`, else `done` (and its warnings on stderr).
async fn write(
    c: &OperatorClient,
    json: bool,
    path: &str,
    body: serde_json::Value,
    done: String,
) -> anyhow::Result<()> {
    let answer = c.post_json(path, &body).await?;
    warn(&answer);
    if json {
        println!("{}", answer.trim_end());
    } else {
        println!("{done}");
    }
    Ok(())
}

async fn remote(conn: &Connection, cmd: Cmd) -> anyhow::Result<()> {
    let c = client(conn)?;
    let json = conn.json;
    let none = serde_json::json!({});
    match cmd {
        Cmd::State => print_state(c.get("/state").await?, json),
        Cmd::Status => show(json, &c.get("/api/v1/summary").await?, print::summary),
        Cmd::Agents { agent: None } => show(json, &c.get("/api/v1/agents").await?, print::agents),
        Cmd::Agents { agent: Some(a) } => {
            let body = c.get(&format!("/api/v1/agents/{}", seg(&a))).await?;
            show(json, &body, |v| print::agents(&serde_json::json!([v])))
        }
        Cmd::Agent { agent } => {
            let body = c.get(&format!("/api/v1/agents/{}", seg(&agent))).await?;
            show(json, &body, print::agent)
        }
        Cmd::Frameworks => show(json, &c.get("/api/v1/frameworks").await?, print::frameworks),
        Cmd::Framework { framework } => {
            let body = c
                .get(&format!("/api/v1/frameworks/{}", seg(&framework)))
                .await?;
            show(json, &body, print::framework)
        }
        Cmd::Task { task } => {
            let body = c.get(&format!("/api/v1/tasks/{}", seg(&task))).await?;
            show(json, &body, print::task)
        }
        Cmd::Offers => show(json, &c.get("/api/v1/offers").await?, print::offers),
        Cmd::Logs {
            task,
            follow,
            stderr,
            tail,
        } => {
            let mut q = form_urlencoded::Serializer::new(String::new());
            q.append_pair("stream", if stderr { "stderr" } else { "stdout" });
            if follow {
                q.append_pair("follow", "true");
            }
            if let Some(n) = tail {
                q.append_pair("length", &n.to_string());
            }
            let path = format!("/api/v1/tasks/{}/logs?{}", seg(&task), q.finish());
            let mut out = std::io::stdout();
            c.stream(&path, None, |chunk| {
                use std::io::Write;
                out.write_all(chunk).and_then(|()| out.flush()).is_ok()
            })
            .await?;
            Ok(())
        }
        Cmd::Usage {
            since,
            until,
            by,
            csv,
            cost,
        } => {
            let mut q = form_urlencoded::Serializer::new(String::new());
            q.append_pair("since", &since).append_pair("by", &by);
            if let Some(u) = &until {
                q.append_pair("until", u);
            }
            let body = c.get(&format!("/api/v1/usage?{}", q.finish())).await?;
            if csv && !json {
                let v: serde_json::Value = serde_json::from_str(&body)?;
                print!("{}", print::usage_csv(&v, cost));
                Ok(())
            } else {
                match cost {
                    true => show(json, &body, |v| print::usage(v, true)),
                    false => show(json, &body, |v| print::usage(v, false)),
                }
            }
        }
        Cmd::Fs {
            task,
            path,
            offset,
            length,
        } => sandbox_fs(&c, json, &task, path.unwrap_or_default(), offset, length).await,
        Cmd::Exec {
            task,
            interactive,
            tty,
            tty_size,
            timeout,
            command,
        } => {
            let tty = tty.then(|| tty_size.unwrap_or_else(local_tty_size));
            match tty {
                // A terminal: a live session (keystrokes and window size as they happen).
                Some(size) => exec_live(&c, &task, interactive, size, timeout, command).await,
                None => exec(&c, &task, interactive, None, timeout, command).await,
            }
        }
        Cmd::Tasks {
            state,
            framework,
            agent,
            limit,
            offset,
            active,
        } => {
            let mut q = form_urlencoded::Serializer::new(String::new());
            q.append_pair("limit", &limit.to_string())
                .append_pair("offset", &offset.to_string());
            for (k, v) in [("state", state), ("framework", framework), ("agent", agent)] {
                if let Some(v) = v {
                    q.append_pair(k, &v);
                }
            }
            if active {
                q.append_pair("completed", "false");
            }
            let body = c.get(&format!("/api/v1/tasks?{}", q.finish())).await?;
            show(json, &body, print::tasks)
        }
        Cmd::Roles => show(json, &c.get("/api/v1/roles").await?, print::roles),
        Cmd::Weight { role, weight } => {
            write(
                &c,
                json,
                "/api/v1/weights",
                serde_json::json!({"role": role, "weight": weight}),
                format!("weight of {role} set to {weight}"),
            )
            .await
        }
        Cmd::Quota {
            role,
            guarantee,
            limit,
            no_guarantee,
            no_limit,
        } => {
            // A part not named is kept: only what was named is sent (null removes).
            let mut body = serde_json::json!({"role": role});
            for (key, value, remove) in [
                ("guarantee", guarantee, no_guarantee),
                ("limit", limit, no_limit),
            ] {
                if remove {
                    body[key] = serde_json::Value::Null;
                } else if let Some(v) = value {
                    body[key] = serde_json::Value::String(v);
                }
            }
            if body.as_object().is_some_and(|o| o.len() == 1) {
                return Err(Usage(
                    "name what to change: --guarantee, --limit, --no-guarantee or --no-limit"
                        .into(),
                )
                .into());
            }
            write(
                &c,
                json,
                "/api/v1/quotas",
                body,
                format!("quota of {role} set"),
            )
            .await
        }
        Cmd::Reserve {
            agent,
            role,
            resources,
        } => {
            write(
                &c,
                json,
                &format!("/api/v1/agents/{}/reserve", seg(&agent)),
                serde_json::json!({"role": role, "resources": resources}),
                format!("reserved {resources} for {role} on {agent}"),
            )
            .await
        }
        Cmd::Unreserve {
            agent,
            role,
            resources,
        } => {
            write(
                &c,
                json,
                &format!("/api/v1/agents/{}/unreserve", seg(&agent)),
                serde_json::json!({"role": role, "resources": resources}),
                format!("unreserved {resources} of {role} on {agent}"),
            )
            .await
        }
        Cmd::Deactivate { agent } => {
            let path = format!("/api/v1/agents/{}/deactivate", seg(&agent));
            write(&c, json, &path, none, format!("{agent} deactivated")).await
        }
        Cmd::Reactivate { agent } => {
            let path = format!("/api/v1/agents/{}/reactivate", seg(&agent));
            write(&c, json, &path, none, format!("{agent} reactivated")).await
        }
        Cmd::MarkGone { agent, yes } => {
            let a: serde_json::Value =
                serde_json::from_str(&c.get(&format!("/api/v1/agents/{}", seg(&agent))).await?)
                    .context("parsing the agent")?;
            let tasks = a["tasks"].as_array().map_or(0, Vec::len);
            if a["connected"] == true && tasks > 0 {
                confirm(
                    &format!(
                        "agent {} is connected and runs {tasks} task(s): marking it gone makes them LOST \
                         and it can never register again. Mark it gone?",
                        print::cell(&a["name"])
                    ),
                    yes,
                )?;
            }
            let path = format!("/api/v1/agents/{}/gone", seg(&agent));
            write(&c, json, &path, none, format!("{agent} marked gone")).await
        }
        Cmd::ClearGpu { agent, gpu } => {
            let path = format!("/api/v1/agents/{}/gpus/{}/clear", seg(&agent), seg(&gpu));
            let done = format!("asked {agent} to clear {gpu}");
            write(&c, json, &path, none, done).await
        }
        Cmd::Teardown { framework, yes } => {
            let f: serde_json::Value = serde_json::from_str(
                &c.get(&format!("/api/v1/frameworks/{}", seg(&framework)))
                    .await?,
            )
            .context("parsing the framework")?;
            anyhow::ensure!(
                f["completed"] != true,
                "framework {framework} was already removed: {}",
                print::cell(&f["reason"])
            );
            if f["connected"] == true {
                confirm(
                    &format!(
                        "framework {} is connected and has {} active task(s): tearing it down kills them. Tear it down?",
                        print::cell(&f["name"]),
                        f["tasks"].as_array().map_or(0, Vec::len)
                    ),
                    yes,
                )?;
            }
            let path = format!("/api/v1/frameworks/{}/teardown", seg(&framework));
            write(&c, json, &path, none, format!("{framework} torn down")).await
        }
        Cmd::Events {
            no_reconnect,
            since,
        } => events(&c, json, no_reconnect, since).await,
        Cmd::Maintenance(m) => maintenance::run(&c, m).await,
        Cmd::Volume(v) => volume::run(&c, v).await,
        Cmd::Certs(_) | Cmd::Token(_) | Cmd::Completion { .. } => {
            anyhow::bail!("offline commands do not reach the master")
        }
    }
}

/// A usage error found after parsing (exit 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Usage(pub(crate) String);

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn main() -> ExitCode {
    // The default config file, when the command line names none.
    if !std::env::args().any(|a| a == "--config" || a.starts_with("--config=")) {
        let default = std::env::var_os("GANTRY_CONFIG")
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME")
                    .map(|h| PathBuf::from(h).join(".config/gantry/gantryctl.toml"))
                    .filter(|p| p.exists())
            });
        if let Some(path) = default {
            let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
            args.insert(1, path.into_os_string());
            args.insert(1, "--config".into());
            return run(gantry_cli::config_file::expand(args));
        }
    }
    run(gantry_cli::config_file::expand_args())
}

fn run(
    args: Result<Vec<std::ffi::OsString>, gantry_cli::config_file::ConfigFileError>,
) -> ExitCode {
    let args = match args {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    // Usage errors exit with 2 (clap's convention).
    let cli = Cli::parse_from(args);
    let result = match cli.cmd {
        Cmd::Certs(c) => certs(c),
        Cmd::Token(t) => token(t),
        Cmd::Completion { shell } => {
            use clap::CommandFactory;
            use std::io::Write;
            // Into a buffer first: the generator panics on a write error (a closed pipe).
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "gantryctl", &mut script);
            match std::io::stdout().write_all(&script) {
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
                _ => Ok(()),
            }
        }
        cmd => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the runtime")
            .and_then(|rt| rt.block_on(remote(&cli.conn, cmd))),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if let Some(ExecStatus(n)) = e.downcast_ref::<ExecStatus>() {
                return ExitCode::from(*n);
            }
            eprintln!("error: {e:#}");
            if e.downcast_ref::<NotConfirmed>().is_some() {
                return ExitCode::from(EXIT_NOT_CONFIRMED);
            }
            if e.downcast_ref::<Usage>().is_some() {
                return ExitCode::from(EXIT_USAGE);
            }
            let status = e
                .downcast_ref::<ClientError>()
                .and_then(ClientError::status);
            ExitCode::from(match status {
                Some(400) => EXIT_USAGE,
                Some(401 | 403) => EXIT_FORBIDDEN,
                Some(404) => EXIT_NOT_FOUND,
                _ => EXIT_ERROR,
            })
        }
    }
}
