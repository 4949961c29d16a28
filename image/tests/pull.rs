//! `gantry-image` against a real registry (Debian's `docker-registry` on loopback, started per
//! test with its own storage) and real images (busybox into an OCI layout with `umoci`, pushed with
//! `skopeo`). Runs as root: layers keep their owners, whiteouts are device nodes, and the overlay
//! test mounts overlayfs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use gantry_image::{ImageError, ImageStore, StoreConfig};
use gantry_test_support::registry::{Registry, RegistryOptions, TestImages};

fn store(dir: &Path, insecure: &[String]) -> ImageStore {
    ImageStore::open(StoreConfig {
        dir: dir.to_path_buf(),
        max_bytes: 1 << 30,
        insecure: insecure.to_vec(),
        ..StoreConfig::default()
    })
    .expect("open store")
}

fn quiet(_: String) {}

/// A registry with `busybox:v1` and `busybox:v2` pushed.
fn plain_registry() -> (Registry, TestImages) {
    let reg = Registry::start(RegistryOptions::default()).expect("registry");
    let images = TestImages::build().expect("images");
    reg.push(&images.layout(), "v1", "busybox:v1")
        .expect("push v1");
    reg.push(&images.layout(), "v2", "busybox:v2")
        .expect("push v2");
    (reg, images)
}

