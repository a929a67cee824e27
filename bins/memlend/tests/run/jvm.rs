//! A JVM under `memlend run`: its heap is a PROT_NONE reservation that it
//! commits piece by piece with MAP_FIXED, and both are made far
//! (`crates/preload/src/reserve.rs`). The job's heap is six times the
//! budget; its output must match a plain run, with pages really read back
//! from the store, under G1 and under the Parallel collector.

use super::common::*;
use std::path::Path;
use std::process::Command;

/// `javac` the test's program into `dir`.
fn compile_java(dir: &Path) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/progs/FarArray.java");
    let status = Command::new("javac")
        .arg("-d")
        .arg(dir)
        .arg(&src)
        .status()
        .expect("javac not found: install openjdk-17-jdk-headless (scripts/setup.sh does)");
    assert!(status.success(), "javac failed");
}

fn jvm_job_matches_a_plain_run(gc: &str) {
    let dir = tempfile::tempdir().unwrap();
    compile_java(dir.path());
    let classes = dir.path().to_str().unwrap();
    // 384 MiB of array under a 64 MiB budget for the whole process.
    let cmd = ["java", gc, "-Xmx640m", "-Xms64m", "-cp", classes, "FarArray", "384"];
    let plain = plain_run(&cmd);
    assert!(plain.status.success(), "plain run: {}", text(&plain.stderr));
    let ssd = dir.path().to_str().unwrap();
    let far = memlend_run(&["--mem", "64M", "--far", "2G", "--ssd", ssd], &cmd);
    let err = text(&far.stderr);
    assert!(far.status.success(), "{err}");
    assert_eq!(text(&far.stdout), text(&plain.stdout), "same sum as a plain run");
    let reserved = err.lines().find(|l| l.contains("made far:")).unwrap_or_default();
    assert!(reserved.contains("reservations (PROT_NONE"), "{err}");
    assert!(!reserved.contains("0 B in 0 reservations"), "the heap was made far: {err}");
    assert!(faults_from_store(&err) > 0, "pages were read back from the store: {err}");
    // The heap stayed far: the process held well under its 384 MiB array
    // (the JVM's own code, class data and GC tables are local).
    let rss = peak_rss_mib(&err);
    assert!(rss < 256.0, "peak resident set {rss} MiB: the heap went local: {err}");
}

#[test]
fn a_jvm_with_g1_and_a_heap_six_times_its_budget_matches_a_plain_run() {
    jvm_job_matches_a_plain_run("-XX:+UseG1GC");
}

#[test]
fn a_jvm_with_the_parallel_collector_matches_a_plain_run() {
    jvm_job_matches_a_plain_run("-XX:+UseParallelGC");
}
