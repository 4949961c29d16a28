//! How long one topology-aware choice of whole GPUs takes (`placement::topology::assign`),
//! which the master makes for every whole-GPU task it launches: real host shapes and the
//! largest host an agent may register (256 GPUs). Prints the mean per call over 0.3 s each.
//!
//! `cargo run --release -p gantry-placement --example topology_bench`

use std::time::{Duration, Instant};

use gantry_placement::topology::{assign, GpuSlot};

fn slot(numa: u32, root: u32) -> GpuSlot {
    GpuSlot {
        numa_node: Some(numa),
        pci_root: Some(format!("root{root}")),
        healthy: true,
        free: true,
    }
}

fn main() {
    type Shape = fn(u32) -> GpuSlot;
    let hosts: [(&str, u32, Shape, &[usize]); 7] = [
        (
            "8 GPUs, 2 NUMA nodes x 2 PCI roots",
            8,
            |i| slot(i / 4, i / 2),
            &[1, 2, 4, 8],
        ),
        (
            "8 GPUs, 2 NUMA nodes, a root each",
            8,
            |i| slot(i / 4, i),
            &[1, 2, 4, 8],
        ),
        (
            "16 GPUs, 2 NUMA nodes x 4 roots",
            16,
            |i| slot(i / 8, i / 2),
            &[1, 4, 8, 16],
        ),
        (
            "16 GPUs, 2 NUMA nodes, a root each",
            16,
            |i| slot(i / 8, i),
            &[1, 4, 8, 12],
        ),
        (
            "256 GPUs, a NUMA node each",
            256,
            |i| slot(i, i),
            &[1, 8, 64, 128],
        ),
        (
            "256 GPUs, 1 NUMA node, a root each",
            256,
            |i| slot(0, i),
            &[1, 8, 64, 128],
        ),
        (
            "256 GPUs, 8 NUMA nodes x 64 roots",
            256,
            |i| slot(i / 32, i / 4),
            &[1, 8, 64, 128],
        ),
    ];
    println!("{:<38} {:>5} {:>12}", "host", "k", "µs per call");
    for (name, n, shape, ks) in hosts {
        let gpus: Vec<GpuSlot> = (0..n).map(shape).collect();
        for &k in ks {
            let start = Instant::now();
            let mut calls = 0u32;
            while start.elapsed() < Duration::from_millis(300) {
                std::hint::black_box(assign(std::hint::black_box(&gpus), k));
                calls += 1;
            }
            let us = start.elapsed().as_secs_f64() * 1e6 / f64::from(calls);
            println!("{name:<38} {k:>5} {us:>12.1}");
        }
    }
}
