//! `memlend run --compress`: text pages evicted from the budget come back
//! from the compressed pool byte for byte, with either codec, and the run's
//! summary counts them.

use crate::common::*;

/// The number before " faults served" in the pool's summary line.
fn pool_faults(stderr: &str) -> u64 {
    let line = stderr.lines().find(|l| l.contains("compressed pool:")).unwrap_or_else(|| {
        panic!("no compressed-pool line in:\n{stderr}");
    });
    let before = line.split(" faults served").next().unwrap();
    before.rsplit(' ').next().unwrap().parse().unwrap_or_else(|_| panic!("{line}"))
}

fn text_pages_come_back_through(compress: &str) {
    let donor = Donor::start("256M");
    let dir = tempfile::tempdir().unwrap();
    let prog = compile("far_text", dir.path());
    let cmd = [prog.to_str().unwrap(), "48", "40000"];
    let addr = donor.addr.to_string();
    let args = ["--local", "8M", "--compress", compress, "--donor", &addr, "--insecure"];
    let far = memlend_run(&args, &cmd);
    assert_same_output_and_far(&far, &plain_run(&cmd));
    let err = text(&far.stderr);
    assert!(pool_faults(&err) > 100, "--compress {compress}: the pool served few faults\n{err}");
}

#[test]
fn with_lz4_text_pages_come_back_from_the_pool() {
    text_pages_come_back_through("lz4-all");
}

#[test]
fn with_zstd_text_pages_come_back_from_the_pool() {
    text_pages_come_back_through("zstd-all");
}

/// redis-server brings its own allocator (jemalloc): the codec's contexts,
/// made on the program's thread and used on memlend's, must not mix it with
/// glibc's (zstd's C `malloc` did, and redis stopped answering at load).
#[test]
fn redis_with_a_zstd_pool_keeps_every_value() {
    let err = crate::redis::keeps_every_value(&["--compress", "zstd-all"]);
    assert!(pool_faults(&err) > 0, "the pool served no fault:\n{err}");
}

#[test]
fn an_unknown_codec_is_refused_before_the_program_starts() {
    let out = memlend_run(&["--local", "8M", "--compress", "gzip", "--insecure"], &["true"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("gzip") && err.contains("zstd"), "{err}");
}
