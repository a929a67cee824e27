//! Bad input over raw sockets. Each test asserts the error reply or the
//! closed connection, and runs a well-behaved client on the same export for
//! its whole length that must keep reading back exactly what it wrote.

mod nbd_common;

use memlend_server::nbd::{Export, NbdConfig};
use memlend_wire::nbd::*;
use nbd_common::*;
use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

const PAGES: u64 = 32768; // 128 MiB, sparse: larger than the 64 MiB request limit
const SIZE: u64 = PAGES * 4096;
/// The bystander's region: the upper half, unaligned.
const SAFE_AT: u64 = 12 << 20 | 123;
const SAFE_LEN: u32 = 10_000;
const EINVAL: u32 = Errno::Inval as u32;

/// Run `abuse` against a fresh server while a bystander works.
fn with_bystander(cfg: NbdConfig, abuse: impl FnOnce(&TestServer)) {
    let srv = TestServer::start(vec![Export::new("mem", ram(PAGES))], cfg);
    let bystander = Bystander::start(srv.port, SAFE_AT, SAFE_LEN);
    abuse(&srv);
    assert!(bystander.finish() > 0);
    // The server still takes new clients (once it has retired the
    // bystander's connection, which matters under a connection limit).
    std::thread::sleep(Duration::from_millis(50));
    let mut c = RawClient::connect(srv.port, "", false);
    assert_eq!(c.read(0, 512).map(|d| d.len()), Ok(512));
    c.disconnect();
}

fn default_bystander(abuse: impl FnOnce(&TestServer)) {
    with_bystander(NbdConfig::default(), abuse)
}

/// Greeting read, client flags sent: ready for options.
fn negotiating(port: u16) -> TcpStream {
    let mut s = connect_raw(port);
    s.write_all(&ClientFlags { fixed_newstyle: true, no_zeroes: true }.encode()).unwrap();
    s
}

#[test]
fn broken_handshakes_are_closed() {
    default_bystander(|srv| {
        let mut s = connect_raw(srv.port);
        s.write_all(&[0xde, 0xad, 0xbe, 0xef, 1, 2, 3]).unwrap();
        assert!(closes_soon(&mut s), "garbage client flags");
        let mut s = connect_raw(srv.port);
        s.write_all(&(1u32 << 5).to_be_bytes()).unwrap();
        assert!(closes_soon(&mut s), "unknown client flag");
        let mut s = connect_raw(srv.port);
        s.write_all(&[0, 0]).unwrap();
        shutdown_write(&s);
        assert!(closes_soon(&mut s), "truncated client flags");
        let mut s = negotiating(srv.port);
        s.write_all(b"IHAVEOPX\0\0\0\x07\0\0\0\0").unwrap();
        assert!(closes_soon(&mut s), "bad option magic");
        let mut s = negotiating(srv.port);
        s.write_all(&OptHeader { option: opt::GO, len: 100 }.encode()[..10]).unwrap();
        shutdown_write(&s);
        assert!(closes_soon(&mut s), "truncated option header");
        // Nothing at all after the greeting: just go away.
        drop(connect_raw(srv.port));
    });
}

#[test]
fn unknown_and_malformed_options_get_error_replies_and_the_session_goes_on() {
    default_bystander(|srv| {
        let mut s = negotiating(srv.port);
        for (option, data, want) in [
            (0xdead_beef, &b"xyz"[..], rep::ERR_UNSUP),
            (opt::STARTTLS, &[][..], rep::ERR_UNSUP),
            // Well formed, but without structured replies first.
            (opt::SET_META_CONTEXT, &[0, 0, 0, 0, 0, 0, 0, 0][..], rep::ERR_INVALID),
            (opt::LIST, &b"x"[..], rep::ERR_INVALID),
            (opt::STRUCTURED_REPLY, &b"x"[..], rep::ERR_INVALID),
            (opt::GO, &[0, 0, 0, 9, b'a'][..], rep::ERR_INVALID),
            (opt::INFO, &[0xff, 0xff, 0xff, 0xff, 0, 0][..], rep::ERR_INVALID),
        ] {
            send_option(&mut s, option, data);
            let (h, msg) = read_opt_reply(&mut s).unwrap();
            assert_eq!((h.option, h.reply), (option, want), "option {option:#x}");
            assert!(!msg.is_empty(), "error replies carry a message");
        }
        assert_eq!(go(&mut s, "nope"), Err(rep::ERR_UNKNOWN));
        let (size, flags) = go(&mut s, "mem").unwrap();
        assert_eq!(size, SIZE);
        assert_ne!(flags & tx_flags::CAN_MULTI_CONN, 0);
    });
}

