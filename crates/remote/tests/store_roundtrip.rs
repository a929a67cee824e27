//! The remote store against a real page server: bytes read back equal bytes
//! written, across batching, concurrency, reconnects and the budget.

mod common;

use common::{page_pattern, Donor, Proxy};
use memlend_remote::{ClientConfig, RemoteStore};
use memlend_store::{PageStore, ReadOp, WriteOp, PAGE_SIZE};
use proptest::prelude::*;
use std::sync::Arc;

fn insecure() -> ClientConfig {
    ClientConfig::new(None)
}

fn write_pages(s: &RemoteStore, seed: u8, page: u64, count: u64) {
    let data: Vec<u8> = (page..page + count).flat_map(|p| page_pattern(seed, p)).collect();
    s.write(&[WriteOp { page, data: &data }]).unwrap();
}

fn check_pages(s: &RemoteStore, seed: u8, page: u64, count: u64) {
    let mut buf = vec![0u8; count as usize * PAGE_SIZE];
    s.read(&mut [ReadOp { page, buf: &mut buf }]).unwrap();
    for (i, got) in buf.chunks(PAGE_SIZE).enumerate() {
        assert!(got == page_pattern(seed, page + i as u64), "page {} differs", page + i as u64);
    }
}

#[test]
fn large_batches_split_and_read_back() {
    let donor = Donor::start(8192, None);
    let s = RemoteStore::open(donor.addr, insecure(), 4096).unwrap();
    // 1000 pages is more than one request (256): the store splits and pipelines.
    write_pages(&s, 1, 100, 1000);
    check_pages(&s, 1, 100, 1000);
    let mut zero = vec![1u8; PAGE_SIZE];
    s.read(&mut [ReadOp { page: 4000, buf: &mut zero }]).unwrap();
    assert!(zero.iter().all(|&b| b == 0), "never-written pages read zero");
    s.discard(100, 10).unwrap();
    let mut buf = vec![1u8; 10 * PAGE_SIZE];
    s.read(&mut [ReadOp { page: 100, buf: &mut buf }]).unwrap();
    assert!(buf.iter().all(|&b| b == 0), "discarded pages read zero");
    check_pages(&s, 1, 110, 990);
    s.flush().unwrap();
    assert!(s.read(&mut [ReadOp { page: 4096, buf: &mut zero }]).is_err(), "past the end");
}

#[test]
fn scattered_batch_of_many_runs() {
    let donor = Donor::start(4096, None);
    let s = RemoteStore::open(donor.addr, insecure(), 2048).unwrap();
    let pages: Vec<u64> = (0..300).map(|i| (i * 37) % 2048).collect();
    let datas: Vec<Vec<u8>> = pages.iter().map(|&p| page_pattern(9, p)).collect();
    let ops: Vec<WriteOp> =
        pages.iter().zip(&datas).map(|(&page, d)| WriteOp { page, data: d }).collect();
    s.write(&ops).unwrap();
    let mut bufs = vec![vec![0u8; PAGE_SIZE]; pages.len()];
    let mut rops: Vec<ReadOp> =
        pages.iter().zip(bufs.iter_mut()).map(|(&page, buf)| ReadOp { page, buf }).collect();
    s.read(&mut rops).unwrap();
    assert_eq!(bufs, datas);
}

#[test]
fn many_threads_share_one_store() {
    let donor = Donor::start(16384, None);
    let s = Arc::new(RemoteStore::open(donor.addr, insecure(), 8192).unwrap());
    std::thread::scope(|sc| {
        for t in 0..6u64 {
            let s = Arc::clone(&s);
            sc.spawn(move || {
                for round in 0..20 {
                    let page = t * 1024 + round * 40;
                    write_pages(&s, t as u8, page, 40);
                    check_pages(&s, t as u8, page, 40);
                }
            });
        }
    });
    for t in 0..6u64 {
        check_pages(&s, t as u8, t * 1024, 800);
    }
}

#[test]
fn reconnects_and_finds_its_slab_again() {
    let donor = Donor::start(4096, None);
    let proxy = Proxy::start(donor.addr);
    let s = RemoteStore::open(proxy.addr, insecure(), 1024).unwrap();
    write_pages(&s, 3, 0, 512);
    proxy.cut();
    check_pages(&s, 3, 0, 512);
    write_pages(&s, 4, 512, 512);
    proxy.cut();
    check_pages(&s, 4, 512, 512);
    check_pages(&s, 3, 0, 512);
    assert_eq!(s.reconnects(), 2, "each cut forced exactly one reconnect");
}

#[test]
fn budget_is_enforced_and_returned_on_close() {
    let donor = Donor::start(1000, None);
    let a = RemoteStore::open(donor.addr, insecure(), 600).unwrap();
    let err = RemoteStore::open(donor.addr, insecure(), 600).unwrap_err();
    assert!(err.to_string().contains("NoSpace"), "{err}");
    assert_eq!(a.stat().unwrap().free_pages, 400);
    drop(a);
    let b = RemoteStore::open(donor.addr, insecure(), 1000).unwrap();
    assert_eq!(b.stat().unwrap().free_pages, 0);
}

#[test]
fn unreachable_donor_is_a_clear_error() {
    let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let err = RemoteStore::open(addr, insecure(), 10).unwrap_err();
    assert!(err.to_string().contains("refused"), "{err}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]
    #[test]
    fn random_ops_match_a_model(ops in proptest::collection::vec((0u8..3, 0u64..500, 1u64..300, any::<u8>()), 1..30)) {
        let donor = Donor::start(1024, None);
        let s = RemoteStore::open(donor.addr, insecure(), 800).unwrap();
        let mut model = vec![vec![0u8; PAGE_SIZE]; 800];
        for (kind, page, count, seed) in ops {
            match kind {
                0 => {
                    write_pages(&s, seed, page, count);
                    for p in page..page + count { model[p as usize] = page_pattern(seed, p); }
                }
                1 => {
                    s.discard(page, count).unwrap();
                    for p in page..page + count { model[p as usize] = vec![0; PAGE_SIZE]; }
                }
                _ => {
                    let mut buf = vec![0u8; count as usize * PAGE_SIZE];
                    s.read(&mut [ReadOp { page, buf: &mut buf }]).unwrap();
                    for (i, got) in buf.chunks(PAGE_SIZE).enumerate() {
                        prop_assert!(got == &model[page as usize + i][..]);
                    }
                }
            }
        }
    }
}
