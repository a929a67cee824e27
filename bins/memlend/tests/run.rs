//! `memlend run` on unmodified programs: a C program, CPython with numpy and
//! redis-server give the same results as a plain run while most of their
//! memory lives on a donor or an SSD file; bad setups fail clearly; a donor
//! that dies mid-run does not leave the program hanging.

#[path = "run/common.rs"]
mod common;
#[path = "run/compress.rs"]
mod compress;
#[path = "run/jvm.rs"]
mod jvm;
#[path = "run/kinds.rs"]
mod kinds;
#[path = "run/mem_cgroup.rs"]
mod mem_cgroup;
#[path = "run/pack.rs"]
mod pack;
#[path = "run/redis.rs"]
mod redis;
#[path = "run/runtimes.rs"]
mod runtimes;
#[path = "run/shared.rs"]
mod shared;

use common::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn a_c_program_on_an_ssd_file_matches_a_plain_run() {
    let dir = tempfile::tempdir().unwrap();
    let prog = compile("far_heap", dir.path());
    let cmd = [prog.to_str().unwrap(), "96"];
    let ssd = dir.path().to_str().unwrap();
    let far = memlend_run(&["--local", "16M", "--ssd", ssd], &cmd);
    assert_same_output_and_far(&far, &plain_run(&cmd));
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
    assert_eq!(left.len(), 1, "only the program is left, no page file: {left:?}");
}

/// Named layers (`--layers`) go over the far store of every process, the
/// output is unchanged, and each layer reports at exit.
#[test]
fn named_layers_over_a_donor_change_nothing_the_program_sees_and_report() {
    let donor = Donor::start("512M");
    let dir = tempfile::tempdir().unwrap();
    let prog = compile("far_heap", dir.path());
    let cmd = [prog.to_str().unwrap(), "96"];
    let addr = donor.addr.to_string();
    let opts = ["--local", "16M", "--donor", &addr, "--insecure", "--layers", "checksum,stats"];
    let far = memlend_run(&opts, &cmd);
    assert_same_output_and_far(&far, &plain_run(&cmd));
    let err = text(&far.stderr);
    assert!(err.contains(": checksum: 0 corrupt pages"), "{err}");
    let stats =
        err.lines().find(|l| l.contains(": stats: read ")).unwrap_or_else(|| panic!("{err}"));
    let reads: u64 =
        stats.split("read ").nth(1).and_then(|r| r.split(' ').next()).unwrap().parse().unwrap();
    assert!(reads > 0, "the stats layer saw the store reads: {stats}");
}

