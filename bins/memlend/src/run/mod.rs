//! `memlend run -- CMD ARGS...`: run an unmodified program with its large
//! allocations in far memory. Checks that the pages have somewhere to go,
//! starts CMD with the preload shim, forwards signals, and when CMD ends
//! sums up what far memory did. Exits with CMD's status.

mod loadable;
mod report;
mod shared;

use anyhow::{bail, Context, Result};
use clap::Args;
use memlend_borrow::env as shim;
use memlend_borrow::{Placement, Redundancy};
use memlend_net::SpinSetting;
use memlend_node::size::{human, parse_size};
use memlend_store::layer::Stack;
use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Instant;

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Local budget: most far pages resident at once (per process).
    /// Default: half of MemAvailable.
    #[arg(long, value_parser = parse_size, conflicts_with = "mem")]
    pub local: Option<u64>,
    /// Total memory per process instead: far pages, the compressed pool and
    /// everything else the process holds stay within this. The far budget
    /// follows what the rest of the process uses (checked every 50 ms).
    #[arg(long, value_parser = parse_size)]
    pub mem: Option<u64>,
    /// Size of the far region (per process). Default: 8x --local, at least
    /// 1 GiB, at most what the donors have free.
    #[arg(long, value_parser = parse_size)]
    pub far: Option<u64>,
    /// A donor's page-protocol address; repeat to stripe over several.
    #[arg(long = "donor", value_name = "ADDR")]
    pub donors: Vec<SocketAddr>,
    /// Keep far pages in a local file instead (SSD as memory): a new path, a
    /// directory, or a block device. The default when no donor is named:
    /// $MEMLEND_SSD_DIR or /var/tmp.
    #[arg(long)]
    pub ssd: Option<PathBuf>,
    /// Borrow from the cluster through the local memlendd (its API socket;
    /// default $MEMLEND_POOL or /run/memlend/memlendd.sock). --ssd is then
    /// where reclaimed pages go when no other donor has room.
    /// (`--pool` alone, then the next flag: an Option in an Option, not an
    /// empty default, which clap's path parser refuses as "no value".)
    #[arg(long, value_name = "SOCKET", num_args = 0..=1, conflicts_with = "donors")]
    pub pool: Option<Option<PathBuf>>,
    /// The cluster key file, for donors.
    #[arg(long, conflicts_with = "insecure")]
    pub key: Option<PathBuf>,
    /// Talk to donors that run without a key.
    #[arg(long)]
    pub insecure: bool,
    /// A second home for every page: `mirror` (two donors), `ssd` (a donor
    /// and a file in the --ssd directory), `erasure` (three or more donors)
    /// or `none`; see `memlend far`.
    #[arg(long, default_value = "none")]
    pub redundancy: Redundancy,
    /// Send pages to donors in plain text (by default they are encrypted
    /// with a key that never leaves the process).
    #[arg(long)]
    pub no_encrypt: bool,
    /// Microseconds a connection polls for a donor's reply before sleeping
    /// (0: never; default 50). `auto`: 50 where waking a thread asleep on an
    /// idle core is dear (measured once: a VM without guest halt polling),
    /// else 0.
    #[arg(long, value_name = "auto|US")]
    pub spin_us: Option<SpinSetting>,
    /// Named layers over each far store, outermost first, e.g.
    /// `checksum,stats` (known: checksum, crypt, pack, pack-zstd, stats); see `memlend far`.
    #[arg(long, value_name = "SPEC")]
    pub layers: Option<Stack>,
    /// Allocations from this size up go to far memory.
    #[arg(long, default_value = "1M", value_parser = parse_size)]
    pub threshold: u64,
    /// The shim library. Default: $MEMLEND_PRELOAD, else
    /// libmemlend_preload.so beside this binary.
    #[arg(long)]
    pub preload: Option<PathBuf>,
    /// `lz4`: keep evicted pages that compress in a local pool carved from
    /// the budget, so a fault on one needs no store read. Off by default:
    /// on redis under a zipfian load at a quarter local it measured no gain
    /// (docs/run.md).
    /// `lz4-all` compresses every victim, as zswap does; `lz4` only those
    /// that came back after an eviction before. `zstd` and `zstd-all` do
    /// the same with zstd at level 1: about twice lz4's ratio on text, at
    /// two to three times its CPU.
    #[arg(long, default_value = "off", value_parser = ["lz4", "lz4-all", "zstd", "zstd-all", "off"])]
    pub compress: String,
    /// The largest aligned block, in pages (up to 16), that a fault from
    /// the store reads around its page, as kernel swap reads
    /// `vm.page-cluster` pages; used only while probes show that at least
    /// 30% of the pages beside get faulted on. Off (0) by default: on this
    /// project's 2-core test machines it cut SQLite's store faults by 42%
    /// and its throughput by 24% (docs/run.md).
    #[arg(long, value_name = "PAGES", default_value_t = 0)]
    pub read_block: usize,
    /// While all of a process's far pages fit its budget, collapse each
    /// 2 MiB chunk whose pages are all mapped into one huge page, as the
    /// kernel gives a program's own memory: numpy over a table that fit
    /// ran 0.88x all-local with 4 KiB pages. Eviction splits them again.
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = ["on", "off"])]
    pub huge_pages: String,
    /// A forked child (redis's BGSAVE) sees far memory as it was at the
    /// fork, read through its parent (docs/run.md, "fork"). Off: a child
    /// has no far memory, and touching it is SIGSEGV; a fork then costs
    /// nothing.
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = ["on", "off"])]
    pub follow_fork: String,
    /// When a process whose far pages do not fit its budget forks, its
    /// dirty pages must reach the store for the child: `lazy` writes them
    /// after the fork, between faults (the fork waits only to
    /// write-protect them); `eager` writes them all before it goes on.
    #[arg(long, value_name = "lazy|eager", default_value = "lazy", value_parser = ["lazy", "eager"])]
    pub fork_clean: String,
    /// Where a forking process keeps the bytes its child still owes to
    /// read while the parent rewrites them: an unlinked file on local
    /// disk, at most twice the far size, empty once no child lives.
    #[arg(long, value_name = "DIR", default_value = "/var/tmp")]
    pub fork_spill: PathBuf,
    /// When several threads fault at once on pages only the store holds,
    /// read their pages with one store read instead of one each.
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = ["on", "off"])]
    pub batch_faults: String,
    /// Record each process's page accesses into DIR/<pid>.trace, for
    /// `memlend replay`. The process then keeps only 1 MiB of far pages
    /// resident (so nearly every access faults) and runs far slower.
    #[arg(long, value_name = "DIR")]
    pub trace: Option<PathBuf>,
    /// Print no summary at the end.
    #[arg(long, short)]
    pub quiet: bool,
    /// Shared anonymous memory (`MAP_SHARED|MAP_ANONYMOUS`, PostgreSQL's
    /// shared buffers) is far too, served by this process in every process
    /// that maps it, within --local (or what --mem leaves). Off: it stays
    /// local.
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = ["on", "off"])]
    pub shared: String,
    /// Start CMD even if it is statically linked: the shim cannot load
    /// into it, so it runs with no far memory (by default memlend run
    /// refuses, and says what works instead).
    #[arg(long)]
    pub allow_static: bool,
    /// The program and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub cmd: Vec<String>,
}

