//! The C ABI as C programs use it: tests/c/check.c is compiled with `cc`
//! against include/memlend.h and the built libmemlend.so (and once against
//! libmemlend.a), then run on an SSD file in a tempdir and on real memlendd
//! donors.

mod common;

use common::{dead_addr, key_file, libmemlend_a, libmemlend_so, profile_dir, repo, Donor};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// Which library the program links.
#[derive(Clone, Copy)]
enum Link {
    Shared,
    Static,
}

fn cc() -> String {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    match Command::new(&cc).arg("--version").output() {
        Ok(out) if out.status.success() => cc,
        _ => panic!(
            "no C compiler: `{cc} --version` failed. The C ABI tests compile a C program; \
             install one (Debian: apt-get install build-essential) or set CC"
        ),
    }
}

/// tests/c/check.c, compiled once per link kind.
fn program(link: Link) -> &'static Path {
    static SHARED: OnceLock<PathBuf> = OnceLock::new();
    static STATIC: OnceLock<PathBuf> = OnceLock::new();
    let cell = match link {
        Link::Shared => &SHARED,
        Link::Static => &STATIC,
    };
    cell.get_or_init(|| compile(link))
}

fn compile(link: Link) -> PathBuf {
    let repo = repo();
    let out_dir = profile_dir().join("capi-tests");
    std::fs::create_dir_all(&out_dir).unwrap();
    let (exe, libs): (PathBuf, Vec<String>) = match link {
        Link::Shared => {
            let so = libmemlend_so();
            let dir = so.parent().unwrap().display().to_string();
            let args = vec![format!("-L{dir}"), "-lmemlend".into(), format!("-Wl,-rpath,{dir}")];
            (out_dir.join("check-shared"), args)
        }
        Link::Static => {
            // What `rustc --print native-static-libs` lists for a std staticlib.
            let a = libmemlend_a().display().to_string();
            let args = vec![a, "-lgcc_s".into(), "-lutil".into(), "-lrt".into(), "-ldl".into()];
            (out_dir.join("check-static"), args)
        }
    };
    // Built under a private name, then renamed into place: a test run in
    // parallel keeps executing its own copy.
    let tmp = exe.with_extension(format!("tmp{}", std::process::id()));
    let out = Command::new(cc())
        .args(["-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror", "-pedantic", "-O1"])
        .arg("-pthread")
        .arg("-I")
        .arg(repo.join("include"))
        .arg(repo.join("crates/capi/tests/c/check.c"))
        .args(&libs)
        .arg("-lm")
        .arg("-o")
        .arg(&tmp)
        .output()
        .expect("run cc");
    assert!(
        out.status.success(),
        "cc failed to build the C test program:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::rename(&tmp, &exe).unwrap();
    exe
}

fn run(link: Link, args: &[&str]) -> Output {
    let out = Command::new(program(link))
        .args(args)
        .env("MEMLEND_LOG", "warn")
        // cargo test puts target/<profile> on LD_LIBRARY_PATH, which beats
        // the program's RUNPATH: it could load a stale libmemlend.so there.
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .expect("run the C test program");
    eprintln!(
        "check {}\n--- stdout\n{}--- stderr\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn passes(link: Link, args: &[&str]) -> String {
    let out = run(link, args);
    assert!(out.status.success(), "check {args:?} failed: {:?}", out.status);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The `stats:` line's counter `name`.
fn stat(stdout: &str, name: &str) -> u64 {
    let line = stdout.lines().find(|l| l.starts_with("stats:")).expect("a stats line");
    let mut words = line.split_whitespace();
    words.find(|w| *w == name).expect(name);
    words.next().unwrap().parse().unwrap()
}

#[test]
fn a_region_four_times_its_budget_on_ssd_reads_back_every_page() {
    let dir = tempfile::tempdir().unwrap();
    let out = passes(Link::Shared, &["region", "ssd", dir.path().to_str().unwrap(), "64", "16"]);
    assert!(out.contains("placement: file "), "{out}");
    assert!(stat(&out, "written_back") > 0);
    assert!(stat(&out, "resident") <= 16 * 256);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the SSD file is unlinked");
}

#[test]
fn named_layers_go_over_the_store_and_every_page_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let out = passes(Link::Shared, &["region", "ssd", d, "32", "8", "", "checksum,crypt,stats"]);
    assert!(out.contains("layers checksum,crypt,stats"), "{out}");
    assert!(stat(&out, "from_store") > 0, "pages came back through the layers");
}

#[test]
fn a_caller_built_against_version_1_of_the_config_still_makes_a_region() {
    let dir = tempfile::tempdir().unwrap();
    let out =
        passes(Link::Shared, &["region", "ssd", dir.path().to_str().unwrap(), "32", "8", "", "v1"]);
    assert!(out.contains("placement: file ") && !out.contains("layers"), "{out}");
}

#[test]
fn an_unknown_layer_is_refused_with_the_known_ones() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let out =
        passes(Link::Shared, &["refuse", "is not a layer", "ssd", d, "65536", "", "checksum,gzip"]);
    assert!(out.contains("known: checksum, crypt, pack, pack-zstd, stats"), "{out}");
}

#[test]
fn a_region_on_a_memlendd_donor_reads_back_every_page() {
    let donor = Donor::start("128M", None);
    let addr = donor.addr.to_string();
    let out = passes(Link::Shared, &["region", "donor", &addr, "64", "16"]);
    assert!(out.contains(&format!("placement: donor {addr}")), "{out}");
    assert!(stat(&out, "from_store") > 0);
}

#[test]
fn a_region_striped_over_two_keyed_donors_reads_back_every_page() {
    let dir = tempfile::tempdir().unwrap();
    let key = key_file(dir.path(), "key", 0x5a);
    let (a, b) = (Donor::start("64M", Some(&key)), Donor::start("64M", Some(&key)));
    let donors = format!("{}, {}", a.addr, b.addr);
    let out = passes(Link::Shared, &["region", "donor", &donors, "48", "8", key.to_str().unwrap()]);
    assert!(out.contains("placement: 2 donors, striped"), "{out}");
}

#[test]
fn an_unreachable_donor_is_refused_with_its_address() {
    let addr = dead_addr().to_string();
    passes(Link::Shared, &["refuse", &addr, "donors", &addr, "65536"]);
}

#[test]
fn a_wrong_key_is_refused_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let (right, wrong) = (key_file(dir.path(), "right", 0x11), key_file(dir.path(), "wrong", 0x22));
    let donor = Donor::start("64M", Some(&right));
    let addr = donor.addr.to_string();
    let out = passes(
        Link::Shared,
        &["refuse", "wrong key", "donors", &addr, "65536", wrong.to_str().unwrap()],
    );
    assert!(out.contains(&addr), "the message names the donor: {out}");
}

