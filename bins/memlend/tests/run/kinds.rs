//! The run summary names memory by kind: what was made far, what went to
//! the kernel as asked (shared memory, PROT_NONE reservations), processes
//! killed before their exit report; and a program the shim cannot load
//! into (statically linked) is refused before it starts.

use super::common::*;
use std::process::Command;

/// The kinds program under `memlend run ARGS`: same output as a plain
/// run, and its summary.
fn kinds_summary(args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let prog = compile("kinds", dir.path());
    let cmd = [prog.to_str().unwrap()];
    let ssd = dir.path().to_str().unwrap();
    let far = memlend_run(&[&["--local", "16M", "--ssd", ssd], args].concat(), &cmd);
    let err = text(&far.stderr);
    assert!(far.status.success(), "{err}");
    assert_eq!(text(&far.stdout), text(&plain_run(&cmd).stdout), "same output as a plain run");
    assert!(err.contains("made far: 32.0 MiB in 1 large allocations (malloc family)"), "{err}");
    assert!(err.contains("256.0 MiB in 1 reservations (PROT_NONE"), "{err}");
    assert!(!err.contains("no process made a large allocation"), "{err}");
    err
}

#[test]
fn the_summary_names_reservations_and_shared_memory_made_far() {
    let err = kinds_summary(&[]);
    assert!(err.contains("made far: 64.0 MiB in 1 shared anonymous mapping(s)"), "{err}");
    assert!(!err.contains("large mappings of shared memory"), "{err}");
}

#[test]
fn with_shared_off_the_summary_names_shared_memory_passed() {
    let err = kinds_summary(&["--shared", "off"]);
    assert!(err.contains("64.0 MiB in 1 large mappings of shared memory"), "{err}");
    assert!(!err.contains("shared anonymous mapping(s)"), "{err}");
}

#[test]
fn a_reservation_committed_uncommitted_and_released_keeps_every_byte() {
    let dir = tempfile::tempdir().unwrap();
    let prog = compile("far_reserve", dir.path());
    let ssd = dir.path().to_str().unwrap();
    let far = memlend_run(&["--local", "32M", "--ssd", ssd], &[prog.to_str().unwrap()]);
    let err = text(&far.stderr);
    assert!(far.status.success(), "exit {:?} (the step, far_reserve.c): {err}", far.status.code());
    assert!(
        err.contains(
            "256.0 MiB in 1 reservations (PROT_NONE, committed later: 3 commits in place)"
        ),
        "{err}"
    );
    assert!(faults_from_store(&err) > 0, "committed pages went out and came back: {err}");
    assert!(!err.contains("cannot move out"), "no page mapped into PROT_NONE: {err}");
}

#[test]
fn a_process_killed_before_its_exit_report_is_still_accounted_for() {
    let dir = tempfile::tempdir().unwrap();
    let prog = compile("kinds", dir.path());
    let cmd = [prog.to_str().unwrap(), "kill"];
    let ssd = dir.path().to_str().unwrap();
    let far = memlend_run(&["--local", "16M", "--ssd", ssd], &cmd);
    let err = text(&far.stderr);
    assert!(text(&far.stdout).starts_with("sum "), "it ran to the kill: {err}");
    assert!(err.contains("was killed"), "{err}");
    // The live thread wrote its counters as the heap started: counted from them.
    assert!(err.contains("1 process(es) ended without an exit report"), "{err}");
    assert!(err.contains("made far: 32.0 MiB in 1 large allocations"), "{err}");
    // Counted by the server, in memlend run: the kill cannot lose them.
    assert!(err.contains("made far: 64.0 MiB in 1 shared anonymous mapping(s)"), "{err}");
    assert!(!err.contains("no process made a large allocation"), "{err}");
}

#[test]
fn a_static_program_is_refused_before_it_starts_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("touch.c");
    // It leaves a file behind if it ever runs.
    std::fs::write(
        &src,
        "#include <stdio.h>\nint main(int c, char **v) { return !fopen(v[1], \"w\"); }\n",
    )
    .unwrap();
    let prog = dir.path().join("touch");
    let built = Command::new("cc").args(["-static", "-o"]).arg(&prog).arg(&src).status().unwrap();
    assert!(built.success(), "cc -static failed: libc6-dev (scripts/setup.sh) has libc.a");
    let mark = dir.path().join("ran");
    let cmd = [prog.to_str().unwrap(), mark.to_str().unwrap()];
    let ssd = dir.path().to_str().unwrap();
    let refused = memlend_run(&["--local", "16M", "--ssd", ssd], &cmd);
    let err = text(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{err}");
    assert!(err.contains("is statically linked") && err.contains("nbd-client"), "{err}");
    assert!(!mark.exists(), "a refused program must not have started");
    let allowed = memlend_run(&["--local", "16M", "--ssd", ssd, "--allow-static"], &cmd);
    assert!(allowed.status.success(), "{}", text(&allowed.stderr));
    assert!(mark.exists(), "--allow-static runs it");
}