#[test]
fn oversize_options_are_skipped_not_allocated() {
    default_bystander(|srv| {
        let mut s = negotiating(srv.port);
        send_option(&mut s, opt::GO, &vec![0u8; 1 << 20]);
        let (h, _) = read_opt_reply(&mut s).unwrap();
        assert_eq!(h.reply, rep::ERR_TOO_BIG);
        assert!(go(&mut s, "").is_ok(), "session did not survive the oversize option");
        // A header promising 4 GiB, then the client vanishes.
        let mut s = negotiating(srv.port);
        s.write_all(&OptHeader { option: opt::INFO, len: u32::MAX }.encode()).unwrap();
        s.write_all(&[0u8; 1000]).unwrap();
        shutdown_write(&s);
        assert!(closes_soon(&mut s));
        // OPT_EXPORT_NAME cannot be answered with an error: closed.
        let mut s = negotiating(srv.port);
        s.write_all(&OptHeader { option: opt::EXPORT_NAME, len: 1 << 20 }.encode()).unwrap();
        assert!(closes_soon(&mut s));
    });
}

#[test]
fn export_name_opens_known_exports_and_closes_on_unknown_ones() {
    default_bystander(|srv| {
        let mut s = negotiating(srv.port);
        send_option(&mut s, opt::EXPORT_NAME, b"nope");
        assert!(closes_soon(&mut s), "unknown export");
        for no_zeroes in [true, false] {
            let mut s = connect_raw(srv.port);
            s.write_all(&ClientFlags { fixed_newstyle: true, no_zeroes }.encode()).unwrap();
            send_option(&mut s, opt::EXPORT_NAME, b"mem");
            let padding = if no_zeroes { 0 } else { EXPORT_NAME_PADDING_LEN };
            let reply = read_exact_vec(&mut s, EXPORT_NAME_REPLY_LEN + padding).unwrap();
            let (size, flags) = decode_export_name_reply(&reply).unwrap();
            assert_eq!(size, SIZE);
            assert_eq!(flags & tx_flags::SEND_DF, 0, "DF without structured replies");
            let mut c = RawClient::from_parts(s, size, flags, false);
            assert_eq!(c.write(4096, b"hello"), 0);
            assert_eq!(c.read(4096, 5).unwrap(), b"hello");
        }
        // Non-fixed newstyle clients may only send OPT_EXPORT_NAME.
        let mut s = connect_raw(srv.port);
        s.write_all(&0u32.to_be_bytes()).unwrap();
        send_option(&mut s, opt::LIST, &[]);
        assert!(closes_soon(&mut s));
    });
}

/// Option data for a meta-context option: export name, query count, then
/// each query; lengths as given, so they may lie.
fn meta_data(name_len: u32, count: u32, queries: &[(u32, &[u8])]) -> Vec<u8> {
    let mut b = name_len.to_be_bytes().to_vec();
    b.extend(count.to_be_bytes());
    for (len, q) in queries {
        b.extend(len.to_be_bytes());
        b.extend_from_slice(q);
    }
    b
}