pub fn run(a: &RunArgs) -> Result<()> {
    let given =
        a.preload.clone().or_else(|| std::env::var_os("MEMLEND_PRELOAD").map(PathBuf::from));
    let shim_path = find_shim(given.as_deref())?;
    warn_if_private(&shim_path);
    check_loadable(&a.cmd[0], a.allow_static)?;
    if let Err(why) = memlend_fault::check_access() {
        bail!("{why}");
    }
    let local = match (a.local, a.mem) {
        (Some(b), _) | (None, Some(b)) => b,
        (None, None) => memlend_host::meminfo::Memory::read()?.available_bytes / 2,
    };
    let floor_bytes = (memlend_fault::BUDGET_FLOOR_PAGES * memlend_store::PAGE_SIZE) as u64;
    if a.mem.is_none() && local < floor_bytes {
        // One instruction may need several far pages at once (see the floor's doc).
        bail!("--local must be at least {} KiB", floor_bytes >> 10);
    }
    if !a.donors.is_empty() && a.ssd.is_some() && a.redundancy == Redundancy::None {
        bail!("give --donor or --ssd, not both");
    }
    let pool = a.pool.as_ref().map(|p| match p {
        None => memlend_borrow::open::cluster::default_api_path(),
        Some(p) => absolute(p),
    });
    let placement = Placement {
        donors: a.donors.clone(),
        ssd: a.ssd.clone(),
        key: a.key.clone(),
        insecure: a.insecure,
        pool,
        redundancy: a.redundancy,
        no_encrypt: a.no_encrypt,
        layers: a.layers.clone().unwrap_or_default(),
        // `auto` is measured here once, not in every process the shim starts in.
        reply_spin: a
            .spin_us
            .map(|s| SpinSetting::Us(s.resolve(memlend_borrow::REPLY_SPIN_US).as_micros() as u64)),
    };
    let (where_, room) = preflight(&placement, a.far)?;
    let far = a.far.unwrap_or_else(|| default_far(local, room));
    let stats_dir = tempdir()?;
    let mut cmd = Command::new(&a.cmd[0]);
    cmd.args(&a.cmd[1..]);
    set_env(&mut cmd, a, &placement, &shim_path, (local, far), &stats_dir);
    let shared = if a.shared == "on" {
        let sock = stats_dir.join("shared.sock");
        let budget = match a.mem {
            Some(mem) => shared::Budget::Mem(mem),
            None => shared::Budget::Fixed(local),
        };
        let server = shared::start(&sock, &shim_placement(&placement), budget)?;
        cmd.env(shim::SHARED_SOCK, &sock);
        Some(server)
    } else {
        cmd.env_remove(shim::SHARED_SOCK);
        None
    };
    let started = Instant::now();
    let status = spawn_and_wait(&mut cmd, &a.cmd[0]);
    let elapsed_s = started.elapsed().as_secs_f64();
    let shared = shared.map(shared::Shared::finish);
    let reports = report::collect(&stats_dir);
    let _ = std::fs::remove_dir_all(&stats_dir);
    let status = status?;
    if !a.quiet {
        let shared_far = shared.as_ref().is_some_and(|s| s.segments > 0);
        report::print(&a.cmd, &status, elapsed_s, local, &where_, &reports, shared_far);
        if let Some(s) = &shared {
            report::print_shared(s);
        }
    }
    std::process::exit(exit_code(&status));
}

