//! A real OCI registry for tests, and test images to push into it.
//!
//! [`Registry::start`] runs Debian's `docker-registry` (the CNCF distribution registry, package
//! `docker-registry`) on a free loopback port with its own storage directory and config file:
//! plain HTTP, TLS with a server certificate issued by a fresh `gantry-pki` CA
//! ([`Registry::ca_pem`] for clients to trust), or htpasswd basic auth (the password hashed with
//! bcrypt here). Its access log (stderr) is kept in the storage directory, so tests can count the
//! requests a client made ([`Registry::blob_gets`]). Dropping it kills the process and removes the
//! directory.
//!
//! [`TestImages::build`] writes an OCI image layout with `umoci` from the host's static busybox
//! (package `busybox-static`): tag `v1` with one layer, tag `v2` with that layer and a second one
//! that deletes `/etc/hidden` (a whiteout) and adds `/etc/top`. [`Registry::push`] copies a tag
//! into the registry with `skopeo`.
//!
//! Synchronous (std processes), like the rest of this crate.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

const START_TIMEOUT: Duration = Duration::from_secs(20);

/// How to start a registry.
#[derive(Debug, Clone, Default)]
pub struct RegistryOptions {
    /// Serve HTTPS with a certificate for `127.0.0.1`/`localhost` from a fresh gantry-pki CA.
    pub tls: bool,
    /// Require this user and password (htpasswd, bcrypt).
    pub htpasswd: Option<(String, String)>,
}

/// A running `docker-registry` owned by a test.
pub struct Registry {
    dir: tempfile::TempDir,
    port: u16,
    opts: RegistryOptions,
    child: Option<Child>,
}

fn free_port() -> anyhow::Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("binding a probe port")?;
    Ok(l.local_addr()?.port())
}

fn need(bin: &str, package: &str) -> anyhow::Result<()> {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(bin).is_file()))
        .unwrap_or(false);
    if !found {
        bail!("`{bin}` was not found on $PATH; install it with `sudo apt-get install {package}` (scripts/setup-deps.sh does)");
    }
    Ok(())
}

fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed with {}: {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

impl Registry {
    /// Starts a registry with `opts` on a free loopback port and waits until it answers.
    pub fn start(opts: RegistryOptions) -> anyhow::Result<Registry> {
        need("docker-registry", "docker-registry")?;
        let dir = tempfile::Builder::new()
            .prefix("gantry-registry-")
            .tempdir()
            .context("creating the registry directory")?;
        let mut reg = Registry {
            dir,
            port: free_port()?,
            opts,
            child: None,
        };
        // A free port can be taken by another test's server between the look-up and the
        // registry's bind: the registry then exits at once; try another port.
        let mut tries = 0;
        loop {
            reg.write_config()?;
            match reg.launch() {
                Ok(()) => return Ok(reg),
                Err(e) if tries < 5 && reg.log().contains("address already in use") => {
                    tries += 1;
                    eprintln!("registry port {} was taken ({e:#}); another", reg.port);
                    let _ = std::fs::remove_file(reg.log_path());
                    reg.port = free_port()?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn write_config(&self) -> anyhow::Result<()> {
        let d = self.dir.path();
        std::fs::create_dir_all(d.join("storage"))?;
        let mut yaml = format!(
            "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\n\
             storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
             http:\n  addr: 127.0.0.1:{}\n",
            d.join("storage").display(),
            self.port
        );
        if self.opts.tls {
            let ca = gantry_pki::CertAuthority::generate().context("generating a test CA")?;
            let (cert, key) = ca
                .issue(&gantry_transport::tls::PeerIdentity::Master, &[])
                .context("issuing the registry's certificate")?;
            std::fs::write(d.join("ca.pem"), ca.cert_pem())?;
            std::fs::write(d.join("server.pem"), cert)?;
            std::fs::write(d.join("server.key"), key)?;
            yaml.push_str(&format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                d.join("server.pem").display(),
                d.join("server.key").display()
            ));
        }
        if let Some((user, pass)) = &self.opts.htpasswd {
            let hash = bcrypt::hash(pass, 4).context("hashing the registry password")?;
            std::fs::write(d.join("htpasswd"), format!("{user}:{hash}\n"))?;
            yaml.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: gantry-test\n    path: {}\n",
                d.join("htpasswd").display()
            ));
        }
        std::fs::write(d.join("config.yml"), yaml)?;
        Ok(())
    }

    fn launch(&mut self) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())?;
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(self.dir.path().join("config.yml"))
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .spawn()
            .context("spawning docker-registry")?;
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                bail!(
                    "docker-registry exited during start-up with {status}; log:\n{}",
                    self.log()
                );
            }
            // Listening, and it is the registry (not another test's server that took the
            // port: the registry then exits with "address already in use", seen above).
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok()
                && self.log().contains("listening on")
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "docker-registry did not listen within {START_TIMEOUT:?}; log:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `127.0.0.1:PORT`, the registry part of image references.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The CA certificate (PEM file) that signed the registry's certificate (TLS registries).
    pub fn ca_pem(&self) -> Option<PathBuf> {
        self.opts.tls.then(|| self.dir.path().join("ca.pem"))
    }

    /// The registry's storage root.
    pub fn storage(&self) -> PathBuf {
        self.dir.path().join("storage")
    }

    /// Where the registry keeps the blob `sha256:<hex>` (overwrite it to tamper with the blob).
    pub fn blob_path(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.storage()
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2.min(hex.len())])
            .join(hex)
            .join("data")
    }

    /// The registry's log (access log included).
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("registry.log")
    }

    /// The whole log, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// How many `GET …/blobs/<digest>` requests the access log shows.
    pub fn blob_gets(&self, digest: &str) -> usize {
        let needle = format!("/blobs/{digest} ");
        self.log()
            .lines()
            .filter(|l| l.contains("\"GET ") && l.contains(&needle))
            .count()
    }

    /// Copies tag `tag` of the OCI layout `layout` to `REPO:TAG` in this registry with `skopeo`.
    pub fn push(&self, layout: &Path, tag: &str, repo_tag: &str) -> anyhow::Result<()> {
        need("skopeo", "skopeo")?;
        let mut cmd = Command::new("skopeo");
        cmd.arg("--insecure-policy")
            .arg("copy")
            .arg("--quiet")
            .arg("--dest-tls-verify=false");
        if let Some((u, p)) = &self.opts.htpasswd {
            cmd.arg("--dest-creds").arg(format!("{u}:{p}"));
        }
        cmd.arg(format!("oci:{}:{tag}", layout.display()))
            .arg(format!("docker://{}/{repo_tag}", self.host()));
        run(&mut cmd)
    }

    /// Kills the registry (idempotent).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Test images in an OCI layout (see the module docs).