#[test]
fn meta_context_options_are_answered_and_malformed_ones_refused() {
    default_bystander(|srv| {
        let mut s = negotiating(srv.port);
        let list = opt::LIST_META_CONTEXT;
        let base = || Ok(vec![(0, BASE_ALLOCATION.to_string())]);
        // Listing needs no structured replies; its ids are the reserved 0.
        assert_eq!(meta_context(&mut s, list, "", &[]), base());
        assert_eq!(meta_context(&mut s, list, "mem", &["base:"]), base());
        assert_eq!(
            meta_context(&mut s, list, "mem", &["qemu:dirty-bitmap:a", BASE_ALLOCATION]),
            base()
        );
        assert_eq!(meta_context(&mut s, list, "mem", &["qemu:dirty-bitmap:a"]), Ok(vec![]));
        assert_eq!(meta_context(&mut s, list, "nope", &[]), Err(rep::ERR_UNKNOWN));
        // Selecting does need them.
        let set = opt::SET_META_CONTEXT;
        assert_eq!(meta_context(&mut s, set, "mem", &[BASE_ALLOCATION]), Err(rep::ERR_INVALID));
        // Malformed data, for both options: refused, and the session goes on.
        let too_many = META_QUERIES_MAX + 1;
        let empty_queries = vec![(0, &b""[..]); too_many as usize];
        let long_query = vec![b'q'; STRING_BYTES_MAX + 1];
        let mut trailing = meta_data(0, 1, &[(15, BASE_ALLOCATION.as_bytes())]);
        trailing.push(0);
        let malformed = [
            vec![],
            vec![0, 0, 0],
            vec![0, 0, 0, 9, b'a'],
            meta_data(0, u32::MAX, &[]),
            meta_data(0, too_many, &empty_queries),
            meta_data(0, 1, &[(50, b"base:")]),
            meta_data(0, 2, &[(5, b"base:")]),
            meta_data(0, 1, &[(long_query.len() as u32, &long_query)]),
            meta_data(u32::MAX, 0, &[]),
            trailing,
        ];
        for option in [list, set] {
            for data in &malformed {
                send_option(&mut s, option, data);
                let (h, msg) = read_opt_reply(&mut s).unwrap();
                assert_eq!(
                    (h.option, h.reply),
                    (option, rep::ERR_INVALID),
                    "{:?}",
                    &data[..16.min(data.len())]
                );
                assert!(!msg.is_empty(), "error replies carry a message");
            }
        }
        // With structured replies base:allocation is selected, however asked.
        send_option(&mut s, opt::STRUCTURED_REPLY, &[]);
        assert_eq!(read_opt_reply(&mut s).unwrap().0.reply, rep::ACK);
        let chosen = Ok(vec![(1, BASE_ALLOCATION.to_string())]);
        let queries = ["base:", "x-other:thing", BASE_ALLOCATION, BASE_ALLOCATION];
        assert_eq!(meta_context(&mut s, set, "mem", &queries), chosen);
        // A later SET replaces the selection, even one refused for its export.
        assert_eq!(meta_context(&mut s, set, "nope", &[BASE_ALLOCATION]), Err(rep::ERR_UNKNOWN));
        let (size, flags) = go(&mut s, "mem").unwrap();
        let mut c = RawClient::from_parts(s, size, flags, true);
        assert_eq!(c.call(Command::BlockStatus, 0, 0, 4096, &[]).error, EINVAL);
        assert_eq!(c.call(Command::BlockStatus, cmd_flags::REQ_ONE, 0, 4096, &[]).error, EINVAL);
        assert_eq!(c.read(0, 4).map(|d| d.len()), Ok(4), "the session goes on");
        c.disconnect();
        // A SET without queries selects nothing either.
        let mut s = negotiating(srv.port);
        send_option(&mut s, opt::STRUCTURED_REPLY, &[]);
        assert_eq!(read_opt_reply(&mut s).unwrap().0.reply, rep::ACK);
        assert_eq!(meta_context(&mut s, set, "", &[BASE_ALLOCATION]), chosen);
        assert_eq!(meta_context(&mut s, set, "", &[]), Ok(vec![]));
        let (size, flags) = go(&mut s, "").unwrap();
        let mut c = RawClient::from_parts(s, size, flags, true);
        assert_eq!(c.call(Command::BlockStatus, 0, 0, 4096, &[]).error, EINVAL);
        c.disconnect();
    });
}