/// A program that becomes another user (`runuser -u postgres -- postgres`)
/// loads the shim as that user: ld.so skips a library it cannot read, and
/// says so only on the program's stderr. Say it here, before it starts.
fn warn_if_private(shim: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let others =
        |p: &Path, bit: u32| std::fs::metadata(p).is_ok_and(|m| m.permissions().mode() & bit != 0);
    let hidden =
        shim.ancestors().skip(1).find(|dir| !dir.as_os_str().is_empty() && !others(dir, 0o001));
    if !others(shim, 0o004) || hidden.is_some() {
        eprintln!(
            "memlend run: {} is readable by its owner only{}: a process that becomes another user \
             runs without far memory",
            shim.display(),
            hidden.map_or(String::new(), |d| format!(" (through {})", d.display()))
        );
    }
}

/// Refuse a program the shim cannot load into, before it starts (exit 2).
fn check_loadable(cmd: &str, allow_static: bool) -> Result<()> {
    let Some(file) = loadable::resolve(cmd) else { return Ok(()) }; // the spawn says why
    match loadable::of_file(&file) {
        Ok(loadable::Loadable::Static) if allow_static => {
            eprintln!(
                "memlend run: {} is statically linked; running it without far memory (--allow-static)",
                file.display()
            );
            Ok(())
        }
        Ok(loadable::Loadable::Static) => {
            eprintln!("memlend run: {}", loadable::static_refusal(&file));
            std::process::exit(2);
        }
        _ => Ok(()),
    }
}

/// Far region size when --far is not given: 8x the local budget, at least
/// 1 GiB, at most what the donors have free. Not all of their room: every
/// process of the run that makes large allocations opens a region of this
/// size, and the first must not take it all.
fn default_far(local: u64, room: Option<u64>) -> u64 {
    const FAR_BYTES_MIN: u64 = 1 << 30;
    let far = local.saturating_mul(8).max(FAR_BYTES_MIN);
    let far = room.map_or(far, |r| far.min(r));
    far / 4096 * 4096
}

/// Fail here, with a clear message, rather than inside the program's first
/// large malloc: donors must answer (and have room), the SSD path be usable.
/// Returns where the pages go, and the donors' room in bytes.
fn preflight(p: &Placement, far: Option<u64>) -> Result<(String, Option<u64>)> {
    if let Some(api) = &p.pool {
        // The daemon must answer now; whether the cluster has room is only
        // known when a process asks (and each process asks for itself).
        memlend_pool::api::Client::connect(api)?;
        return Ok((format!("the cluster (memlendd at {})", api.display()), None));
    }
    if !p.donors.is_empty() {
        let room = memlend_borrow::open::room_on_donors(p)?;
        // Mirrored, every page takes room on two donors; coded, n/(n-m).
        let n = p.donors.len() as u64;
        let room = match p.redundancy {
            Redundancy::Mirror => room / 2,
            Redundancy::Erasure if n >= 3 => {
                room / n * (n - memlend_borrow::open::redundant::parity_legs(n as usize) as u64)
            }
            _ => room,
        };
        // `pack` asks the donors for more pages than it offers.
        let room = p.layers.pages_offered(room / 4096) * 4096;
        if let Some(far) = far.filter(|&f| f > room) {
            bail!("--far {} is more than the donors have free ({})", human(far), human(room));
        }
        let n = p.donors.len();
        let mut where_ =
            if n == 1 { format!("donor {}", p.donors[0]) } else { format!("{n} donors") };
        if p.redundancy != Redundancy::None {
            where_.push_str(&format!(", redundancy {}", p.redundancy));
        }
        return Ok((where_, Some(room)));
    }
    let path = p.ssd.clone().unwrap_or_else(memlend_borrow::default_ssd_dir);
    let dir = if path.is_dir() { path.clone() } else { parent(&path) };
    if !dir.is_dir() {
        bail!("--ssd {}: {} is not a directory", path.display(), dir.display());
    }
    if path.is_file() {
        bail!("--ssd {} exists; give a new path, a directory or a block device", path.display());
    }
    Ok((format!("SSD {}", path.display()), None))
}