pub struct TestImages {
    dir: tempfile::TempDir,
}

impl TestImages {
    /// Builds tags `v1` (busybox, `/etc/hidden`, `/etc/kept`) and `v2` (`v1` plus a layer that
    /// whites out `/etc/hidden` and adds `/etc/top`) with `umoci`.
    pub fn build() -> anyhow::Result<TestImages> {
        need("umoci", "umoci")?;
        let busybox = Path::new("/bin/busybox");
        if !busybox.is_file() {
            bail!("/bin/busybox is missing; install it with `sudo apt-get install busybox-static`");
        }
        let dir = tempfile::Builder::new()
            .prefix("gantry-images-")
            .tempdir()?;
        let layout = dir.path().join("layout");
        let bundle = dir.path().join("bundle");
        let image = |tag: &str| format!("{}:{tag}", layout.display());
        run(Command::new("umoci")
            .arg("init")
            .arg("--layout")
            .arg(&layout))?;
        run(Command::new("umoci")
            .args(["new", "--image"])
            .arg(image("v1")))?;
        run(Command::new("umoci")
            .args(["unpack", "--image"])
            .arg(image("v1"))
            .arg(&bundle))?;
        let rootfs = bundle.join("rootfs");
        std::fs::create_dir_all(rootfs.join("bin"))?;
        std::fs::create_dir_all(rootfs.join("etc"))?;
        std::fs::copy(busybox, rootfs.join("bin/busybox"))?;
        std::fs::hard_link(rootfs.join("bin/busybox"), rootfs.join("bin/sh"))?;
        std::os::unix::fs::symlink("busybox", rootfs.join("bin/ls"))?;
        std::fs::write(rootfs.join("etc/hidden"), "lower\n")?;
        std::fs::write(rootfs.join("etc/kept"), "kept\n")?;
        run(Command::new("umoci")
            .args(["repack", "--refresh-bundle", "--image"])
            .arg(image("v1"))
            .arg(&bundle))?;
        std::fs::remove_file(rootfs.join("etc/hidden"))?;
        std::fs::write(rootfs.join("etc/top"), "top\n")?;
        run(Command::new("umoci")
            .args(["repack", "--image"])
            .arg(image("v2"))
            .arg(&bundle))?;
        for tag in ["v1", "v2"] {
            run(Command::new("umoci")
                .args(["config", "--image"])
                .arg(image(tag))
                .args([
                    "--config.cmd",
                    "/bin/sh",
                    "--config.env",
                    "PATH=/bin",
                    "--config.workingdir",
                    "/etc",
                ]))?;
        }
        std::fs::remove_dir_all(&bundle)?;
        Ok(TestImages { dir })
    }

    /// The OCI layout directory.
    pub fn layout(&self) -> PathBuf {
        self.dir.path().join("layout")
    }

    /// The layer digests of `tag`, lowest first.
    pub fn layers(&self, tag: &str) -> anyhow::Result<Vec<String>> {
        let manifest = self.manifest(tag)?;
        let layers = manifest["layers"]
            .as_array()
            .with_context(|| format!("manifest of {tag} has no layers"))?;
        layers
            .iter()
            .map(|l| {
                l["digest"]
                    .as_str()
                    .map(str::to_string)
                    .context("a layer without a digest")
            })
            .collect()
    }

    /// The manifest digest of `tag` in the layout.
    pub fn manifest_digest(&self, tag: &str) -> anyhow::Result<String> {
        let index: serde_json::Value =
            serde_json::from_slice(&std::fs::read(self.layout().join("index.json"))?)?;
        for m in index["manifests"].as_array().into_iter().flatten() {
            if m["annotations"]["org.opencontainers.image.ref.name"] == tag {
                return m["digest"]
                    .as_str()
                    .map(str::to_string)
                    .context("an index entry without a digest");
            }
        }
        bail!("tag {tag} not in the layout")
    }

    fn manifest(&self, tag: &str) -> anyhow::Result<serde_json::Value> {
        let digest = self.manifest_digest(tag)?;
        let path = self
            .layout()
            .join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:"));
        Ok(serde_json::from_slice(&std::fs::read(path)?)?)
    }
}
