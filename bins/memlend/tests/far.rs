//! `memlend far` with named layers: every page verifies through them, and
//! each layer's report is printed; an unknown layer is refused before any
//! store is opened.

use std::process::Command;

const MEMLEND: &str = env!("CARGO_BIN_EXE_memlend");

#[test]
fn far_memory_through_named_layers_verifies_and_reports() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(MEMLEND)
        .args(["far", "--size", "32M", "--local", "8M", "--ssd"])
        .arg(dir.path())
        .args(["--layers", "crypt,checksum,stats"])
        .output()
        .unwrap();
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    assert!(text.contains("0 of 8192 pages differ"), "{text}");
    assert!(text.contains("layers crypt,checksum,stats"), "{text}");
    assert!(
        text.contains("  crypt: 0 corrupt pages") && text.contains("  checksum: 0 corrupt pages"),
        "{text}"
    );
    let stats = text
        .lines()
        .find(|l| l.trim_start().starts_with("stats: read "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(!stats.contains("read 0 ops"), "the store was read through the layers: {stats}");
}

#[test]
fn an_unknown_layer_is_refused_with_the_known_ones() {
    let out = Command::new(MEMLEND)
        .args([
            "far",
            "--size",
            "32M",
            "--local",
            "8M",
            "--ssd",
            "/nonexistent",
            "--layers",
            "stats,zram",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("\"zram\" is not a layer (known: checksum, crypt, pack, pack-zstd, stats)"),
        "{err}"
    );
}
