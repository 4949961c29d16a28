//! What gantryctl does without a master: `token` (operator tokens and their hashes) and
//! `certs` (the cluster CA and the certificates it issues).

use super::*;

#[derive(Subcommand, Debug)]
pub(super) enum Token {
    /// Generate a token for operator NAME: prints the token (give it to the operator) and adds
    /// its SHA-256 to FILE (created with mode 0600), or prints the entry to add.
    Create {
        name: String,
        /// The master's --operator-tokens file to append the entry to.
        #[arg(long)]
        file: Option<PathBuf>,
    },
    /// Print the token file entry for a token read from standard input (at least 32
    /// characters and about 128 bits; weaker tokens are refused).
    Hash { name: String },
}

#[derive(Subcommand, Debug)]
pub(super) enum Certs {
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
    /// Issue an operator certificate (DIR/operator-NAME.pem, .key) for gantryctl.
    Operator {
        name: String,
        #[arg(long)]
        ca_dir: PathBuf,
        #[arg(long)]
        out: PathBuf,
    },
    /// Issue a user certificate (DIR/user-NAME.pem, .key) for services such as the job queue
    /// (`gantry-queue --cert/--key`); it gives no rights on the master.
    User {
        name: String,
        #[arg(long)]
        ca_dir: PathBuf,
        #[arg(long)]
        out: PathBuf,
    },
    /// Issue a service's HTTPS server certificate (DIR/service-NAME.pem, .key), e.g. for
    /// `gantry-queue serve --https-cert/--https-key`: server authentication only, valid for the
    /// given host names and addresses (never the master's `gantry-master`).
    Service {
        name: String,
        #[arg(long)]
        ca_dir: PathBuf,
        #[arg(long)]
        out: PathBuf,
        /// Host names or IP addresses clients reach the service by (at least one).
        #[arg(long, value_delimiter = ',', required = true)]
        san: Vec<String>,
    },
}

pub(super) fn issue(
    ca_dir: &Path,
    out: &Path,
    identity: PeerIdentity,
    sans: &[String],
) -> anyhow::Result<()> {
    let ca = CertAuthority::load(ca_dir)
        .with_context(|| format!("loading the CA from {}", ca_dir.display()))?;
    gantry_pki::create_private_dir(out)?;
    ca.issue_to_dir(&identity, sans, out)?;
    if !out.join("ca.pem").exists() {
        std::fs::write(out.join("ca.pem"), ca.cert_pem())?;
    }
    println!("issued {} into {}", identity, out.display());
    Ok(())
}

pub(super) fn token(cmd: Token) -> anyhow::Result<()> {
    use gantry_master::security::tokens;
    match cmd {
        Token::Create { name, file } => {
            anyhow::ensure!(
                gantry_transport::tls::valid_name(&name),
                "invalid operator name {name:?}: use 1-64 characters of [A-Za-z0-9_.-]"
            );
            let token = tokens::generate()?;
            let entry = tokens::file_entry(&name, &token);
            match file {
                Some(path) => {
                    use std::io::Write;
                    use std::os::unix::fs::OpenOptionsExt;
                    let mut f = std::fs::OpenOptions::new()
                        .append(true)
                        .create(true)
                        .mode(0o600)
                        .open(&path)
                        .with_context(|| format!("opening {}", path.display()))?;
                    writeln!(f, "{entry}")
                        .with_context(|| format!("writing {}", path.display()))?;
                    eprintln!(
                        "added operator {name} to {} (the master reads it at start)",
                        path.display()
                    );
                }
                None => eprintln!("add this to the master's --operator-tokens file:\n\n{entry}"),
            }
            println!("{token}");
            Ok(())
        }
        Token::Hash { name } => {
            let mut token = String::new();
            std::io::stdin().read_line(&mut token)?;
            let token = token.trim();
            anyhow::ensure!(!token.is_empty(), "no token on standard input");
            if let Some(why) = tokens::weakness(token) {
                anyhow::bail!("refused: {why}");
            }
            print!("{}", tokens::file_entry(&name, token));
            Ok(())
        }
    }
}

pub(super) fn certs(cmd: Certs) -> anyhow::Result<()> {
    match cmd {
        Certs::Ca { out } => {
            anyhow::ensure!(
                !out.join("ca.pem").exists(),
                "{} already holds a CA; refusing to overwrite it",
                out.display()
            );
            CertAuthority::generate()?.save(&out)?;
            println!("created CA in {}", out.display());
            Ok(())
        }
        Certs::Master { ca_dir, out, san } => issue(&ca_dir, &out, PeerIdentity::Master, &san),
        Certs::Agent { name, ca_dir, out } => issue(&ca_dir, &out, PeerIdentity::Agent(name), &[]),
        Certs::Framework {
            principal,
            ca_dir,
            out,
        } => issue(&ca_dir, &out, PeerIdentity::Framework(principal), &[]),
        Certs::Operator { name, ca_dir, out } => {
            issue(&ca_dir, &out, PeerIdentity::Operator(name), &[])
        }
        Certs::User { name, ca_dir, out } => issue(&ca_dir, &out, PeerIdentity::User(name), &[]),
        Certs::Service {
            name,
            ca_dir,
            out,
            san,
        } => issue(&ca_dir, &out, PeerIdentity::Service(name), &san),
    }
}
