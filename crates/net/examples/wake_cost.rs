//! Print what waking a thread on another idle core costs here, and whether
//! `auto` spin settings spin (`cargo run --release --example wake_cost`).

fn main() {
    match memlend_net::wake_cost() {
        Some(cost) => println!(
            "wake across cores: {:.1} us over a spinning wait; spinning pays: {} (dear from {} us)",
            cost.as_secs_f64() * 1e6,
            memlend_net::spin_pays(),
            memlend_net::WAKE_DEAR.as_micros()
        ),
        None => {
            println!("wake cost not measured (one CPU allowed, or a wait timed out): auto spins")
        }
    }
}
