//! An in-process donor on an ephemeral loopback port, for the tests.
#![allow(dead_code)]

use memlend_server::lifecycle::Shutdown;
use memlend_server::page::{PageServer, PageServerConfig, Registry, SlabFactory};
use memlend_store::ram::{RamOptions, RamStore};
use memlend_store::PageStore;
use memlend_wire::page::Key;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

pub struct Donor {
    pub addr: SocketAddr,
    pub server: Arc<PageServer>,
    shutdown: Shutdown,
    thread: Option<JoinHandle<()>>,
}

impl Donor {
    pub fn start(lend_pages: u64, key: Option<Key>) -> Donor {
        Self::start_with(lend_pages, PageServerConfig { key, ..PageServerConfig::default() })
    }

    pub fn start_with(lend_pages: u64, cfg: PageServerConfig) -> Donor {
        let _ = tracing_subscriber::fmt().with_test_writer().try_init();
        let factory: SlabFactory = Arc::new(|pages| {
            let s: Arc<dyn PageStore> = Arc::new(RamStore::new(pages, RamOptions::default())?);
            Ok(s)
        });
        let server = PageServer::new(cfg, Registry::new(lend_pages, factory));
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = Shutdown::new();
        let thread = {
            let (server, shutdown) = (Arc::clone(&server), shutdown.clone());
            thread::spawn(move || server.serve(listener, shutdown).unwrap())
        };
        Donor { addr, server, shutdown, thread: Some(thread) }
    }
}

impl Drop for Donor {
    fn drop(&mut self) {
        self.shutdown.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A TCP proxy whose connections can be cut, to test reconnects.
pub struct Proxy {
    pub addr: SocketAddr,
    live: Arc<Mutex<Vec<TcpStream>>>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    pub fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        let live = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (l2, s2) = (Arc::clone(&live), Arc::clone(&stop));
        thread::spawn(move || {
            while !s2.load(Ordering::Relaxed) {
                let Ok((client, _)) = listener.accept() else {
                    thread::sleep(Duration::from_millis(5));
                    continue;
                };
                client.set_nonblocking(false).unwrap();
                let server = TcpStream::connect(target).unwrap();
                l2.lock()
                    .unwrap()
                    .extend([client.try_clone().unwrap(), server.try_clone().unwrap()]);
                pipe(client.try_clone().unwrap(), server.try_clone().unwrap());
                pipe(server, client);
            }
        });
        Proxy { addr, live, stop }
    }

    /// Cut every connection through the proxy, as a network failure would.
    pub fn cut(&self) {
        for s in self.live.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.cut();
    }
}

fn pipe(mut from: TcpStream, mut to: TcpStream) {
    thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Both);
    });
}

/// A page's worth of bytes that identify (seed, page).
pub fn page_pattern(seed: u8, page: u64) -> Vec<u8> {
    (0..4096u64)
        .map(|i| (i.wrapping_mul(31) ^ page.wrapping_mul(7919) ^ seed as u64) as u8)
        .collect()
}