#[test]
fn block_status_reports_written_ranges_bounded_and_checked() {
    default_bystander(|srv| {
        let mut c = RawClient::with_block_status(srv.port, "mem");
        let mib = 1u32 << 20;
        let kib_64 = 64u32 << 10;
        assert_eq!(c.write(mib as u64, &pattern(3, kib_64 as usize)), 0);
        let hole = state::HOLE | state::ZERO;
        let ext = |len_bytes, flags| Extent { len_bytes, flags };
        // Below the bystander's region (12 MiB), which it may not have written yet.
        let map = c.block_status(0, 0, 8 * mib);
        assert_eq!(map, Ok(vec![ext(mib, hole), ext(kib_64, 0), ext(7 * mib - kib_64, hole)]));
        // REQ_ONE: exactly one extent, never past the request.
        assert_eq!(c.block_status(cmd_flags::REQ_ONE, 0, 8 * mib), Ok(vec![ext(mib, hole)]));
        let mid_data = mib as u64 + 100;
        assert_eq!(
            c.block_status(cmd_flags::REQ_ONE, mid_data, mib),
            Ok(vec![ext(kib_64 - 100, 0)])
        );
        assert_eq!(c.block_status(cmd_flags::REQ_ONE, mid_data, 10), Ok(vec![ext(10, 0)]));
        assert_eq!(c.block_status(cmd_flags::FUA, 0, 100), Ok(vec![ext(100, hole)]));
        // Past the end, or nothing at all: EINVAL, as for reads; DF is a READ flag.
        assert_eq!(c.block_status(0, SIZE - 4096, 8192), Err(EINVAL));
        assert_eq!(c.block_status(0, u64::MAX - 10, 100), Err(EINVAL));
        assert_eq!(c.block_status(0, SIZE, 1), Err(EINVAL));
        assert_eq!(c.block_status(0, 0, 0), Err(EINVAL));
        assert_eq!(c.block_status(cmd_flags::DF, 0, 4096), Err(EINVAL));
        // Every other page written, 4100 times over, from 64 MiB: one
        // reply stops at its extent limit and covers less than asked.
        let at = 64u64 << 20;
        let page = pattern(4, 4096);
        // In batches, so that unread replies never fill the socket buffers.
        for batch in (0..4100u64).collect::<Vec<_>>().chunks(256) {
            for &i in batch {
                c.send(Request::new(Command::Write, 1000 + i, at + 2 * 4096 * i, 4096), &page);
            }
            for _ in batch {
                assert_eq!(c.recv(0).unwrap().error, 0);
            }
        }
        let many = c.block_status(0, at, 32 * mib).unwrap();
        assert_eq!(many.len(), 4096);
        for (i, e) in many.iter().enumerate() {
            assert_eq!(*e, ext(4096, if i % 2 == 0 { 0 } else { hole }), "extent {i}");
        }
        assert_eq!(c.block_status(cmd_flags::REQ_ONE, at, 32 * mib), Ok(vec![ext(4096, 0)]));
        assert!(c.read(at, 4096).unwrap() == page, "the session goes on");
        c.disconnect();
    });
}

#[test]
fn option_floods_and_aborts_end_the_session() {
    default_bystander(|srv| {
        let mut s = negotiating(srv.port);
        let mut acks = 0;
        for _ in 0..300 {
            send_option(&mut s, opt::STRUCTURED_REPLY, &[]);
            match read_opt_reply(&mut s) {
                Ok((h, _)) if h.reply == rep::ACK => acks += 1,
                _ => break,
            }
        }
        assert_eq!(acks, NbdConfig::default().options_per_handshake_max);
        assert!(closes_soon(&mut s));
        let mut s = negotiating(srv.port);
        send_option(&mut s, opt::ABORT, &[]);
        assert_eq!(read_opt_reply(&mut s).unwrap().0.reply, rep::ACK);
        assert!(closes_soon(&mut s));
    });
}

#[test]
fn a_stalled_handshake_times_out() {
    let cfg = NbdConfig { handshake_timeout_ms: 300, ..Default::default() };
    with_bystander(cfg, |srv| {
        let started = Instant::now();
        let mut s = negotiating(srv.port);
        s.write_all(&OptHeader { option: opt::GO, len: 100 }.encode()).unwrap();
        assert!(closes_soon(&mut s));
        assert!(started.elapsed() < Duration::from_secs(3));
    });
}

#[test]
fn bad_commands_get_einval_and_the_connection_goes_on() {
    default_bystander(|srv| {
        for structured in [false, true] {
            let mut c = RawClient::connect(srv.port, "", structured);
            assert_eq!(c.call(Command::Write, 0, 0, 4, b"keep").error, 0);
            let unknown = Request { kind: 99, ..Request::new(Command::Read, 7, 0, 4096) };
            c.send(unknown, &[]);
            assert_eq!(c.recv(0).unwrap(), Reply { cookie: 7, error: EINVAL, data: vec![] });
            assert_eq!(c.call(Command::BlockStatus, 0, 0, 4096, &[]).error, EINVAL);
            // Flags that do not belong to the command; the payload is consumed.
            assert_eq!(c.call(Command::Write, cmd_flags::DF, 0, 4, b"oops").error, EINVAL);
            assert_eq!(c.call(Command::Read, 1 << 15, 0, 4, &[]).error, EINVAL);
            assert_eq!(c.call(Command::Flush, cmd_flags::NO_HOLE, 0, 0, &[]).error, EINVAL);
            let fast_no_hole = cmd_flags::FAST_ZERO | cmd_flags::NO_HOLE;
            assert_eq!(
                c.call(Command::WriteZeroes, fast_no_hole, 0, 4, &[]).error,
                Errno::NotSup as u32
            );
            assert_eq!(c.read(0, 4).unwrap(), b"keep", "a refused request changed data");
            c.disconnect();
        }
    });
}

