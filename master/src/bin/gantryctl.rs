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

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
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
