use super::*;
use crate::ram::{RamOptions, RamStore};
use crate::{ReadOp, StoreError, WriteOp, PAGE_SIZE};

fn ram(pages: u64) -> Arc<dyn PageStore> {
    Arc::new(RamStore::new(pages, RamOptions::default()).unwrap())
}

fn page_of(seed: u8) -> Vec<u8> {
    (0..PAGE_SIZE).map(|i| seed.wrapping_add((i % 251) as u8)).collect()
}

#[test]
fn a_spec_reads_outermost_first_and_prints_back_as_written() {
    let stack: Stack = "checksum, crypt ,stats".parse().unwrap();
    assert_eq!(stack.to_string(), "checksum,crypt,stats");
    assert_eq!(stack.to_string().parse::<Stack>().unwrap(), stack);
    let built = stack.build(ram(16)).unwrap();
    assert_eq!(built.store.info().name, "checksum(crypt(local_tags(stats(ram))))");
    assert_eq!(built.reports.len(), 3);
    assert!(built.reports[0]().starts_with("checksum:"), "{}", built.reports[0]());
    assert!(built.reports[2]().starts_with("stats:"), "{}", built.reports[2]());
}

#[test]
fn an_empty_spec_is_the_base_itself() {
    for spec in ["", "  "] {
        let stack: Stack = spec.parse().unwrap();
        assert!(stack.is_empty());
        let built = stack.build(ram(4)).unwrap();
        assert_eq!(built.store.info().name, "ram");
        assert!(built.reports.is_empty());
    }
}

#[test]
fn bad_specs_are_refused_with_the_reason() {
    let err = |s: &str| s.parse::<Stack>().unwrap_err().0;
    assert!(err("checksum,zstd")
        .contains("\"zstd\" is not a layer (known: checksum, crypt, pack, pack-zstd, stats)"));
    assert!(err("checksum,,stats").contains("an empty name is not a layer"));
    assert!(err("stats,stats").contains("stats is named twice"));
    assert!(err(&"x".repeat(SPEC_BYTES_MAX + 1)).contains("over the limit of 256"));
    assert!(err("Checksum").contains("not a layer"), "names are exact");
    assert!(err("pack,pack-zstd").contains("compress twice"));
}

#[test]
fn every_registered_layer_keeps_the_bytes_written_through_it() {
    for named in LAYERS {
        let stack: Stack = named.name.parse().unwrap();
        let built = stack.build(ram(stack.pages_below(8))).unwrap();
        assert_eq!(built.store.info().pages, 8, "{}", named.name);
        let pages: Vec<Vec<u8>> = (0..8).map(page_of).collect();
        for (i, p) in pages.iter().enumerate() {
            built.store.write(&[WriteOp { page: i as u64, data: p }]).unwrap();
        }
        for (i, p) in pages.iter().enumerate() {
            let mut got = vec![0u8; PAGE_SIZE];
            built.store.read(&mut [ReadOp { page: i as u64, buf: &mut got }]).unwrap();
            assert!(got == *p, "{}: page {i} read back differently", named.name);
        }
        for report in &built.reports {
            let line = report();
            assert!(!line.contains(" 1 corrupt") && !line.is_empty(), "{line}");
        }
    }
}

#[test]
fn the_crypt_layer_leaves_only_ciphertext_below_it() {
    let base = ram(2);
    let built = "crypt".parse::<Stack>().unwrap().build(base.clone()).unwrap();
    let plain = page_of(7);
    built.store.write(&[WriteOp { page: 1, data: &plain }]).unwrap();
    let mut below = vec![0u8; PAGE_SIZE];
    base.read(&mut [ReadOp { page: 1, buf: &mut below }]).unwrap();
    assert!(below != plain);
    let same = plain.windows(16).step_by(16).filter(|w| below.windows(16).any(|b| b == *w)).count();
    assert_eq!(same, 0, "no 16-byte run of the page appears below the layer");
}

#[test]
fn the_checksum_layer_catches_a_page_changed_below_it() {
    let base = ram(2);
    let built = "checksum,stats".parse::<Stack>().unwrap().build(base.clone()).unwrap();
    built.store.write(&[WriteOp { page: 0, data: &page_of(1) }]).unwrap();
    base.write(&[WriteOp { page: 0, data: &page_of(2) }]).unwrap();
    let mut got = vec![0u8; PAGE_SIZE];
    let res = built.store.read(&mut [ReadOp { page: 0, buf: &mut got }]);
    assert!(matches!(res, Err(StoreError::Corrupt { page: 0, .. })), "{res:?}");
    assert_eq!(built.reports[0](), "checksum: 1 corrupt pages");
    assert!(built.reports[1]().contains("write 1 ops"), "{}", built.reports[1]());
}

#[test]
fn pack_asks_the_base_for_its_headroom_and_says_what_it_saved() {
    let stack: Stack = "stats,pack".parse().unwrap();
    assert_eq!(stack.pages_below(16), 16 + 256);
    assert_eq!(stack.pages_below(1 << 20), (1 << 20) + (1 << 17), "an eighth more");
    assert_eq!(stack.pages_offered(stack.pages_below(12345)), 12345);
    assert_eq!("checksum,stats".parse::<Stack>().unwrap().pages_below(77), 77);
    let built = stack.build(ram(16 + 256)).unwrap();
    assert_eq!(built.store.info().name, "stats(pack(ram))");
    assert_eq!(built.store.info().pages, 16);
    let text: Vec<u8> = "the page of the donor ".bytes().cycle().take(8 * PAGE_SIZE).collect();
    built.store.write(&[WriteOp { page: 0, data: &text }]).unwrap();
    let line = built.reports[1]();
    assert!(line.starts_with("pack (Lz4): 8 pages written as 1 pages below"), "{line}");
}