#[test]
fn requests_past_the_end_touch_nothing() {
    default_bystander(|srv| {
        for structured in [false, true] {
            let mut c = RawClient::connect(srv.port, "", structured);
            let tail = pattern(9, 4096);
            assert_eq!(c.write(SIZE - 4096, &tail), 0);
            let nospc = Errno::NoSpc as u32;
            assert_eq!(c.read(SIZE - 100, 101), Err(EINVAL));
            assert_eq!(c.read(u64::MAX - 10, 100), Err(EINVAL));
            assert_eq!(c.write(SIZE - 100, &[1u8; 101]), nospc);
            assert_eq!(c.write(u64::MAX - 10, &[1u8; 100]), nospc);
            assert_eq!(c.call(Command::Trim, 0, SIZE - 4096, 8192, &[]).error, EINVAL);
            assert_eq!(c.call(Command::WriteZeroes, 0, SIZE - 4096, 8192, &[]).error, nospc);
            assert_eq!(c.call(Command::Cache, 0, SIZE, 1, &[]).error, EINVAL);
            assert_eq!(c.read(SIZE, 0).map(|d| d.len()), Ok(0), "empty read at the end is fine");
            assert!(c.read(SIZE - 4096, 4096).unwrap() == tail, "a refused request changed data");
            c.disconnect();
        }
    });
}

#[test]
fn oversize_reads_and_writes_are_refused_without_allocating() {
    default_bystander(|srv| {
        let max = NbdConfig::default().request_bytes_max;
        let mut c = RawClient::connect(srv.port, "", true);
        assert_eq!(c.read(0, max + 1), Err(EINVAL));
        assert_eq!(
            c.call(Command::Read, cmd_flags::DF, 0, max + 1, &[]).error,
            Errno::Overflow as u32
        );
        // Over the maximum but skippable: the payload is read and dropped.
        let big = vec![0x5a; max as usize + 4096];
        assert_eq!(c.write(0, &big), EINVAL);
        assert_eq!(c.read(0, 4096).unwrap(), vec![0; 4096], "refused write landed");
        // Far over: answered, then closed without reading 4 GiB.
        c.send(Request::new(Command::Write, 77, 0, 0xffff_fff0), &[0u8; 64]);
        assert_eq!(c.recv(0).unwrap(), Reply { cookie: 77, error: EINVAL, data: vec![] });
        assert!(closes_soon(&mut c.s));
        assert!(srv.store_bytes(0, 0, 4096).iter().all(|&b| b == 0));
    });
}

/// A client that never asked for block sizes may send 48 MiB at once (the
/// kernel's nbd and older qemu do not ask); it must work as 4 KiB would.
#[test]
fn a_48_mib_write_reads_back_byte_for_byte() {
    default_bystander(|srv| {
        let mut c = RawClient::connect(srv.port, "", true);
        // Past the bystander's bytes (at 12 MiB), within the 128 MiB export.
        let at = 64 << 20;
        let data = pattern(48, 48 << 20);
        assert_eq!(c.write(at, &data), 0);
        let back = c.read(at, 48 << 20).unwrap();
        assert!(back == data, "48 MiB read back differs");
        assert!(srv.store_bytes(0, at + (47 << 20), 4096) == data[47 << 20..(47 << 20) + 4096]);
        c.disconnect();
    });
}

