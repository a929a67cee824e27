//! Real, unmodified NBD clients against the server: nbdinfo (libnbd-bin),
//! qemu-img and qemu-io (qemu-utils), nbdcopy (libnbd-bin). Every check ends
//! in bytes compared, either through NBD or straight from the store.

mod nbd_common;

use memlend_server::nbd::{Export, NbdConfig};
use memlend_store::PAGE_SIZE;
use nbd_common::*;
use std::process::{Command, Output};

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    if !out.status.success() {
        panic!(
            "{cmd:?} failed: {}\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

fn stdout(cmd: &mut Command) -> String {
    String::from_utf8(run(cmd).stdout).unwrap()
}

/// Two exports: "alpha" (default, 16 MiB) and "beta" (read-only, 4 MiB).
fn two_exports() -> TestServer {
    let alpha = Export::new("alpha", ram(4096)).description("first export");
    let beta = Export::new("beta", ram(1024)).description("second export").read_only(true);
    TestServer::start(vec![alpha, beta], NbdConfig::default())
}

#[test]
fn nbdinfo_reports_size_block_sizes_and_flags() {
    require_tool("nbdinfo", "libnbd-bin");
    let srv = two_exports();
    let json = stdout(Command::new("nbdinfo").arg("--json").arg(srv.uri("")));
    for want in [
        "\"export-name\": \"alpha\"",
        "\"export-size\": 16777216",
        "\"block_size_minimum\": 1",
        "\"block_size_preferred\": 4096",
        "\"block_size_maximum\": 67108864",
        "\"can_multi_conn\": true",
        "\"can_flush\": true",
        "\"can_fua\": true",
        "\"can_trim\": true",
        "\"can_zero\": true",
        "\"is_read_only\": false",
        "\"structured\": true",
        "\"description\": \"first export\"",
        "\"base:allocation\"",
    ] {
        assert!(json.contains(want), "nbdinfo output lacks {want}:\n{json}");
    }
}

#[test]
fn nbdinfo_sees_named_exports_and_lists_them() {
    require_tool("nbdinfo", "libnbd-bin");
    let srv = two_exports();
    let beta = stdout(Command::new("nbdinfo").arg("--json").arg(srv.uri("beta")));
    assert!(beta.contains("\"export-size\": 4194304"), "{beta}");
    assert!(beta.contains("\"is_read_only\": true"), "{beta}");
    assert!(beta.contains("\"can_trim\": false"), "{beta}");
    let list = stdout(Command::new("nbdinfo").arg("--list").arg(srv.uri("")));
    assert!(list.contains("export=\"alpha\""), "{list}");
    assert!(list.contains("export=\"beta\""), "{list}");
    assert!(list.contains("second export"), "{list}");
    let missing = Command::new("nbdinfo").arg(srv.uri("nope")).output().unwrap();
    assert!(!missing.status.success(), "nbdinfo accepted an export that does not exist");
}

#[test]
fn qemu_img_convert_in_and_nbdcopy_out_are_byte_identical() {
    require_tool("qemu-img", "qemu-utils");
    require_tool("nbdcopy", "libnbd-bin");
    let pages = 6144; // 24 MiB
    let srv = TestServer::ram(pages);
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (dir.path().join("in.raw"), dir.path().join("out.raw"));
    // Random data with a zero hole in the middle, so zeroing paths run too.
    let mut image = pattern(42, pages as usize * PAGE_SIZE);
    image[8 << 20..12 << 20].fill(0);
    std::fs::write(&src, &image).unwrap();
    run(Command::new("qemu-img")
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(&src)
        .arg(srv.uri("")));
    assert!(
        srv.store_bytes(0, 0, image.len()) == image,
        "store differs from the image qemu-img wrote"
    );
    run(Command::new("nbdcopy").arg(srv.uri("")).arg(&dst));
    let copied = std::fs::read(&dst).unwrap();
    assert_eq!(copied.len(), image.len());
    assert!(copied == image, "nbdcopy read back other bytes than qemu-img wrote");
}

fn qemu_io(uri: &str, cmds: &[&str]) -> String {
    let mut c = Command::new("qemu-io");
    c.args(["-f", "raw"]);
    for cmd in cmds {
        c.arg("-c").arg(cmd);
    }
    let out = stdout(c.arg(uri));
    for bad in ["Pattern verification failed", "failed:", "error"] {
        assert!(!out.contains(bad), "qemu-io reported {bad:?}:\n{out}");
    }
    out
}

#[test]
fn qemu_io_unaligned_patterns_zero_and_discard() {
    require_tool("qemu-io", "qemu-utils");
    let srv = TestServer::ram(256);
    let uri = srv.uri("");
    qemu_io(
        &uri,
        &[
            "write -P 0xab 1000 3000",
            "read -P 0xab 1000 3000",
            "read -P 0 0 1000",
            "read -P 0 4000 96",
            "write -P 0x11 4095 2",
            "read -P 0x11 4095 2",
            "write -P 0x22 10000 70000",
            "read -P 0x22 10000 70000",
            "write -z 20000 5000",
            "read -P 0 20000 5000",
            "read -P 0x22 25000 55000",
        ],
    );
    let got = srv.store_bytes(0, 0, 100_000);
    assert!(got[..1000].iter().all(|&b| b == 0));
    assert!(got[1000..4000].iter().all(|&b| b == 0xab), "sub-page write landed wrong");
    assert_eq!(&got[4095..4097], &[0x11, 0x11], "write across a page boundary");
    assert!(got[10000..20000].iter().all(|&b| b == 0x22));
    assert!(got[20000..25000].iter().all(|&b| b == 0), "write -z left data");
    assert!(got[25000..80000].iter().all(|&b| b == 0x22));
    assert!(got[80000..].iter().all(|&b| b == 0));
    // Discard whole pages; a later read of the range must give zeroes.
    qemu_io(&uri, &["discard 8192 65536", "read -P 0 8192 65536"]);
    assert!(srv.store_bytes(0, 8192, 65536).iter().all(|&b| b == 0));
    // Zero that may unmap (no NO_HOLE): whole pages are discarded.
    qemu_io(&uri, &["write -P 0x55 0 16384", "write -z -u 1000 12000", "read -P 0 1000 12000"]);
    let got = srv.store_bytes(0, 0, 16384);
    assert!(got[..1000].iter().chain(&got[13000..]).all(|&b| b == 0x55));
    assert!(got[1000..13000].iter().all(|&b| b == 0));
    // Zero with NO_HOLE (qemu-io write -z without -u) and FUA writes.
    qemu_io(
        &uri,
        &[
            "write -P 0x33 -f 0 8192",
            "read -P 0x33 0 8192",
            "write -z 100 200",
            "read -P 0 100 200",
        ],
    );
    let got = srv.store_bytes(0, 0, 8192);
    assert!(got[..100].iter().chain(&got[300..]).all(|&b| b == 0x33));
}

const MIB: u64 = 1 << 20;
const KIB_64: u64 = 64 << 10;

/// `nbdinfo --map` as (offset, length, type) lines; type 0 is data, 3 is
/// hole and zero.
fn nbdinfo_map(uri: &str) -> Vec<(u64, u64, u32)> {
    let text = stdout(Command::new("nbdinfo").arg("--map").arg(uri));
    let line = |l: &str| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let name = match f[2] {
            "0" => "data",
            "3" => "hole,zero",
            other => panic!("unexpected extent type {other} in:\n{text}"),
        };
        assert_eq!(f.get(3), Some(&name), "{text}");
        (f[0].parse().unwrap(), f[1].parse().unwrap(), f[2].parse().unwrap())
    };
    text.lines().map(line).collect()
}

/// `qemu-img map --output=json` as (start, length, data, zero) per extent.
/// Format given: probing it would read the first page, and a read page
/// counts as data (docs/nbd.md, "Block status").
fn qemu_img_map(uri: &str) -> Vec<(u64, u64, bool, bool)> {
    let json = stdout(Command::new("qemu-img").args(["map", "-f", "raw", "--output=json", uri]));
    let field = |obj: &str, key: &str| -> String {
        let at = obj.find(&format!("\"{key}\":")).unwrap_or_else(|| panic!("{key} in {json}"));
        let rest = obj[at + key.len() + 3..].trim_start();
        rest.split([',', '}']).next().unwrap().trim().to_string()
    };
    json.split('{')
        .skip(1)
        .map(|obj| {
            let start = field(obj, "start").parse().unwrap();
            let length = field(obj, "length").parse().unwrap();
            (start, length, field(obj, "data") == "true", field(obj, "zero") == "true")
        })
        .collect()
}

/// Written ranges of a fresh RAM export are data, the rest hole and zero,
/// as nbdinfo and qemu-img see them through BLOCK_STATUS; a discard makes
/// a hole again.
#[test]
fn nbdinfo_map_and_qemu_img_map_show_written_ranges() {
    require_tool("nbdinfo", "libnbd-bin");
    require_tool("qemu-io", "qemu-utils");
    require_tool("qemu-img", "qemu-utils");
    let srv = TestServer::ram(4096); // 16 MiB
    let uri = srv.uri("");
    qemu_io(&uri, &["write -P 0x55 1M 64k", "write -P 0x66 5M 1M"]);
    let (data, hole) = (0, 3);
    assert_eq!(
        nbdinfo_map(&uri),
        [
            (0, MIB, hole),
            (MIB, KIB_64, data),
            (MIB + KIB_64, 4 * MIB - KIB_64, hole),
            (5 * MIB, MIB, data),
            (6 * MIB, 10 * MIB, hole),
        ]
    );
    assert_eq!(
        qemu_img_map(&uri),
        [
            (0, MIB, false, true),
            (MIB, KIB_64, true, false),
            (MIB + KIB_64, 4 * MIB - KIB_64, false, true),
            (5 * MIB, MIB, true, false),
            (6 * MIB, 10 * MIB, false, true),
        ]
    );
    qemu_io(&uri, &["discard 5M 1M"]);
    let map = nbdinfo_map(&uri);
    assert_eq!(map, [(0, MIB, hole), (MIB, KIB_64, data), (MIB + KIB_64, 15 * MIB - KIB_64, hole)]);
}

/// A store that cannot tell (here a slow one, served by the worker pool)
/// reports every byte as data: true, if not informative.
#[test]
fn a_store_without_allocation_reports_everything_as_data() {
    require_tool("nbdinfo", "libnbd-bin");
    let store = slow_store(1024, std::time::Duration::ZERO);
    let srv = TestServer::start(vec![Export::new("slow", store)], NbdConfig::default());
    assert_eq!(nbdinfo_map(&srv.uri("")), [(0, 4 * MIB, 0)]);
}

#[test]
fn qemu_io_is_refused_writes_on_a_read_only_export() {
    require_tool("qemu-io", "qemu-utils");
    let srv = two_exports();
    let out = std::process::Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write -P 0x44 0 4096"])
        .arg(srv.uri("beta"))
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(!text.contains("wrote 4096/4096"), "write to a read-only export succeeded:\n{text}");
    assert!(srv.store_bytes(1, 0, 4096).iter().all(|&b| b == 0));
}

#[test]
#[should_panic(expected = "apt-get install some-package")]
fn a_missing_client_tool_fails_the_test_and_names_its_package() {
    require_tool("no-such-nbd-tool", "some-package");
}

/// A client outside the allowlist is closed before the handshake; one
/// inside it gets the export.
#[test]
fn the_allowlist_keeps_other_addresses_out() {
    require_tool("nbdinfo", "libnbd-bin");
    let only =
        |cidr: &str| NbdConfig { allow: vec![cidr.parse().unwrap()], ..NbdConfig::default() };
    let export = || vec![Export::new("mem", ram(256))];
    let shut_out = TestServer::start(export(), only("10.0.0.0/8"));
    let out = Command::new("nbdinfo").arg(shut_out.uri("")).output().unwrap();
    assert!(!out.status.success(), "a client outside 10.0.0.0/8 got in");
    let let_in = TestServer::start(export(), only("127.0.0.0/8"));
    assert!(stdout(Command::new("nbdinfo").arg("--size").arg(let_in.uri(""))).trim() == "1048576");
}