#[test]
fn an_unknown_layer_is_refused_before_the_program_starts() {
    let dir = tempfile::tempdir().unwrap();
    let ssd = dir.path().to_str().unwrap();
    let out = memlend_run(&["--local", "16M", "--ssd", ssd, "--layers", "checksum,lz5"], &["true"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("\"lz5\" is not a layer (known: checksum, crypt, pack, pack-zstd, stats)"),
        "{err}"
    );
}

#[test]
fn a_c_program_on_a_donor_matches_a_plain_run() {
    let donor = Donor::start("512M");
    let dir = tempfile::tempdir().unwrap();
    let prog = compile("far_heap", dir.path());
    let cmd = [prog.to_str().unwrap(), "96"];
    let addr = donor.addr.to_string();
    let far = memlend_run(&["--local", "16M", "--donor", &addr, "--insecure"], &cmd);
    assert_same_output_and_far(&far, &plain_run(&cmd));
}

/// A program whose far memory fits its budget gets it in huge pages, as it
/// would get its own memory (`crates/fault/src/huge.rs`); the collapse goes
/// past the shim's own `madvise`, which ignores the program's huge-page
/// advice. With `--huge-pages off`, none.
#[test]
fn far_memory_that_fits_gets_huge_pages() {
    if std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .is_ok_and(|s| s.contains("[never]"))
    {
        return memlend_testskip::skip("transparent huge pages are off");
    }
    let donor = Donor::start("256M");
    let dir = tempfile::tempdir().unwrap();
    let prog = compile("far_huge", dir.path());
    let addr = donor.addr.to_string();
    let opts = ["--local", "96M", "--donor", &addr, "--insecure"];
    let far = memlend_run(&opts, &[prog.to_str().unwrap(), "32", "10"]);
    let err = text(&far.stderr);
    assert!(far.status.success(), "{}: {}\n{err}", far.status, text(&far.stdout));
    assert!(err.contains("chunks of 2 MiB collapsed"), "{err}");

    let off = [&opts[..], &["--huge-pages", "off"]].concat();
    let far = memlend_run(&off, &[prog.to_str().unwrap(), "32", "2"]);
    assert_eq!(far.status.code(), Some(4), "{}{}", text(&far.stdout), text(&far.stderr));
}

/// A program that exits tells its donor, which frees its slabs as its
/// connections close: the next program finds the donor free at once, not
/// full for the donor's 60 s grace (as it did before LINGER).
#[test]
fn a_second_run_right_after_the_first_finds_the_donor_free() {
    let donor = Donor::start("256M");
    let dir = tempfile::tempdir().unwrap();
    let prog = compile("far_heap", dir.path());
    let cmd = [prog.to_str().unwrap(), "96"];
    let addr = donor.addr.to_string();
    // The far region takes all the donor has room for, so a second run
    // fits only once the first one's slabs are gone.
    let args = ["--local", "16M", "--donor", &addr, "--insecure"];
    let plain = plain_run(&cmd);
    assert_same_output_and_far(&memlend_run(&args, &cmd), &plain);
    let first_done = Instant::now();
    loop {
        let second = memlend_run(&args, &cmd);
        if second.status.success() {
            assert_same_output_and_far(&second, &plain);
            break;
        }
        let waited = first_done.elapsed();
        assert!(
            waited < Duration::from_secs(5),
            "still refused after {waited:?}: {}",
            text(&second.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn cpython_with_numpy_matches_a_plain_run() {
    let python = "/usr/bin/python3";
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/progs/numpy_far.py");
    let probe = Command::new(python).args(["-c", "import numpy"]).status();
    assert!(
        probe.is_ok_and(|s| s.success()),
        "{python} with numpy is needed: install python3-numpy (scripts/setup.sh does)"
    );
    let dir = tempfile::tempdir().unwrap();
    let cmd = [python, script, "96"];
    let far = memlend_run(&["--local", "24M", "--ssd", dir.path().to_str().unwrap()], &cmd);
    assert_same_output_and_far(&far, &plain_run(&cmd));
}

#[test]
fn redis_server_keeps_every_value() {
    redis::keeps_every_value(&[]);
}

/// Python's multiprocessing with the fork start method, by default: three
/// workers read the arrays they inherited, as at their fork, while the
/// parent rewrites them, and grow an inherited list (a realloc of the
/// parent's far block, which failed with MemoryError before).
#[test]
fn python_multiprocessing_workers_see_their_parents_arrays_and_grow_its_list() {
    let python = "/usr/bin/python3";
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/progs/mp_fork.py");
    let dir = tempfile::tempdir().unwrap();
    let cmd = [python, script, "48"];
    let far = memlend_run(&["--local", "24M", "--ssd", dir.path().to_str().unwrap()], &cmd);
    assert_same_output_and_far(&far, &plain_run(&cmd));
    let err = text(&far.stderr);
    assert!(err.contains("fork: 3 forks"), "the workers were not followed:\n{err}");
}

#[test]
fn without_follow_fork_a_forked_child_has_no_far_memory_and_the_parent_keeps_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let prog = compile("far_nofollow", dir.path());
    let ssd = dir.path().to_str().unwrap();
    let args = ["--local", "8M", "--ssd", ssd, "--follow-fork", "off"];
    let out = memlend_run(&args, &[prog.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{}\n{err}", out.status);
    assert_eq!(text(&out.stdout), "far_nofollow ok\n");
    assert!(faults_from_store(&err) > 0, "far memory was not used:\n{err}");
}

#[test]
fn forked_children_see_far_memory_as_at_their_fork_while_the_parent_rewrites_it() {
    let dir = tempfile::tempdir().unwrap();
    let prog = compile("far_fork", dir.path());
    let ssd = dir.path().to_str().unwrap();
    // No flag: forks are followed by default.
    let args = ["--local", "8M", "--ssd", ssd];
    let out = memlend_run(&args, &[prog.to_str().unwrap(), "32"]);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{}\n{err}", out.status);
    assert_eq!(text(&out.stdout), "far_fork ok\n");
    assert!(faults_from_store(&err) > 0, "far memory was not used:\n{err}");
}

#[test]
fn an_unreachable_donor_is_a_clear_error() {
    let out = memlend_run(&["--donor", "127.0.0.1:1", "--insecure"], &["true"]);
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("cannot reach donor 127.0.0.1:1"), "{err}");
}

#[test]
fn a_missing_program_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let ssd = dir.path().to_str().unwrap();
    let out = memlend_run(&["--ssd", ssd], &["/nonexistent/prog"]);
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("cannot start /nonexistent/prog"), "{err}");
}

/// `--pool` takes its socket or none (then the default): the README's own
/// `--pool --local 2G --ssd DIR` once failed to parse, as "a value is
/// required for '--pool'", and no test named the flag bare.
#[test]
fn a_bare_pool_flag_parses_and_names_the_socket_it_tried() {
    let dir = tempfile::tempdir().unwrap();
    let ssd = dir.path().to_str().unwrap();
    let socket = dir.path().join("no-memlendd.sock");
    let out = Command::new(MEMLEND)
        .args(["run", "--pool", "--local", "2G", "--ssd", ssd, "--", "true"])
        .env("MEMLEND_POOL", &socket)
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert!(!out.status.success(), "no memlendd listens there: {err}");
    assert!(!err.contains("a value is required"), "{err}");
    assert!(err.contains("no-memlendd.sock"), "the default socket is named: {err}");
}

#[test]
fn the_exit_status_is_the_programs() {
    let dir = tempfile::tempdir().unwrap();
    let ssd = dir.path().to_str().unwrap();
    let out = memlend_run(&["--ssd", ssd, "--quiet"], &["sh", "-c", "exit 7"]);
    assert_eq!(out.status.code(), Some(7));
}

/// The donor is killed while the program still needs pages from it: the
/// program must end (SIGBUS on the page whose read failed, with the reason
/// logged), not hang. With a second copy it goes on: the next test.
#[test]
fn a_donor_that_dies_mid_run_is_no_silent_hang() {
    let mut donor = Donor::start("512M");
    let dir = tempfile::tempdir().unwrap();
    let prog = compile("far_loop", dir.path());
    let addr = donor.addr.to_string();
    let mut reaped = spawn_run(&["--donor", &addr, "--insecure"], &[prog.to_str().unwrap(), "64"]);
    let child = &mut reaped.0;
    let mut out = child.stdout.take().unwrap();
    let mut first = [0u8; 6];
    std::io::Read::read_exact(&mut out, &mut first).expect("far_loop reports its first pass");
    assert_eq!(&first, b"pass 1");
    donor.child.kill().unwrap();
    donor.child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the program hangs after its donor died");
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(!status.success(), "the program cannot have finished without its pages");
    assert!(err.contains("failed"), "the reason is logged:\n{err}");
}

/// `--redundancy mirror` over two donors: one is killed after the first
/// pass, and the program checks every page for 8 more passes, unaware. The
/// lost copy is rebuilt (on the SSD here: no third donor).
#[test]
fn with_a_mirror_a_donor_that_dies_mid_run_costs_nothing() {
    let (mut first, second) = (Donor::start("512M"), Donor::start("512M"));
    let dir = tempfile::tempdir().unwrap();
    let prog = compile("far_loop", dir.path());
    let (a, b) = (first.addr.to_string(), second.addr.to_string());
    let ssd = dir.path().to_str().unwrap();
    let opts = ["--donor", &a, "--donor", &b, "--insecure", "--redundancy", "mirror", "--ssd", ssd];
    let mut reaped = spawn_run(&opts, &[prog.to_str().unwrap(), "64", "9"]);
    let child = &mut reaped.0;
    let mut out = child.stdout.take().unwrap();
    let mut first_pass = [0u8; 7];
    std::io::Read::read_exact(&mut out, &mut first_pass).expect("far_loop reports its first pass");
    assert_eq!(&first_pass, b"pass 1\n");
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(status.success(), "{status}\n{rest}\n{err}");
    assert!(rest.ends_with("pass 9\n"), "{rest}");
    assert!(err.contains("copies: 1 lost and 1 rebuilt") && err.contains(" 0 pages lost"), "{err}");
}

/// `memlend run --local 8M OPTS -- CMD` with its output piped, killed when
/// the test ends.
fn spawn_run(opts: &[&str], cmd: &[&str]) -> Reaped {
    let child = Command::new(MEMLEND)
        .args(["run", "--preload", shim().to_str().unwrap(), "--local", "8M"])
        .args(opts)
        .arg("--")
        .args(cmd)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    Reaped(child)
}

/// `--mem`: the whole process stays within the limit while its memory
/// outside far memory grows by a third of it, so the far budget must
/// shrink to make room (`crates/preload/src/mem_limit.rs`).
#[test]
fn with_mem_the_whole_process_stays_within_it_as_the_rest_grows() {
    let donor = Donor::start("256M");
    let dir = tempfile::tempdir().unwrap();
    let prog = compile("far_grow", dir.path());
    let cmd = [prog.to_str().unwrap(), "96", "24"];
    let addr = donor.addr.to_string();
    let far = memlend_run(&["--mem", "64M", "--donor", &addr, "--insecure"], &cmd);
    assert_same_output_and_far(&far, &plain_run(&cmd));
    let err = text(&far.stderr);
    let line = err.lines().find(|l| l.contains("peak resident set")).expect(&err);
    let mib = |after: &str| -> f64 {
        let rest = &line[line.find(after).unwrap() + after.len()..];
        let (num, unit) = rest.trim_start().split_once(' ').unwrap();
        let scale = if unit.starts_with("GiB") {
            1024.0
        } else if unit.starts_with("KiB") {
            1.0 / 1024.0
        } else {
            1.0
        };
        num.parse::<f64>().unwrap() * scale
    };
    let (peak, budget) = (mib("peak resident set"), mib("far budget at exit"));
    // A MiB of slack for the 50 ms it takes to notice a step of growth.
    assert!(peak <= 65.0, "the process went past --mem 64M: {line}");
    assert!(budget < 40.0, "the far budget did not shrink for the 24 MiB grown: {line}");
}

/// A `--mem` too small for the rest of the process: the far pages keep
/// their floor, so an instruction that needs two far pages at once (an
/// 8-byte load across a page boundary) still completes, where a budget of
/// one page faulted on each in turn forever; and the user is told.
#[test]
fn with_mem_too_small_the_program_still_finishes_and_is_told() {
    let dir = tempfile::tempdir().unwrap();
    let prog = compile("far_straddle", dir.path());
    let cmd = [prog.to_str().unwrap(), "8"];
    let child = Command::new(MEMLEND)
        .args(["run", "--preload", shim().to_str().unwrap(), "--mem", "4M", "--ssd"])
        .arg(dir.path())
        .arg("--")
        .args(cmd)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut reaped = Reaped(child);
    let child = &mut reaped.0;
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "no progress under a tiny --mem");
        std::thread::sleep(Duration::from_millis(100));
    };
    let (mut out, mut err) = (String::new(), String::new());
    std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut out).unwrap();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(status.success(), "{status}\n{err}");
    assert_eq!(out, text(&plain_run(&cmd).stdout), "every byte copied:\n{err}");
    assert!(err.contains("--mem 4 MiB is too small"), "the user is told:\n{err}");
    assert!(faults_from_store(&err) > 0, "the pages really went far:\n{err}");
}

