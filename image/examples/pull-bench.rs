//! Pull benchmark: prints figures, asserts nothing about time.
//!
//! `cargo run --release -p gantry-image --example pull-bench` (as root; needs docker-registry,
//! umoci, skopeo and busybox-static, see scripts/setup-deps.sh). Starts a registry on loopback,
//! pushes the test image `busybox:v2` (two layers), then measures with fresh stores:
//!
//! - a cold pull (manifest, config, both layers downloaded, verified and unpacked);
//! - a cached pull by tag (one manifest request) and by digest (no request), averaged;
//! - 20 concurrent first pulls of the same image on one store: wall time, and how many times
//!   each blob was downloaded (by the store's counter and by the registry's access log).

use std::time::Instant;

use gantry_image::{ImageStore, StoreConfig};
use gantry_test_support::registry::{Registry, RegistryOptions, TestImages};

fn quiet(_: String) {}

fn open(dir: &std::path::Path, host: &str) -> anyhow::Result<ImageStore> {
    Ok(ImageStore::open(StoreConfig {
        dir: dir.to_path_buf(),
        max_bytes: 1 << 30,
        insecure: vec![host.to_string()],
        ..StoreConfig::default()
    })?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let reg = Registry::start(RegistryOptions::default())?;
    let images = TestImages::build()?;
    reg.push(&images.layout(), "v2", "busybox:v2")?;
    let host = reg.host();
    let reference = format!("{host}/busybox:v2");

    const COLD: usize = 5;
    let mut cold = Vec::new();
    for _ in 0..COLD {
        let dir = tempfile::tempdir()?;
        let s = open(dir.path(), &host)?;
        let t = Instant::now();
        let img = s.pull(&reference, &quiet).await?;
        cold.push(t.elapsed());
        drop(img);
    }
    cold.sort();
    println!(
        "cold pull of busybox:v2 (2 layers): median {:?}, min {:?} over {COLD}",
        cold[COLD / 2],
        cold[0]
    );

    let dir = tempfile::tempdir()?;
    let s = open(dir.path(), &host)?;
    let first = s.pull(&reference, &quiet).await?;
    println!(
        "unpacked size: {}",
        gantry_image::human_bytes(s.usage().bytes)
    );
    const CACHED: u32 = 200;
    let t = Instant::now();
    for _ in 0..CACHED {
        drop(s.pull(&reference, &quiet).await?);
    }
    println!(
        "cached pull by tag: {:?} each ({CACHED} runs)",
        t.elapsed() / CACHED
    );
    let by_digest = format!("{host}/busybox@{}", first.digest);
    let t = Instant::now();
    for _ in 0..CACHED {
        drop(s.pull(&by_digest, &quiet).await?);
    }
    println!(
        "cached pull by digest: {:?} each ({CACHED} runs)",
        t.elapsed() / CACHED
    );

    let dir = tempfile::tempdir()?;
    let s = open(dir.path(), &host)?;
    let before: Vec<usize> = images
        .layers("v2")?
        .iter()
        .map(|l| reg.blob_gets(l))
        .collect();
    let t = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let s = s.clone();
        let r = reference.clone();
        tasks.push(tokio::spawn(async move { s.pull(&r, &quiet).await }));
    }
    for task in tasks {
        task.await??;
    }
    println!("20 concurrent first pulls: {:?} wall", t.elapsed());
    for (layer, before) in images.layers("v2")?.iter().zip(before) {
        println!(
            "  {layer}: downloaded {} time(s) by the store, {} GET(s) in the registry log",
            s.blob_downloads().get(layer).copied().unwrap_or(0),
            reg.blob_gets(layer) - before
        );
    }
    Ok(())
}