fn parent(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

fn set_env(
    cmd: &mut Command,
    a: &RunArgs,
    placement: &Placement,
    lib: &Path,
    (local, far): (u64, u64),
    stats: &Path,
) {
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(old) if !old.is_empty() => format!("{}:{old}", lib.display()),
        _ => lib.display().to_string(),
    };
    cmd.env("LD_PRELOAD", preload)
        .env(shim::LOCAL, local.to_string())
        .env(shim::FAR, far.to_string())
        .env(shim::THRESHOLD, a.threshold.to_string())
        .env(shim::STATS_DIR, stats)
        .env(shim::COMPRESS, &a.compress)
        .env(shim::READ_BLOCK_PAGES, a.read_block.to_string())
        .env(shim::HUGE_PAGES, &a.huge_pages)
        .env(shim::FOLLOW_FORK, &a.follow_fork)
        .env(shim::FORK_CLEAN, &a.fork_clean)
        .env(shim::FORK_SPILL_DIR, absolute(&a.fork_spill))
        .env(shim::BATCH_FAULTS, &a.batch_faults);
    match a.mem {
        Some(mem) => cmd.env(shim::MEM, mem.to_string()),
        None => cmd.env_remove(shim::MEM),
    };
    let placement = shim_placement(placement);
    let mut vars = memlend_borrow::env::placement_vars(&placement).to_vec();
    vars.push((shim::TRACE_DIR, a.trace.as_deref().map(|p| absolute(p).display().to_string())));
    for (name, value) in vars {
        match value {
            Some(v) => cmd.env(name, v),
            None => cmd.env_remove(name),
        };
    }
}

/// The placement as the program's processes (and the shared-memory
/// server) use it: paths absolute, since the program may change directory.
fn shim_placement(placement: &Placement) -> Placement {
    let mut placement = placement.clone();
    placement.ssd = placement.ssd.as_deref().map(absolute);
    placement.key = placement.key.as_deref().map(absolute);
    placement
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

fn find_shim(given: Option<&Path>) -> Result<PathBuf> {
    const NAME: &str = "libmemlend_preload.so";
    if let Some(p) = given {
        if p.is_file() {
            return Ok(absolute(p));
        }
        bail!("preload library {} not found", p.display());
    }
    let exe = std::env::current_exe().context("cannot find this binary's path")?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    for candidate in [dir.join(NAME), dir.join("../lib/memlend").join(NAME)] {
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    bail!(
        "{NAME} not found beside {}; build it (`cargo build --release -p memlend-preload`) or pass --preload",
        exe.display()
    )
}

/// The run's directory: each process's reports, the shared-memory
/// server's socket. Writable by every user but listed only by its owner
/// (mode 1733), as a program may become another user.
fn tempdir() -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    // In $TMPDIR if every user may pass through it, else in /tmp: a
    // benchmark's private TMPDIR (mode 700) kept PostgreSQL's server, run
    // as its own user, from the socket, and its buffers stayed local.
    let tmp = std::env::temp_dir();
    let open = std::fs::metadata(&tmp).is_ok_and(|m| m.permissions().mode() & 0o001 != 0);
    let parent = if open { tmp } else { PathBuf::from("/tmp") };
    let dir = parent.join(format!("memlend-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot make {}", dir.display()))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1733))?;
    Ok(dir)
}

/// Run CMD; SIGTERM, SIGHUP and SIGQUIT sent to us go on to it, and SIGINT
/// from the terminal reaches it directly (same process group), so we only
/// wait for it to end.
fn spawn_and_wait(cmd: &mut Command, name: &str) -> Result<ExitStatus> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
    // Caught before the spawn: a signal in between must still reach CMD,
    // not kill us and leave it running.
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGHUP, SIGQUIT, SIGINT])?;
    let mut child = cmd.spawn().with_context(|| format!("cannot start {name}"))?;
    let pid = child.id() as i32;
    let handle = signals.handle();
    let forward = std::thread::spawn(move || {
        for sig in signals.forever() {
            if sig != SIGINT {
                // SAFETY: kill(2) on our own child's pid.
                unsafe { libc::kill(pid, sig) };
            }
        }
    });
    let status = child.wait().context("waiting for the program")?;
    handle.close();
    let _ = forward.join();
    Ok(status)
}

fn exit_code(status: &ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(sig)) => 128 + sig,
        _ => 1,
    }
}
