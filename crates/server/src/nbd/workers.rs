//! The worker pool for slow stores (a file with O_DIRECT, a remote store):
//! a few threads per connection take requests from a bounded queue and each
//! writes its own reply when done, so replies leave out of order and a read
//! overtakes a slow FLUSH.

use super::config::NbdConfig;
use super::error::ConnError;
use super::session::{Op, Session};
use super::transmission::{run, Dispatch, End};
use super::wire::Wire;
use crate::out_buf::OutBuf;
use parking_lot::Mutex;
use std::io;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::thread;
use std::time::Duration;

struct Job {
    cookie: u64,
    op: Op,
    payload: Vec<u8>,
}

/// One writer at a time on the socket, so replies never interleave.
struct Replies<'a, W: Wire> {
    stream: &'a W,
    write_lock: Mutex<()>,
}

impl<W: Wire> Replies<'_, W> {
    fn send(&self, bytes: &[u8]) -> io::Result<()> {
        let _guard = self.write_lock.lock();
        self.stream.write_all_bytes(bytes)
    }
}

struct Pooled<'a, W: Wire> {
    jobs: SyncSender<Job>,
    replies: &'a Replies<'a, W>,
}

impl<W: Wire> Dispatch for Pooled<'_, W> {
    fn dispatch(
        &mut self,
        cookie: u64,
        op: Op,
        payload: &[u8],
        _out: &mut OutBuf,
    ) -> Result<(), ConnError> {
        let job = Job { cookie, op, payload: payload.to_vec() };
        // Blocks while the queue is full: the client is then not read from.
        self.jobs
            .send(job)
            .map_err(|_| io::Error::other("every worker of this connection has stopped"))?;
        Ok(())
    }

    fn send(&mut self, out: &[u8]) -> io::Result<()> {
        self.replies.send(out)
    }
}

/// Serve requests through `cfg.workers_per_connection` threads. Returns
/// once every queued request has been answered (or the socket failed).
pub(crate) fn serve_pooled<W: Wire>(
    stream: &W,
    s: &Session,
    cfg: &NbdConfig,
) -> Result<End, ConnError> {
    let replies = Replies { stream, write_lock: Mutex::new(()) };
    let (jobs, queue) = sync_channel::<Job>(cfg.inflight_requests_max);
    let queue = Mutex::new(queue);
    thread::scope(|scope| {
        for _ in 0..cfg.workers_per_connection {
            scope.spawn(|| work(s, cfg, &queue, &replies));
        }
        // `Pooled` owns the only sender: when `run` returns it is dropped,
        // the workers drain the queue and stop, and the scope joins them.
        // No spinning: a slow store's requests take far longer than a wakeup.
        run(stream, s, cfg, Duration::ZERO, &mut Pooled { jobs, replies: &replies })
    })
}

fn work<W: Wire>(s: &Session, cfg: &NbdConfig, queue: &Mutex<Receiver<Job>>, replies: &Replies<W>) {
    let mut out = OutBuf::new(cfg.reply_batch_bytes_max);
    // Ends when the reader drops the sender and the queue is empty. The
    // lock is released before the job runs (`let`, not `while let`).
    loop {
        let Ok(job) = queue.lock().recv() else { return };
        s.execute(job.cookie, job.op, &job.payload, &mut out);
        let sent = replies.send(out.as_slice());
        out.clear();
        if let Err(e) = sent {
            tracing::warn!(peer = %s.peer, error = %e, "nbd reply failed; closing connection");
            replies.stream.shutdown_both();
            return;
        }
    }
}
