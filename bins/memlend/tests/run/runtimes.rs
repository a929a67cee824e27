//! Go (linked with cgo) and Node.js under `memlend run`: both reserve their
//! heaps PROT_NONE and commit them later (Go with MAP_FIXED, V8 with
//! mprotect), so their heaps are far only because reservations are
//! (`crates/preload/src/reserve.rs`). Each job's output must match a plain
//! run, with pages read back from the store.

use super::common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

fn progs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/progs")
}

/// `go`, on PATH or where the Go distribution installs it.
fn go() -> PathBuf {
    let on_path = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join("go"))
        .find(|p| p.is_file());
    on_path.unwrap_or_else(|| PathBuf::from("/usr/local/go/bin/go"))
}

/// The heap was made far and stayed far: pages read back from the store,
/// and a peak resident set under `rss_max_mib`, well below the data.
fn reservations_made_far(err: &str, rss_max_mib: f64) {
    let line = err.lines().find(|l| l.contains("made far:")).unwrap_or_default();
    assert!(line.contains("reservations (PROT_NONE"), "{err}");
    assert!(!line.contains("0 B in 0 reservations"), "the heap was made far: {err}");
    assert!(faults_from_store(err) > 0, "pages were read back from the store: {err}");
    let rss = peak_rss_mib(err);
    assert!(rss < rss_max_mib, "peak resident set {rss} MiB: the heap went local: {err}");
}

#[test]
fn a_cgo_go_program_with_a_heap_six_times_its_budget_matches_a_plain_run() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("gocgo");
    let built = Command::new(go())
        .args(["build", "-o"])
        .arg(&bin)
        .arg(".")
        .current_dir(progs().join("gocgo"))
        .env("CGO_ENABLED", "1")
        .env("GOFLAGS", "-mod=mod")
        .env("GOCACHE", dir.path().join("cache"))
        .status()
        .expect("go not found: the Go toolchain is needed for this test");
    assert!(built.success(), "go build failed");
    let cmd = [bin.to_str().unwrap()];
    let plain = plain_run(&cmd);
    let ssd = dir.path().to_str().unwrap();
    // Go reserves ~1.1 GiB of sparse index before its first arena: the
    // region must hold that and the heap (docs/run.md, "Limits").
    let far = memlend_run(&["--mem", "64M", "--far", "3G", "--ssd", ssd], &cmd);
    let err = text(&far.stderr);
    assert!(far.status.success(), "{err}");
    assert_eq!(text(&far.stdout), text(&plain.stdout), "same sum as a plain run");
    // Under half of the 384 MiB slice resident at its peak.
    reservations_made_far(&err, 192.0);
    // Go's exit skips libc's exit handlers: counted from its last second.
    assert!(err.contains("ended without an exit report"), "{err}");
}

#[test]
fn a_node_program_with_its_heap_over_its_budget_matches_a_plain_run() {
    let dir = tempfile::tempdir().unwrap();
    let js = progs().join("far_objects.js");
    let cmd = ["node", "--max-old-space-size=1024", js.to_str().unwrap()];
    let plain = plain_run(&cmd);
    assert!(plain.status.success(), "node: {}", text(&plain.stderr));
    let ssd = dir.path().to_str().unwrap();
    let far = memlend_run(&["--mem", "128M", "--far", "3G", "--ssd", ssd], &cmd);
    let err = text(&far.stderr);
    assert!(far.status.success(), "{err}");
    assert_eq!(text(&far.stdout), text(&plain.stdout), "same sum as a plain run");
    // V8 reserves its heap 256 KiB at a time (reserve.rs): a plain run
    // peaks at ~350 MiB, under --mem 128M at ~128 MiB.
    reservations_made_far(&err, 200.0);
}
