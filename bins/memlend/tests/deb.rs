//! The Debian package, end to end: `scripts/deb.sh` builds it from the
//! release build; it installs with `dpkg -i`; systemd accepts its unit;
//! memlendd starts from the unit's own command line with the shipped config
//! and serves pages; the installed `memlend run`, C library (through
//! pkg-config) and Python module work; `dpkg --purge` leaves nothing
//! behind, /dev/userfaultfd's mode included. Needs root and dpkg, and a
//! machine where no memlend package is installed already (it would be
//! replaced, then purged).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const NETNS: &str = "mltest-deb";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

fn run(argv: &[&str]) -> Output {
    Command::new(argv[0])
        .args(&argv[1..])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {argv:?}: {e}"))
}

/// Run, and fail the test with its output unless it succeeds; its stdout.
fn ok(argv: &[&str]) -> String {
    let out = run(argv);
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    assert!(
        out.status.success(),
        "{argv:?} failed ({}):\n{}\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

fn installed() -> bool {
    let out = run(&["dpkg-query", "-W", "-f=${Status}", "memlend"]);
    String::from_utf8_lossy(&out.stdout).contains("installed")
}

fn userfaultfd_mode() -> String {
    ok(&["stat", "-c", "%U %G %a", "/dev/userfaultfd"]).trim().to_string()
}

/// Purges the package and removes the namespace on every exit path.
struct Cleanup;

impl Drop for Cleanup {
    fn drop(&mut self) {
        let pids = run(&["ip", "netns", "pids", NETNS]).stdout;
        for pid in String::from_utf8_lossy(&pids).split_whitespace() {
            let _ = run(&["kill", "-9", pid]);
        }
        let _ = run(&["ip", "netns", "delete", NETNS]);
        if installed() {
            let _ = run(&["dpkg", "--purge", "memlend"]);
        }
    }
}

fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (dpkg -i)".into());
    }
    for tool in ["dpkg-deb", "dpkg", "systemd-analyze", "gcc", "pkg-config", "/usr/bin/python3"] {
        if !run(&["sh", "-c", &format!("command -v {tool}")]).status.success() {
            return Some(format!("{tool} is not installed"));
        }
    }
    if installed() {
        return Some("a memlend package is installed on this machine; not replacing it".into());
    }
    None
}

