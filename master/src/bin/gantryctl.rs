//! `gantryctl`: operator tool. `gantryctl certs ...` issues the cluster's TLS certificates.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Parser, Subcommand};
use gantry_sdk::transport::tls::{CertAuthority, PeerIdentity};

/// Operator tool for Gantry clusters.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Issue TLS certificates (files follow the --tls-dir naming convention).
    #[command(subcommand)]
    Certs(Certs),
    /// Set a role's weight (its dominant share is divided by it).
    Weight {
        role: String,
        #[arg(allow_negative_numbers = true)]
        weight: f64,
        #[arg(long, default_value = "127.0.0.1:5051")]
        http: std::net::SocketAddr,
    },
    /// Set (replace) a role's quota: a guarantee held back for it and a limit it never exceeds.
    Quota {
        role: String,
        /// e.g. "cpus:8;mem:16384" (omit to remove the guarantee).
        #[arg(long)]
        guarantee: Option<String>,
        /// e.g. "cpus:16;gpus:4" (omit to remove the limit).
        #[arg(long)]
        limit: Option<String>,
        #[arg(long, default_value = "127.0.0.1:5051")]
        http: std::net::SocketAddr,
    },
    /// Show the cluster: agents, frameworks with their dominant shares, tasks by state.
    State {
        /// The master's HTTP address.
        #[arg(long, default_value = "127.0.0.1:5051")]
        http: std::net::SocketAddr,
        /// Print the raw /state JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
enum Certs {
    /// Create a new cluster CA: DIR/ca.pem and DIR/ca.key (refuses to overwrite).
    Ca {
        #[arg(long)]
        out: PathBuf,
    },
    /// Issue the master certificate (DIR/master.pem, master.key).
    Master {
        /// Directory holding ca.pem and ca.key.
        #[arg(long)]
        ca_dir: PathBuf,
        #[arg(long)]
        out: PathBuf,
        /// Host names or IP addresses the master is reached by.
        #[arg(long, value_delimiter = ',')]
        san: Vec<String>,
    },
    /// Issue an agent certificate (DIR/agent-NAME.pem, .key).
    Agent {
        name: String,
        #[arg(long)]
        ca_dir: PathBuf,
        #[arg(long)]
        out: PathBuf,
    },
    /// Issue a framework certificate for a principal (DIR/framework-NAME.pem, .key).
    Framework {
        principal: String,
        #[arg(long)]
        ca_dir: PathBuf,
        #[arg(long)]
        out: PathBuf,
    },
}

fn issue(ca_dir: &Path, out: &Path, identity: PeerIdentity, sans: &[String]) -> anyhow::Result<()> {
    let ca = CertAuthority::load(ca_dir)
        .with_context(|| format!("loading the CA from {}", ca_dir.display()))?;
    std::fs::create_dir_all(out)?;
    ca.issue_to_dir(&identity, sans, out)?;
    if !out.join("ca.pem").exists() {
        std::fs::write(out.join("ca.pem"), ca.cert_pem())?;
    }
    println!("issued {} into {}", identity, out.display());
    Ok(())
}

fn print_state(http: std::net::SocketAddr, json: bool) -> anyhow::Result<()> {
    let body = gantry_master::client::http_get(http, "/state")?;
    if json {
        println!("{body}");
        return Ok(());
    }
    let s: serde_json::Value = serde_json::from_str(&body).context("parsing /state")?;
    let empty = Vec::new();
    let res = |v: &serde_json::Value| -> String {
        v.as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k}:{v}"))
                    .collect::<Vec<_>>()
                    .join(";")
            })
            .unwrap_or_default()
    };
    println!("agents:");
    for a in s["agents"].as_array().unwrap_or(&empty) {
        println!(
            "  {:<16} total {:<40} used {}",
            a["name"].as_str().unwrap_or("?"),
            res(&a["total"]),
            res(&a["used"])
        );
    }
    println!("frameworks:");
    for f in s["frameworks"].as_array().unwrap_or(&empty) {
        println!(
            "  {:<16} roles {:<20} share {:.3}  tasks {:<4} allocated {}",
            f["name"].as_str().unwrap_or("?"),
            f["roles"]
                .as_array()
                .map(|r| r
                    .iter()
                    .filter_map(|x| x.as_str())
                    .collect::<Vec<_>>()
                    .join(","))
                .unwrap_or_default(),
            f["dominant_share"].as_f64().unwrap_or(0.0),
            f["active_tasks"],
            res(&f["allocated"])
        );
    }
    let mut by_state = std::collections::BTreeMap::<String, usize>::new();
    for t in s["tasks"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .chain(s["completed_tasks"].as_array().unwrap_or(&empty))
    {
        *by_state
            .entry(t["state"].as_str().unwrap_or("?").to_string())
            .or_default() += 1;
    }
    println!(
        "tasks: {by_state:?}   outstanding offers: {}",
        s["offers"].as_array().map_or(0, Vec::len)
    );
    // Why the latest unsuccessful tasks ended (the full records are in `--json`).
    let failed: Vec<&serde_json::Value> = s["completed_tasks"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .filter(|t| t["state"] != "FINISHED")
        .collect();
    if !failed.is_empty() {
        println!("latest unsuccessful tasks:");
        for t in failed.iter().rev().take(5) {
            println!(
                "  {:<24} {:<8} {:<18} {}",
                t["name"].as_str().unwrap_or("?"),
                t["state"].as_str().unwrap_or("?"),
                t["reason"].as_str().unwrap_or("-"),
                t["message"].as_str().unwrap_or("")
            );
        }
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::State { http, json } => print_state(http, json),
        Cmd::Weight { role, weight, http } => {
            gantry_master::client::http_post_json(
                http,
                "/weights",
                &serde_json::json!({"role": role, "weight": weight}),
            )?;
            println!("weight of {role} set to {weight}");
            Ok(())
        }
        Cmd::Quota {
            role,
            guarantee,
            limit,
            http,
        } => {
            gantry_master::client::http_post_json(
                http,
                "/quota",
                &serde_json::json!({"role": role, "guarantee": guarantee, "limit": limit}),
            )?;
            println!("quota of {role} set");
            Ok(())
        }
        Cmd::Certs(Certs::Ca { out }) => {
            anyhow::ensure!(
                !out.join("ca.pem").exists(),
                "{} already holds a CA; refusing to overwrite it",
                out.display()
            );
            CertAuthority::generate()?.save(&out)?;
            println!("created CA in {}", out.display());
            Ok(())
        }
        Cmd::Certs(Certs::Master { ca_dir, out, san }) => {
            issue(&ca_dir, &out, PeerIdentity::Master, &san)
        }
        Cmd::Certs(Certs::Agent { name, ca_dir, out }) => {
            issue(&ca_dir, &out, PeerIdentity::Agent(name), &[])
        }
        Cmd::Certs(Certs::Framework {
            principal,
            ca_dir,
            out,
        }) => issue(&ca_dir, &out, PeerIdentity::Framework(principal), &[]),
    }
}
