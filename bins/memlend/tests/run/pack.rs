//! `memlend run --layers pack`: pages go to the far store compressed,
//! several to a page of it, and come back byte for byte, from a donor and
//! from the SSD tier; the layer's report says how many pages below it took.

use crate::common::*;

/// The ratio in the pack layer's report line: "... (2.41x) ...".
fn pack_ratio(stderr: &str) -> f64 {
    let line = stderr.lines().find(|l| l.contains("pack (")).unwrap_or_else(|| {
        panic!("no pack line in:\n{stderr}");
    });
    let ratio = line.split(" pages below (").nth(1).and_then(|r| r.split("x)").next());
    ratio.and_then(|r| r.parse().ok()).unwrap_or_else(|| panic!("{line}"))
}

fn text_pages_come_back_packed(layers: &str, placement: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let prog = compile("far_text", dir.path());
    let cmd = [prog.to_str().unwrap(), "48", "40000"];
    let mut args = vec!["--local", "8M", "--layers", layers];
    args.extend_from_slice(placement);
    let far = memlend_run(&args, &cmd);
    assert_same_output_and_far(&far, &plain_run(&cmd));
    let err = text(&far.stderr);
    let ratio = pack_ratio(&err);
    assert!(ratio > 1.5, "--layers {layers}: text packed only {ratio}x\n{err}");
}

#[test]
fn text_pages_on_a_donor_come_back_packed_with_lz4() {
    let donor = Donor::start("256M");
    let addr = donor.addr.to_string();
    text_pages_come_back_packed("pack", &["--donor", &addr, "--insecure"]);
}

#[test]
fn text_pages_on_the_ssd_tier_come_back_packed_with_zstd_and_stats() {
    let dir = tempfile::tempdir().unwrap();
    text_pages_come_back_packed("pack-zstd,stats", &["--ssd", dir.path().to_str().unwrap()]);
}

/// redis-server's values (random letters) compress under zstd: every one
/// of them comes back through packed pages on the SSD tier.
#[test]
fn redis_on_packed_pages_keeps_every_value() {
    let err = crate::redis::keeps_every_value(&["--layers", "pack-zstd"]);
    assert!(pack_ratio(&err) > 1.2, "redis's values packed little:\n{err}");
}

#[test]
fn compressing_twice_is_refused_before_the_program_starts() {
    let out = memlend_run(&["--local", "8M", "--layers", "pack,pack-zstd"], &["true"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("compress twice"), "{}", text(&out.stderr));
}
