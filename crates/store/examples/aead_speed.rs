//! Which AEAD to use for the `crypt` layer: AES-256-GCM from `ring` (the
//! one used) or from RustCrypto's `aes-gcm`, or RustCrypto's
//! ChaCha20-Poly1305 (`chacha20poly1305`), measured as
//! the layer uses them: 4 KiB pages, encrypted from the caller's buffer into
//! a separate one, decrypted in place, a fresh nonce per page, one thread.
//!
//! Run: `cargo run -p memlend-store --release --example aead_speed`.
//! Prints MB/s (10^6 bytes a second) of page bytes for encryption alone,
//! decryption alone, and one encryption plus one decryption of every page.
//! The best of `ROUNDS` rounds is kept, since the machine is shared.

use aes_gcm::aead::inout::InOutBuf;
use aes_gcm::aead::{AeadInOut, KeyInit};
use aes_gcm::Aes256Gcm;
use chacha20poly1305::ChaCha20Poly1305;
use std::time::{Duration, Instant};

const PAGE_SIZE: usize = 4096;
/// Pages in the working set: 16 MiB, larger than the L2 cache but not
/// the size of a real lease, so the numbers are for warm-ish memory.
const PAGES: usize = 4096;
/// Passes over the working set per round: 256 MiB encrypted per round.
const PASSES: usize = 16;
const ROUNDS: usize = 5;

fn main() {
    println!("AEAD over 4 KiB pages, one thread, best of {ROUNDS} rounds of {} MiB", mib());
    report("AES-256-GCM (ring)", measure_ring());
    report("AES-256-GCM (aes-gcm)", measure(&Aes256Gcm::new(&[7u8; 32].into())));
    report(
        "ChaCha20-Poly1305 (chacha20poly1305)",
        measure(&ChaCha20Poly1305::new(&[7u8; 32].into())),
    );
}

fn mib() -> usize {
    (PAGES * PASSES * PAGE_SIZE) >> 20
}

/// The best (shortest) encryption and decryption times over the rounds.
fn measure<C: AeadInOut<NonceSize = aes_gcm::aead::consts::U12>>(
    cipher: &C,
) -> (Duration, Duration) {
    let plain: Vec<u8> = (0..PAGES * PAGE_SIZE).map(|i| (i * 31 % 251) as u8).collect();
    let mut sealed = vec![0u8; plain.len()];
    let mut opened = vec![0u8; plain.len()];
    let mut tags = Vec::with_capacity(PAGES);
    let (mut best_enc, mut best_dec) = (Duration::MAX, Duration::MAX);
    for round in 0..ROUNDS {
        let started = Instant::now();
        tags.clear();
        for pass in 0..PASSES {
            let pages = plain.chunks_exact(PAGE_SIZE).zip(sealed.chunks_exact_mut(PAGE_SIZE));
            for (page, (src, dst)) in pages.enumerate() {
                let nonce = nonce(page, round * PASSES + pass);
                let buf = InOutBuf::new(src, dst).unwrap();
                let tag = cipher.encrypt_inout_detached(&nonce.into(), &[], buf).unwrap();
                if pass == PASSES - 1 {
                    tags.push(tag);
                }
            }
        }
        best_enc = best_enc.min(started.elapsed());
        let started = Instant::now();
        let version = round * PASSES + PASSES - 1;
        for _ in 0..PASSES {
            // Out of place, so that each pass opens the same ciphertext; the
            // layer decrypts in place, which costs the same.
            let pages = sealed.chunks_exact(PAGE_SIZE).zip(opened.chunks_exact_mut(PAGE_SIZE));
            for (page, (src, dst)) in pages.enumerate() {
                let buf = InOutBuf::new(src, dst).unwrap();
                cipher
                    .decrypt_inout_detached(&nonce(page, version).into(), &[], buf, &tags[page])
                    .unwrap();
            }
        }
        best_dec = best_dec.min(started.elapsed());
        assert!(opened == plain);
    }
    (best_enc, best_dec)
}

/// As `measure`, with `ring`: sealed in place after a copy, as the layer does.
fn measure_ring() -> (Duration, Duration) {
    use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
    let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &[7u8; 32]).unwrap());
    let plain: Vec<u8> = (0..PAGES * PAGE_SIZE).map(|i| (i * 31 % 251) as u8).collect();
    let mut sealed = vec![0u8; plain.len()];
    let mut tags = Vec::with_capacity(PAGES);
    let (mut best_enc, mut best_dec) = (Duration::MAX, Duration::MAX);
    for round in 0..ROUNDS {
        let started = Instant::now();
        for pass in 0..PASSES {
            tags.clear();
            let pages = plain.chunks_exact(PAGE_SIZE).zip(sealed.chunks_exact_mut(PAGE_SIZE));
            for (page, (src, dst)) in pages.enumerate() {
                dst.copy_from_slice(src);
                let n = Nonce::assume_unique_for_key(nonce(page, round * PASSES + pass));
                tags.push(key.seal_in_place_separate_tag(n, Aad::empty(), dst).unwrap());
            }
        }
        best_enc = best_enc.min(started.elapsed());
        let started = Instant::now();
        let version = round * PASSES + PASSES - 1;
        let mut opened = sealed.clone();
        for _ in 0..PASSES {
            opened.copy_from_slice(&sealed);
            for (page, buf) in opened.chunks_exact_mut(PAGE_SIZE).enumerate() {
                let n = Nonce::assume_unique_for_key(nonce(page, version));
                key.open_in_place_separate_tag(n, Aad::empty(), tags[page], buf, 0..).unwrap();
            }
        }
        best_dec = best_dec.min(started.elapsed());
        assert!(opened == plain);
    }
    (best_enc, best_dec)
}

fn nonce(page: usize, version: usize) -> [u8; 12] {
    let n = page as u128 | ((version as u128) << 40);
    n.to_le_bytes()[..12].try_into().unwrap()
}

fn report(name: &str, (enc, dec): (Duration, Duration)) {
    let bytes = (PAGES * PASSES * PAGE_SIZE) as f64;
    let mbps = |t: Duration| bytes / t.as_secs_f64() / 1e6;
    println!(
        "{name:40} encrypt {:6.0} MB/s  decrypt {:6.0} MB/s  encrypt+decrypt {:6.0} MB/s  ({:.2} us/page both ways)",
        mbps(enc),
        mbps(dec),
        mbps(enc + dec),
        (enc + dec).as_secs_f64() * 1e6 / (PAGES * PASSES) as f64,
    );
}