/// Unmounts on drop, so a failed assertion leaves no mount behind.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn mount_overlay(layers: &[PathBuf], target: &Path) -> Mounted {
    // overlayfs lists the top layer first.
    let lower: Vec<String> = layers
        .iter()
        .rev()
        .map(|p| p.display().to_string())
        .collect();
    let st = Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o"])
        .arg(format!("lowerdir={}", lower.join(":")))
        .arg(target)
        .status()
        .expect("mount");
    assert!(st.success(), "mounting the overlay failed");
    Mounted(target.to_path_buf())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pull_by_tag_and_digest_cache_restart_and_whiteouts() {
    let (reg, images) = plain_registry();
    let host = reg.host();
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), std::slice::from_ref(&host));
    // Tags stay resolved for the whole test (the moved tag below).
    s.set_tag_cache(std::time::Duration::from_secs(3600));

    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = lines.clone();
    let progress = move |l: String| sink.lock().unwrap().push(l);
    let v2 = s
        .pull(&format!("{host}/busybox:v2"), &progress)
        .await
        .expect("pull v2 by tag");
    assert_eq!(v2.digest, images.manifest_digest("v2").unwrap());
    assert_eq!(v2.layers.len(), 2);
    assert_eq!(v2.config.cmd, vec!["/bin/sh".to_string()]);
    assert_eq!(v2.config.env, vec!["PATH=/bin".to_string()]);
    assert_eq!(v2.config.working_dir.as_deref(), Some("/etc"));
    let lines = lines.lock().unwrap().clone();
    assert!(
        lines.iter().any(|l| l.starts_with("pulled layer 2/2 (")),
        "{lines:?}"
    );

    // The lower layer: busybox (a hard link as sh, a symlink as ls) and the file v2 deletes.
    let base = &v2.layers[0];
    assert!(base.join("bin/busybox").is_file());
    assert_eq!(
        std::fs::read_link(base.join("bin/ls")).unwrap(),
        PathBuf::from("busybox")
    );
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(base.join("bin/sh")).unwrap().ino(),
        std::fs::metadata(base.join("bin/busybox")).unwrap().ino()
    );
    assert_eq!(
        std::fs::metadata(base.join("bin/busybox")).unwrap().mode() & 0o777,
        0o755
    );

    // Through overlayfs, the whiteout hides the lower file.
    let mnt = tempfile::tempdir().unwrap();
    {
        let _m = mount_overlay(&v2.layers, mnt.path());
        assert!(!mnt.path().join("etc/hidden").exists(), "whiteout ignored");
        assert_eq!(
            std::fs::read_to_string(mnt.path().join("etc/kept")).unwrap(),
            "kept\n"
        );
        assert_eq!(
            std::fs::read_to_string(mnt.path().join("etc/top")).unwrap(),
            "top\n"
        );
        let out = Command::new("chroot")
            .arg(mnt.path())
            .args(["/bin/sh", "-c", "echo hello from the image"])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "hello from the image\n"
        );
    }

    // Cached: no blob downloaded again, by tag or by digest.
    let before = s.blob_downloads();
    let again = s.pull(&format!("{host}/busybox:v2"), &quiet).await.unwrap();
    assert_eq!(again.layers, v2.layers);
    let by_digest = s
        .pull(&format!("{host}/busybox@{}", v2.digest), &quiet)
        .await
        .expect("pull by digest");
    assert_eq!(by_digest.digest, v2.digest);
    assert_eq!(s.blob_downloads(), before);

    // v1 by digest shares v2's base layer: only its config is new.
    let v1_digest = images.manifest_digest("v1").unwrap();
    let v1 = s
        .pull(&format!("{host}/busybox@{v1_digest}"), &quiet)
        .await
        .expect("pull v1 by digest");
    assert_eq!(v1.layers, vec![v2.layers[0].clone()]);
    let layer_downloads: u64 = images
        .layers("v2")
        .unwrap()
        .iter()
        .map(|l| s.blob_downloads().get(l).copied().unwrap_or(0))
        .sum();
    assert_eq!(layer_downloads, 2);

    // The tag cache: busybox:v2 moved on the registry (to v1's manifest) is still v2 while the
    // tag is trusted, with no registry request; without the cache the move is seen at once.
    reg.push(&images.layout(), "v1", "busybox:v2")
        .expect("move the tag");
    let cached = s.pull(&format!("{host}/busybox:v2"), &quiet).await.unwrap();
    assert_eq!(cached.digest, v2.digest, "a resolved tag is trusted");
    s.set_tag_cache(std::time::Duration::ZERO);
    let moved = s.pull(&format!("{host}/busybox:v2"), &quiet).await.unwrap();
    assert_eq!(
        moved.digest, v1_digest,
        "the moved tag, asked of the registry"
    );

    // After a restart (a new store on the same directory), the lease can be taken again with
    // no registry at all.
    drop(reg);
    let s2 = store(dir.path(), &[]);
    let re = s2.lease(&v2.digest).expect("re-lease after restart");
    assert_eq!(re.layers, v2.layers);
    assert_eq!(re.config, v2.config);
    assert!(matches!(
        s2.lease("sha256:0000000000000000000000000000000000000000000000000000000000000000"),
        Err(ImageError::NotStored(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn missing_tag_tampered_blob_and_dead_registry_fail_clearly() {
    let (reg, images) = plain_registry();
    let host = reg.host();
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), std::slice::from_ref(&host));

    let e = s
        .pull(&format!("{host}/busybox:nope"), &quiet)
        .await
        .unwrap_err();
    assert!(matches!(e, ImageError::NotFound { .. }), "{e:?}");
    assert_eq!(e.reason(), "image-pull-failed");
    assert!(e.to_string().contains("busybox:nope"), "{e}");

    let e = s
        .pull(&format!("{host}/nothing-here:v1"), &quiet)
        .await
        .unwrap_err();
    assert!(matches!(e, ImageError::NotFound { .. }), "{e:?}");

    let e = s.pull("UPPER/Case:bad tag", &quiet).await.unwrap_err();
    assert!(matches!(e, ImageError::Reference { .. }), "{e:?}");

    // Flip bytes of v2's top layer in the registry's storage (same length).
    let top = images.layers("v2").unwrap()[1].clone();
    let path = reg.blob_path(&top);
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    bytes[mid + 1] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    let e = s
        .pull(&format!("{host}/busybox:v2"), &quiet)
        .await
        .unwrap_err();
    match &e {
        ImageError::Digest { expected, got } => {
            assert_eq!(expected, &top);
            assert_ne!(got, &top);
        }
        other => panic!("expected a digest error, got {other:?}"),
    }
    assert_eq!(e.reason(), "image-pull-failed");
    // Nothing of the bad blob is kept: no partial download, no layer, no image.
    let hex = top.trim_start_matches("sha256:");
    assert_eq!(
        std::fs::read_dir(dir.path().join("blobs")).unwrap().count(),
        0
    );
    assert!(!dir.path().join("layers").join(hex).exists());
    assert!(s.images().is_empty());

    // v1 (the untouched layer) still pulls.
    s.pull(&format!("{host}/busybox:v1"), &quiet)
        .await
        .expect("pull v1");

    // A registry that is gone is a transport error.
    drop(reg);
    let e = s
        .pull(&format!("{host}/busybox:v2"), &quiet)
        .await
        .unwrap_err();
    assert!(matches!(e, ImageError::Transport { .. }), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tls_registry_with_credentials() {
    let reg = Registry::start(RegistryOptions {
        tls: true,
        htpasswd: Some(("gantry".into(), "s3cret".into())),
    })
    .expect("registry");
    let images = TestImages::build().expect("images");
    reg.push(&images.layout(), "v1", "busybox:v1")
        .expect("push");
    let host = reg.host();
    let reference = format!("{host}/busybox:v1");
    let ca = reg.ca_pem().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let creds = |user: &str, pass: &str| {
        let path = dir.path().join(format!("config-{user}-{pass}.json"));
        let auth = base64_encode(format!("{user}:{pass}").as_bytes());
        std::fs::write(
            &path,
            format!(r#"{{"auths": {{"{host}": {{"auth": "{auth}"}}}}}}"#),
        )
        .unwrap();
        path
    };
    let open = |credentials: Option<PathBuf>, roots: Vec<PathBuf>| {
        ImageStore::open(StoreConfig {
            dir: dir.path().join("store"),
            max_bytes: 1 << 30,
            insecure: vec![],
            credentials,
            extra_roots: roots,
        })
        .unwrap()
    };

    // Without the CA, the certificate is not trusted.
    let e = open(Some(creds("gantry", "s3cret")), vec![])
        .pull(&reference, &quiet)
        .await
        .unwrap_err();
    assert!(matches!(e, ImageError::Transport { .. }), "{e:?}");
    // No credentials, and wrong ones: an auth error.
    let e = open(None, vec![ca.clone()])
        .pull(&reference, &quiet)
        .await
        .unwrap_err();
    assert!(matches!(e, ImageError::Auth { .. }), "{e:?}");
    let e = open(Some(creds("gantry", "wrong")), vec![ca.clone()])
        .pull(&reference, &quiet)
        .await
        .unwrap_err();
    assert!(matches!(e, ImageError::Auth { .. }), "{e:?}");
    assert_eq!(e.reason(), "image-pull-failed");
    // The right ones work.
    let img = open(Some(creds("gantry", "s3cret")), vec![ca])
        .pull(&reference, &quiet)
        .await
        .expect("pull with credentials over TLS");
    assert!(img.layers[0].join("bin/busybox").is_file());
}

fn base64_encode(bytes: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_concurrent_pulls_download_each_blob_once() {
    let (reg, images) = plain_registry();
    let host = reg.host();
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), std::slice::from_ref(&host));
    let reference = format!("{host}/busybox:v2");
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let s = s.clone();
        let r = reference.clone();
        tasks.push(tokio::spawn(async move { s.pull(&r, &quiet).await }));
    }
    let mut digests = Vec::new();
    for t in tasks {
        digests.push(t.await.unwrap().expect("pull").digest);
    }
    assert!(digests.iter().all(|d| d == &digests[0]));
    for layer in images.layers("v2").unwrap() {
        assert_eq!(s.blob_downloads().get(&layer), Some(&1), "{layer}");
        assert_eq!(reg.blob_gets(&layer), 1, "registry log for {layer}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cache_bound_collects_unleased_layers_never_leased_ones() {
    let (reg, images) = plain_registry();
    let host = reg.host();
    let dir = tempfile::tempdir().unwrap();
    // A bound of one byte: everything unleased goes.
    let s = ImageStore::open(StoreConfig {
        dir: dir.path().to_path_buf(),
        max_bytes: 1,
        insecure: vec![host.clone()],
        ..StoreConfig::default()
    })
    .unwrap();
    let v2 = s.pull(&format!("{host}/busybox:v2"), &quiet).await.unwrap();
    let v1 = s.pull(&format!("{host}/busybox:v1"), &quiet).await.unwrap();
    // Both leased: over the bound, nothing collected.
    assert_eq!(s.usage().images, 2);
    assert!(s.usage().bytes > 1);
    let top = v2.layers[1].clone();
    let base = v2.layers[0].clone();
    drop(v2);
    s.collect().await.unwrap();
    // v2 and its own layer went; the base layer stays for the leased v1.
    assert!(!top.exists());
    assert!(base.join("bin/busybox").is_file());
    assert_eq!(s.images(), vec![images.manifest_digest("v1").unwrap()]);
    drop(v1);
    s.collect().await.unwrap();
    assert!(!base.exists());
    assert_eq!(s.usage().layers, 0);
    // Nothing is left on disk but the empty dirs and the index.
    assert_eq!(
        std::fs::read_dir(dir.path().join("layers"))
            .unwrap()
            .count(),
        0
    );
}

/// An OCI layout holding one image whose single layer is `layer` (an uncompressed tar).
fn layout_with_layer(dir: &Path, layer: &[u8]) {
    use sha2::Digest;
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let put = |bytes: &[u8]| {
        let d = format!("{:x}", sha2::Sha256::digest(bytes));
        std::fs::write(blobs.join(&d), bytes).unwrap();
        (format!("sha256:{d}"), bytes.len())
    };
    let diff = put(layer);
    let config = format!(
        r#"{{"architecture":"amd64","os":"linux","config":{{}},"rootfs":{{"type":"layers","diff_ids":["{}"]}}}}"#,
        diff.0
    );
    let cfg = put(config.as_bytes());
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{}","size":{}}},"layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"{}","size":{}}}]}}"#,
        cfg.0, cfg.1, diff.0, diff.1
    );
    let m = put(manifest.as_bytes());
    std::fs::write(
        dir.join("index.json"),
        format!(
            r#"{{"schemaVersion":2,"manifests":[{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{}","size":{},"annotations":{{"org.opencontainers.image.ref.name":"evil"}}}}]}}"#,
            m.0, m.1
        ),
    )
    .unwrap();
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_layer_is_refused() {
    let reg = Registry::start(RegistryOptions::default()).expect("registry");
    let host = reg.host();
    let work = tempfile::tempdir().unwrap();
    // A symlink to / and then a file written through it.
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(0);
    h.set_mode(0o777);
    b.append_link(&mut h, "escape", "/").unwrap();
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(5);
    h.set_mode(0o644);
    let target = format!("escape{}/owned", work.path().display());
    b.append_data(&mut h, &target, &b"owned"[..]).unwrap();
    let layer = b.into_inner().unwrap();
    layout_with_layer(&work.path().join("layout"), &layer);
    reg.push(&work.path().join("layout"), "evil", "evil:1")
        .expect("push");

    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), std::slice::from_ref(&host));
    let e = s.pull(&format!("{host}/evil:1"), &quiet).await.unwrap_err();
    assert!(matches!(e, ImageError::Unpack { .. }), "{e:?}");
    assert!(e.to_string().contains("symbolic link"), "{e}");
    assert!(!work.path().join("owned").exists(), "the layer escaped");
    assert!(s.images().is_empty());
    assert_eq!(
        std::fs::read_dir(dir.path().join("layers"))
            .unwrap()
            .count(),
        0
    );
}