#[test]
fn a_keyless_config_for_keyed_donors_says_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let key = key_file(dir.path(), "key", 0x33);
    let donor = Donor::start("64M", Some(&key));
    // The C program sets insecure = 1 when no key is given: the donor
    // refuses to talk without the key, and the message says so.
    passes(Link::Shared, &["refuse", "set key_path", "donors", &donor.addr.to_string(), "65536"]);
}

#[test]
fn a_zero_budget_is_refused_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    passes(
        Link::Shared,
        &["refuse", "budget_bytes is 0", "ssd", dir.path().to_str().unwrap(), "0"],
    );
}

#[test]
fn an_ssd_path_that_exists_is_refused_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("someones");
    std::fs::write(&file, b"keep").unwrap();
    passes(Link::Shared, &["refuse", "exists", "ssd", file.to_str().unwrap(), "65536"]);
    assert_eq!(std::fs::read(&file).unwrap(), b"keep");
}

#[test]
fn nulls_bad_handles_and_short_buffers_are_errors_not_crashes() {
    let dir = tempfile::tempdir().unwrap();
    passes(Link::Shared, &["misuse", dir.path().to_str().unwrap()]);
}

#[test]
fn a_forked_child_touching_the_region_gets_sigsegv_not_zeroes() {
    let dir = tempfile::tempdir().unwrap();
    passes(Link::Shared, &["fork", dir.path().to_str().unwrap()]);
}

#[test]
fn destroy_racing_other_calls_on_the_handle_is_safe() {
    let dir = tempfile::tempdir().unwrap();
    passes(Link::Shared, &["race", dir.path().to_str().unwrap()]);
}

#[test]
fn the_header_compiles_as_cpp() {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let out = Command::new(&cxx)
        .args(["-x", "c++", "-std=c++11", "-Wall", "-Wextra", "-Werror", "-fsyntax-only"])
        .arg(repo().join("include/memlend.h"))
        .output()
        .unwrap_or_else(|e| panic!("{cxx}: {e} (Debian: apt-get install build-essential)"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn the_static_library_links_and_works() {
    let dir = tempfile::tempdir().unwrap();
    passes(Link::Static, &["misuse", dir.path().to_str().unwrap()]);
    passes(Link::Static, &["region", "ssd", dir.path().to_str().unwrap(), "16", "4"]);
}
