//! What a probe window would win: the handler's S3-FIFO, blind to reads as
//! it runs live, with its victims kept local (moved out of the mapping, not
//! yet dropped) for a window of `probe%` of the budget. A fault on a page
//! still in the window is local (a move back, no store read) and brings it
//! back through the ghost path into main: the page was seen to be used. So
//! the window is how the handler could see reads of pages near eviction.
//!
//!     cargo run --release -p memlend-replay --example probe_window -- TRACE [FAR_US LOCAL_US]
//!
//! For 10, 25 and 50% of the distinct pages, and windows of 0-20% of that,
//! with every victim or only main's victims admitted, it prints store
//! misses and local faults per access over the last two thirds of the
//! trace, and their cost per access at FAR_US and LOCAL_US (default 30 and
//! 10: a loopback store fault and a local move back on this VM).
use memlend_fault::{PageState, PageTable, Policy};
use std::collections::VecDeque;

struct Counts {
    accesses: u64,
    far: u64,
    local: u64,
}

/// Victims kept local, oldest first; entries of pages taken back are stale.
struct Window {
    cap: usize,
    fifo: VecDeque<u32>,
    inside: Vec<bool>,
    live: usize,
}

impl Window {
    fn take(&mut self, id: u32) -> bool {
        let was = std::mem::replace(&mut self.inside[id as usize], false);
        // Not `-= usize::from(was)`: rustc 1.95 miscompiles that when the
        // bool is returned too (rust-lang/rust#158206).
        if was {
            self.live -= 1;
        }
        was
    }

    fn keep(&mut self, id: u32) {
        self.inside[id as usize] = true;
        self.fifo.push_back(id);
        self.live += 1;
        while self.live > self.cap {
            let old = self.fifo.pop_front().expect("live entries are queued");
            self.take(old);
        }
    }
}

fn run(d: &memlend_replay::Dense, cache: usize, probe: usize, main_only: bool) -> Counts {
    let mapped = cache - probe;
    let mut table = PageTable::new(d.distinct as u32, mapped, Policy::S3Fifo);
    let mut window =
        Window { cap: probe, fifo: VecDeque::new(), inside: vec![false; d.distinct], live: 0 };
    let warm = d.ids.len() / 3;
    let mut c = Counts { accesses: 0, far: 0, local: 0 };
    let mut victims = Vec::new();
    for (i, &(id, write)) in d.ids.iter().enumerate() {
        let counted = u64::from(i >= warm);
        c.accesses += counted;
        let state = table.get(id);
        if state.is_resident() {
            if write && state == PageState::Clean {
                table.written(id);
            }
            continue;
        }
        if window.take(id) {
            c.local += counted;
        } else {
            c.far += counted;
        }
        if table.resident() >= mapped {
            table.take_victims(1, &mut victims);
            for &v in &victims {
                let from_main = table.victim_from_main(v);
                table.evicted(v);
                if probe > 0 && (!main_only || from_main) {
                    window.keep(v);
                }
            }
        }
        // As the replay crate's table: a page comes back write-protected
        // unless the access that brought it is a write.
        let now = if write { PageState::Dirty } else { PageState::Clean };
        table.map(id, now);
    }
    c
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(path) = args.get(1) else {
        eprintln!("usage: probe_window TRACE [FAR_US LOCAL_US]");
        std::process::exit(2);
    };
    let cost = |i: usize, default: f64| args.get(i).map_or(default, |a| a.parse().expect("µs"));
    let (far_us, local_us) = (cost(2, 30.0), cost(3, 10.0));
    let raw = memlend_fault::trace::read(std::path::Path::new(path)).expect("a trace");
    let d = memlend_replay::densify(&raw);
    println!("{path}: {} accesses, {} distinct pages", d.ids.len(), d.distinct);
    println!("cache  admit  window  far/acc  local/acc  us/acc");
    for share_pct in [10, 25, 50] {
        let cache = d.distinct * share_pct / 100;
        for main_only in [false, true] {
            for probe_pct in [0, 2, 5, 10, 20] {
                let c = run(&d, cache, cache * probe_pct / 100, main_only);
                let per = |n: u64| n as f64 / c.accesses.max(1) as f64;
                let us = per(c.far) * far_us + per(c.local) * local_us;
                let admit = if main_only { "main" } else { "all" };
                println!(
                    "{share_pct:>4}%  {admit:>5}  {probe_pct:>5}%  {:.4}   {:.4}     {us:.3}",
                    per(c.far),
                    per(c.local)
                );
            }
        }
    }
}