#[test]
fn read_only_exports_refuse_every_write() {
    let ro = Export::new("ro", ram(256)).read_only(true);
    let srv = TestServer::start(vec![Export::new("mem", ram(PAGES)), ro], NbdConfig::default());
    let bystander = Bystander::start(srv.port, SAFE_AT, SAFE_LEN);
    let mut c = RawClient::connect(srv.port, "ro", true);
    assert_ne!(c.flags & tx_flags::READ_ONLY, 0);
    let eperm = Errno::Perm as u32;
    assert_eq!(c.write(0, &[1u8; 4096]), eperm);
    assert_eq!(c.call(Command::Trim, 0, 0, 4096, &[]).error, eperm);
    assert_eq!(c.call(Command::WriteZeroes, 0, 0, 4096, &[]).error, eperm);
    assert_eq!(c.call(Command::Flush, 0, 0, 0, &[]).error, 0);
    assert_eq!(c.read(0, 4096).unwrap(), vec![0; 4096]);
    c.disconnect();
    assert!(bystander.finish() > 0);
}

#[test]
fn truncated_frames_and_vanishing_clients_change_nothing() {
    default_bystander(|srv| {
        let mut c = RawClient::connect(srv.port, "", false);
        c.s.write_all(&Request::new(Command::Read, 1, 0, 4096).encode()[..13]).unwrap();
        shutdown_write(&c.s);
        assert!(closes_soon(&mut c.s), "half a header");
        // A WRITE whose payload never finishes: nothing is written.
        let mut c = RawClient::connect(srv.port, "", true);
        c.s.write_all(&Request::new(Command::Write, 2, 8192, 8192).encode()).unwrap();
        c.s.write_all(&[0xee; 5000]).unwrap();
        shutdown_write(&c.s);
        assert!(closes_soon(&mut c.s), "half a payload");
        assert!(srv.store_bytes(0, 8192, 8192).iter().all(|&b| b == 0), "a partial write landed");
        // Many reads in flight, then the client disappears without reading.
        let mut c = RawClient::connect(srv.port, "", true);
        let mut wire = Vec::new();
        for i in 0..200 {
            wire.extend(Request::new(Command::Read, i, 0, 1 << 20).encode());
        }
        c.s.write_all(&wire).unwrap();
        drop(c);
        // A bad magic in the middle of transmission closes the stream.
        let mut c = RawClient::connect(srv.port, "", false);
        c.s.write_all(&[0x25, 0x60, 0x95, 0x14, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).unwrap();
        c.s.write_all(&[0u8; 14]).unwrap();
        assert!(closes_soon(&mut c.s), "bad request magic");
    });
}

/// Random requests (valid magic, random everything else) and random bytes,
/// each on a fresh connection. Mutating requests aim below the bystander.
#[test]
fn random_requests_and_bytes_never_hurt_the_server() {
    default_bystander(|srv| {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for round in 0..60 {
            let mut c = RawClient::connect(srv.port, "", round % 2 == 0);
            let mut wire = Vec::new();
            for _ in 0..(1 + next() % 4) {
                let kind = (next() % 10) as u16;
                let len = [0, 1, 4096, 70_000, u32::MAX, (next() % 200_000) as u32]
                    [(next() % 6) as usize];
                let offset = [0, next() % (8 << 20), SIZE, u64::MAX - 3][(next() % 4) as usize];
                let flags = [0, 1, (next() & 0xffff) as u16][(next() % 3) as usize];
                wire.extend(Request { flags, kind, cookie: next(), offset, len }.encode());
                if kind == Command::Write as u16 && len < 100_000 {
                    wire.extend(pattern(next(), len as usize));
                }
            }
            let noise = pattern(next(), (next() % 300) as usize);
            wire.extend(&noise);
            c.s.write_all(&wire).unwrap();
            shutdown_write(&c.s);
            assert!(closes_soon(&mut c.s), "round {round}: the connection did not end");
        }
        // Pure noise after the greeting.
        for round in 0..40 {
            let mut s = connect_raw(srv.port);
            let _ = s.write_all(&pattern(round + 1, (round * 37 % 500) as usize));
            shutdown_write(&s);
            assert!(closes_soon(&mut s));
        }
    });
}

#[test]
fn connections_over_the_limit_are_refused_and_others_keep_working() {
    let cfg = NbdConfig { connections_max: 2, ..Default::default() };
    with_bystander(cfg, |srv| {
        let first = RawClient::connect(srv.port, "", false);
        let mut third = TcpStream::connect(("127.0.0.1", srv.port)).unwrap();
        assert!(closes_soon(&mut third), "a connection over the limit was served");
        first.disconnect();
        // A slot is free again once the server has seen the disconnect.
        std::thread::sleep(Duration::from_millis(200));
    });
}