/// A user who may not use userfaultfd gets an error that says so and names
/// the fixes, before the program starts, rather than a program that dies of
/// MemoryError for no stated reason. Run as `nobody` through runuser.
#[test]
fn a_user_without_userfaultfd_is_told_how_to_allow_it() {
    let sysctl =
        std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd").unwrap_or_default();
    let dev_open = std::fs::metadata("/dev/userfaultfd")
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o006 != 0)
        .unwrap_or(false);
    let root = effective_uid() == 0;
    if !root || sysctl.trim() != "0" || dev_open || which("runuser").is_none() {
        return memlend_testskip::skip(
            "needs root, runuser, vm.unprivileged_userfaultfd=0 and a private /dev/userfaultfd",
        );
    }
    let out = Command::new("runuser")
        .args([
            "-u", "nobody", "--", MEMLEND, "run", "--local", "16M", "--ssd", "/tmp", "--", "true",
        ])
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert!(!out.status.success(), "memlend run went ahead: {err}");
    for want in
        ["may not use userfaultfd", "vm.unprivileged_userfaultfd", "usermod -aG", "run as root"]
    {
        assert!(err.contains(want), "the error lacks {want:?}: {err}");
    }
}

fn effective_uid() -> u32 {
    // /proc/self/status's Uid line: real, effective, saved, filesystem.
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    uid.split_whitespace().nth(2).unwrap().parse().unwrap()
}

fn which(tool: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| std::path::Path::new(d).join(tool))
        .find(|p| p.is_file())
}