#[test]
fn the_package_installs_serves_pages_and_purges_clean() {
    if let Some(why) = skip_reason() {
        return memlend_testskip::skip(&why);
    }
    let deb = ok(&[repo().join("scripts/deb.sh").to_str().unwrap()]);
    let deb = deb.lines().last().unwrap().trim().to_string();
    let deb = repo().join(deb);
    let listing = ok(&["dpkg-deb", "-c", deb.to_str().unwrap()]);
    for want in [
        "./usr/bin/memlend",
        "./usr/bin/memlendd",
        "./usr/lib/memlend/libmemlend_preload.so",
        "./usr/include/memlend.h",
        "/pkgconfig/memlend.pc",
        "./usr/lib/python3/dist-packages/memlend/__init__.py",
        "./usr/lib/systemd/system/memlendd.service",
        "./usr/lib/udev/rules.d/60-memlend-userfaultfd.rules",
        "./etc/memlend/memlendd.toml",
        "./usr/share/man/man1/memlend.1.gz",
        "./usr/share/man/man1/memlend-run.1.gz",
        "./usr/share/man/man1/memlendd.1.gz",
        "./usr/share/bash-completion/completions/memlend",
        "./usr/share/zsh/vendor-completions/_memlendd",
        "./usr/share/fish/vendor_completions.d/memlend.fish",
    ] {
        assert!(listing.contains(want), "{want} is not in the package:\n{listing}");
    }
    let uffd_before = userfaultfd_mode();
    let _cleanup = Cleanup;
    ok(&["dpkg", "-i", deb.to_str().unwrap()]);
    let files: Vec<String> = ok(&["dpkg", "-L", "memlend"])
        .lines()
        .filter(|p| Path::new(p).is_file())
        .map(String::from)
        .collect();

    // systemd takes the unit; the group and the device follow the rule.
    let unit = "/usr/lib/systemd/system/memlendd.service";
    ok(&["systemd-analyze", "verify", unit]);
    ok(&["getent", "group", "memlend"]);
    assert_eq!(userfaultfd_mode().split_once(' ').unwrap().1, "memlend 660");

    // memlendd from the unit's own command lines, in a namespace of its own
    // so that the shipped config's 127.0.0.1:7070 is free.
    let text = std::fs::read_to_string(unit).unwrap();
    let line = |key: &str| -> Vec<String> {
        let l = text.lines().find(|l| l.starts_with(key)).unwrap_or_else(|| panic!("no {key}"));
        l[key.len()..].split_whitespace().map(String::from).collect()
    };
    let (check, start) = (line("ExecStartPre="), line("ExecStart="));
    ok(&["ip", "netns", "add", NETNS]);
    ok(&["ip", "-n", NETNS, "link", "set", "lo", "up"]);
    let in_ns = |argv: &[String]| -> Vec<String> {
        ["ip", "netns", "exec", NETNS].iter().map(|s| s.to_string()).chain(argv.to_vec()).collect()
    };
    let checked = in_ns(&check);
    ok(&checked.iter().map(String::as_str).collect::<Vec<_>>());
    let started = in_ns(&start);
    let mut daemon = Command::new(&started[0]).args(&started[1..]).spawn().unwrap();
    let verify = in_ns(
        &["/usr/bin/memlend", "verify", "--donor", "127.0.0.1:7070", "--insecure", "--size", "16M"]
            .map(String::from),
    );
    let mut served = None;
    for _ in 0..50 {
        let out = run(&verify.iter().map(String::as_str).collect::<Vec<_>>());
        if out.status.success() {
            served = Some(String::from_utf8_lossy(&out.stdout).into_owned());
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let served = served.expect("the packaged memlendd did not serve pages within 5 s");
    assert!(served.contains("0 of 4096 pages differ"), "{served}");

    // The installed memlend run finds its shim in /usr/lib/memlend.
    let far = in_ns(
        &[
            "/usr/bin/memlend",
            "run",
            "--local",
            "16M",
            "--donor",
            "127.0.0.1:7070",
            "--insecure",
            "--",
            "python3",
            "-c",
            "b = bytearray(64 << 20); b[::4096] = b'x' * (16 << 10); print(b.count(b'x'))",
        ]
        .map(String::from),
    );
    let out = run(&far.iter().map(String::as_str).collect::<Vec<_>>());
    let (stdout, stderr) =
        (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && stdout.trim() == "16384", "{stdout}\n{stderr}");
    assert!(stderr.contains("far memory on donor 127.0.0.1:7070"), "{stderr}");
    daemon.kill().unwrap();
    daemon.wait().unwrap();

    // The C library through pkg-config, and the Python module.
    let dir = tempfile::tempdir().unwrap();
    let c = dir.path().join("v.c");
    std::fs::write(&c, "#include <memlend.h>\n#include <stdio.h>\nint main(void){puts(memlend_version());return 0;}\n").unwrap();
    let flags = ok(&["pkg-config", "--cflags", "--libs", "memlend"]);
    let exe = dir.path().join("v");
    let mut cc = vec!["gcc", c.to_str().unwrap(), "-o", exe.to_str().unwrap()];
    cc.extend(flags.split_whitespace());
    ok(&cc);
    assert!(!ok(&[exe.to_str().unwrap()]).trim().is_empty());
    let py = ok(&[
        "/usr/bin/python3",
        "-c",
        "import memlend; print(memlend.__file__, memlend.version())",
    ]);
    assert!(py.starts_with("/usr/lib/python3/dist-packages/memlend/"), "{py}");

    // Man pages and completions are there and name the flags.
    let man = ok(&["sh", "-c", "zcat /usr/share/man/man1/memlendd.1.gz"]);
    assert!(man.contains(".TH memlendd 1") && man.contains("lend"), "{man}");
    ok(&["bash", "-c", ". /usr/share/bash-completion/completions/memlend && complete -p memlend"]);

    // Purge: no file of the package, no config, no state, no group, and the
    // device as it was.
    ok(&["dpkg", "--purge", "memlend"]);
    let left: Vec<&String> = files.iter().filter(|p| Path::new(p).exists()).collect();
    assert!(left.is_empty(), "purge left files behind: {left:?}");
    for dir in ["/etc/memlend", "/var/lib/memlend", "/usr/lib/memlend", "/usr/share/doc/memlend"] {
        assert!(!Path::new(dir).exists(), "purge left {dir} behind");
    }
    assert!(!run(&["getent", "group", "memlend"]).status.success(), "purge left the group");
    assert_eq!(userfaultfd_mode(), uffd_before);
}
