// SPDX-License-Identifier: GPL-2.0

//! An established iWARP connection: the data path of one QP over one TCP
//! socket, and its teardown.
//!
//! Driver logic: the only `unsafe` is the access to consumer memory through
//! `kmem` after the address was resolved through a registered region, and
//! the QP back-pointer (see [`QpPtr`]).
//!
//! # Threading
//!
//! - Receive runs in the socket's data-ready callback (softirq, socket lock
//!   held by the stack): the protocol core parses the bytes straight from
//!   the skbs and the payload is copied once, from the skb into the target
//!   memory. The receive state has its own lock, only ever contended by
//!   teardown.
//! - Transmit runs in a work item, at most one per connection at a time
//!   (`tx_busy`/`tx_again`). It sends with `MSG_DONTWAIT` and, when the
//!   socket is full, asks for a write-space callback, which re-queues it.
//!   Nothing busy-waits and no queue is unbounded: the send queue is the
//!   QP's fixed ring.
//! - A zero-copy send's release ([`ZcTrack::released`]) comes from the
//!   network stack, in softirq (an acknowledgement) or in a socket call's
//!   process context; it takes no lock of its own and completes work
//!   requests through the QP's lock, as a Read Response's arrival does.
//! - Teardown ([`Conn::close`]) is idempotent; its work item detaches the
//!   socket callbacks (after which no callback can run), sends a pending
//!   TERMINATE, closes the socket, moves the QP to ERROR (flushing it),
//!   tells the connection manager (CLOSE) and unlinks itself from the QP,
//!   which `destroy_qp` waits for.

use crate::{
    crc::Crc32c,
    device::SiwRs,
    iw::{CmEvent, CmEventKind, CmId},
    iwarp::{
        mpa::{Negotiated, Rtr, RES_LARGE_FPDUS},
        rdmap::{AtomicOp, AtomicRequest, AtomicResponse, Extensions, ImmediateData, Opcode},
        rx::{FixedPayload, Placement, Polled, Receiver, RxConfig, RxError, RxEvent, SegmentDone, SegmentHeader, Target},
        terminate::{RemoteProtectionCode, TaggedCode, TermCode, TerminateRepr},
        tx::{Batch, Chunk, Message, MessageTx, PayloadSource, PlanStatus, Transmitter, TxConfig, TxError},
    },
    kmem,
    mem::{self, AccessError, Mem},
    settings::Knobs,
    net::{self, Attached, SockHandler, SockRef, Socket, ZcPart},
    qp::{self, AtomicJob, Inbound, Job, ReadJob, RecvKind, RecvWqe, SendWqe, WqeOp},
    verbs::{Access, AsyncEvent, Qp, Sge, WcStatus},
    zcopy::Note,
};
use core::{
    ptr::NonNull,
    sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
};
use kernel::{
    new_mutex,
    prelude::*,
    sync::{Arc, ArcBorrow, Mutex},
    time::Ktime,
    workqueue,
};

/// Pieces and scratch octets of one transmit batch.
const BATCH_PIECES: usize = 64;
const BATCH_SCRATCH: usize = 2048;
type TxBatch = Batch<BATCH_PIECES, BATCH_SCRATCH>;

/// A pointer to the connection's QP.
///
/// # Invariants
///
/// The QP outlives the connection's use of it: `destroy_qp` closes the
/// connection and waits until it has unlinked itself from the QP (the last
/// thing its teardown does). Before that, the teardown detached the socket
/// callbacks and took the transmitter for good (`tx_busy`), so no callback
/// or work item of the connection uses the QP after it.
#[derive(Clone, Copy)]
pub(crate) struct QpPtr(NonNull<Qp<SiwRs>>);

// SAFETY: the QP is `Sync`; see the invariants for its lifetime.
unsafe impl Send for QpPtr {}
// SAFETY: as above.
unsafe impl Sync for QpPtr {}

impl QpPtr {
    pub(crate) fn new(qp: &Qp<SiwRs>) -> Self {
        QpPtr(NonNull::from(qp))
    }

    pub(crate) fn qp(&self) -> &Qp<SiwRs> {
        // SAFETY: by the type invariants.
        unsafe { self.0.as_ref() }
    }
}

/// Receive state of the message in progress.
struct Rx {
    receiver: KBox<Receiver<Crc32c>>,
    /// The receive WQE of the next Send or Immediate Data message, taken
    /// when the protocol core asked for its length ([`qp::claim_recv`]).
    /// It stays here until the message completes: a WQE is about 160
    /// octets, and each move of one is a call to memcpy.
    recv: Option<RecvWqe>,
    /// `recv`'s regions, once a message's header took it: `Some` while the
    /// message is being received into it. The core asks for a receive
    /// only at a message's first segment, after the message before it on
    /// the queue completed, so it never asks while this is `Some`.
    filling: Option<[Option<Arc<Mem>>; qp::NSGE]>,
    /// The teardown has flushed `recv`: nothing more is received.
    ended: bool,
    /// The tagged segment in progress (none for a zero-length one).
    tagged: Option<TaggedSeg>,
    /// A validated inbound Read or Atomic Request awaiting its segment's
    /// CRC.
    inbound: Option<Inbound>,
    /// Length of the last RDMA Write received: the byte count of the
    /// receive an Immediate Data message after it completes.
    write_len: u32,
    /// Octets of the Read Response in progress received so far: its next
    /// segment must start there in the Read's sink.
    resp_off: u32,
    /// The peer sent a TERMINATE: the connection closes without one.
    peer_terminated: bool,
    /// Its code, if it parsed.
    peer_code: Option<TermCode>,
}

impl Rx {
    /// Empties `recv` and `filling`: the WQE's `wr_id`, to complete it
    /// with (the WQE is not moved).
    fn take_recv(&mut self) -> Option<u64> {
        self.filling = None;
        let wr_id = self.recv.as_ref().map(|w| w.wr_id);
        self.recv = None;
        wr_id
    }

    /// Ends the message that filled `recv`: [`Rx::take_recv`], if one was
    /// filling.
    fn take_filled(&mut self) -> Option<u64> {
        self.filling.as_ref()?;
        self.take_recv()
    }
}

/// A tagged segment being received: the region its STag named, looked up
/// at its header, and what it may touch, checked as each piece is placed
/// (one hold of the region's lock per piece, and an invalidation between
/// pieces is seen).
///
/// The region stays here from one segment to the next until the message's
/// last segment is done: a following segment through the same STag uses
/// it without a lookup (a peer that sends a 64 KiB Write as 45 MSS-sized
/// segments, as upstream siw does, costs one lookup, not 45). Each segment
/// is still checked in full; a region deregistered in between fails that
/// check (`Invalidated`, the same TERMINATE as a failed lookup), also when
/// a new region has taken its STag since.
///
/// A small segment (up to [`SMALL_TAGGED`] octets) holds no region: each
/// of its pieces finds it in the table and is placed under the table's
/// lock ([`mem::with`]), which saves taking and dropping a reference (two
/// atomics, each about what the lock costs) on the way of a small Write to
/// the peer's memory. Its STag is not found at its header then but at its
/// first piece, which reports the same error for the same segment.
struct TaggedSeg {
    mem: Option<Arc<Mem>>,
    stag: u32,
    /// The segment's first byte and length.
    to: u64,
    len: u32,
    rights: u32,
}

/// Transmit state.
struct Tx {
    transmitter: Transmitter,
    batch: KBox<TxBatch>,
    /// The message in progress. A batch only ever holds FPDUs of this one
    /// message, so its payload pieces resolve through `segs`.
    cur: Option<Cur>,
    /// The payload of `cur`, empty without one. Kept here rather than in
    /// `cur` and refilled in place for each message: these few hundred
    /// octets would otherwise be built and moved several times per
    /// message, which shows in small-message latency.
    segs: Segs,
    /// Where small batches are gathered into one piece for the socket:
    /// one batch, sent as it is complete, on a process's doorbell; as many
    /// as fit, sent when no more work is queued, in a worker (see
    /// [`Conn::tx_run`]).
    stage: KBox<[u8; STAGE]>,
    /// Octets in `stage`, and how many of them the socket took.
    staged: usize,
    stage_sent: usize,
    crc: Crc32c,
    /// Request Identifier of the next Atomic Request.
    atomic_id: u32,
    /// Number of the next zero-copy send ([`ZcTrack`]), below
    /// [`RESPONSE_SEQ`].
    zc_seq: u64,
    /// The inline data of the WQE in `cur` (copied from its send queue
    /// slot when it is taken; rewritten only when the next WQE is taken,
    /// which waits until `cur` is done).
    inline: KBox<crate::uwqe::Inline>,
    /// The copy of a ring entry the transmitter takes ([`qp::next_job`]).
    sqe: KBox<qp::SqeCopy>,
}

impl Tx {
    /// The buffers [`qp::next_job`] takes a WQE into.
    fn take_bufs(&mut self) -> qp::TakeBufs<'_> {
        qp::TakeBufs { inline: &mut self.inline, sqe: &mut self.sqe }
    }
}

/// The message being transmitted.
struct Cur {
    msg: MessageTx,
    /// The WQE it carries out (`None` for a response, and for a Read or
    /// Atomic Request, already awaiting its response in the QP).
    wqe: Option<SendWqe>,
    /// Every FPDU is planned: the WQE completes once the batch is sent.
    planned: bool,
    /// A second message of the same WQE, started once the first is sent
    /// (the Immediate Data message after an RDMA Write with Immediate).
    then: Option<Message>,
    /// A zero-copy send ([`Conn::zcopy_note`]): its notification and
    /// number. The WQE completes when the stack releases the pages.
    zc: Option<(Note, u64)>,
}

/// Smallest payload sent by reference. Below it a copy costs less than
/// the notification and the page references, and the completion would
/// wait for the peer's acknowledgement (a round trip) rather than for the
/// socket to take the message.
const ZCOPY_MIN: u32 = 16 * 1024;

/// A connection's side of its zero-copy sends' notifications
/// ([`crate::zcopy`]): the notes hold it, and it links them to the QP
/// until the teardown cuts the link ([`ZcTrack::close`]), before the QP
/// may be destroyed. A release after that completes nothing: the
/// teardown flushed the WQE.
pub(crate) struct ZcTrack {
    qp: QpPtr,
    /// [`ZC_CLOSED`] once the link is cut, plus the number of releases
    /// using the QP. Not a lock: a release completes work requests, and no
    /// lock is held while a consumer's completion handler runs.
    users: AtomicU32,
    /// The device's settings and its count of zero-copy sends.
    knobs: Arc<Knobs>,
}

/// How long a teardown waits for zero-copy sends' releases, in ms.
const ZC_TEARDOWN_WAIT_MS: u32 = 1000;

/// The number of a Read Response's note: no work request completes with
/// it. Sends are numbered below it.
const RESPONSE_SEQ: u64 = u64::MAX;

/// [`ZcTrack::users`]: the link is cut.
const ZC_CLOSED: u32 = 1 << 31;

impl ZcTrack {
    /// The network stack released the pages of send `seq` (softirq or
    /// process context).
    pub(crate) fn released(&self, seq: u64) {
        if seq == RESPONSE_SEQ {
            return;
        }
        let mut u = self.users.load(Ordering::Acquire);
        loop {
            if u & ZC_CLOSED != 0 {
                return;
            }
            match self.users.compare_exchange_weak(u, u + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(now) => u = now,
            }
        }
        let restart = qp::released(self.qp.qp(), seq);
        self.users.fetch_sub(1, Ordering::Release);
        if let Some(c) = restart {
            c.kick();
        }
    }

    /// No release touches the QP from now on: cuts the link and waits
    /// for the releases using it (process context).
    fn close(&self) {
        self.users.fetch_or(ZC_CLOSED, Ordering::AcqRel);
        while self.users.load(Ordering::Acquire) & !ZC_CLOSED != 0 {
            crate::wq::sleep_us(100);
        }
    }
}

/// Ranges a message's payload keeps without allocating: a send of up to six
/// SGEs in contiguous memory, or about 56 KiB in 4 KiB pages of one region.
const FEW_RANGES: usize = 16;

/// Kernel virtual address ranges of a message's payload, in order, and the
/// regions they lie in. A message is resolved on the hot path of every
/// send, so the common case allocates nothing: the first ranges live in an
/// array, and only a payload of more pieces continues in a vector.
struct Segs {
    few: [(u64, usize); FEW_RANGES],
    nfew: usize,
    /// The ranges after `few`, once it is full (empty vectors do not
    /// allocate).
    more: KVec<(u64, usize)>,
    /// Held until the message is sent: a process may deregister a region
    /// (or die) while its send is in flight, and a user region's pages stay
    /// pinned as long as it is referenced. One per SGE at most.
    held: [Option<Arc<Mem>>; qp::NSGE],
}

impl Segs {
    /// No payload.
    fn empty() -> Self {
        Segs { few: [(0, 0); FEW_RANGES], nfew: 0, more: KVec::new(), held: Default::default() }
    }

    /// Back to no payload, releasing the regions held (the ranges beyond
    /// `nfew` are never read, so they are not cleared).
    fn clear(&mut self) {
        self.nfew = 0;
        if !self.more.is_empty() {
            self.more = KVec::new();
        }
        for h in self.held.iter_mut().filter(|h| h.is_some()) {
            *h = None;
        }
    }

    /// A process's inline data, in the transmitter's buffer (copied out of
    /// its ring at post time), added to an empty payload.
    fn set_inline(&mut self, buf: &[u8]) {
        if let (false, Some(r)) = (buf.is_empty(), self.few.first_mut()) {
            *r = (buf.as_ptr() as usize as u64, buf.len());
            self.nfew = 1;
        }
    }

    /// Appends `len` bytes at `addr` in `m` (already checked).
    fn add(&mut self, m: Arc<Mem>, addr: u64, len: u64) -> core::result::Result<(), AccessError> {
        let slot = self.held.iter_mut().find(|h| h.is_none()).ok_or(AccessError::Bounds)?;
        if self.more.is_empty() {
            let mark = self.nfew;
            let (few, nfew) = (&mut self.few, &mut self.nfew);
            let mut fits = true;
            m.translate(addr, len, |kva, n| match few.get_mut(*nfew) {
                Some(r) if fits => {
                    *r = (kva, n);
                    *nfew += 1;
                }
                _ => fits = false,
            })?;
            if fits {
                *slot = Some(m);
                return Ok(());
            }
            // More pieces than the array holds: this region's ranges go to
            // the vector instead, after the earlier ones.
            self.nfew = mark;
        }
        push_ranges(&mut self.more, &m, addr, len)?;
        *slot = Some(m);
        Ok(())
    }

    /// Whether the payload lies in registered regions (not in the
    /// transmitter's inline buffer, which is reused at the next WQE).
    fn in_regions(&self) -> bool {
        self.held.iter().any(Option::is_some)
    }

    /// Whether the payload lies in regions, all of them a process's.
    fn all_user(&self) -> bool {
        let mut held = self.held.iter().flatten().peekable();
        held.peek().is_some() && held.all(|m| m.is_user())
    }

    /// The ranges in order.
    fn ranges(&self) -> impl Iterator<Item = &(u64, usize)> {
        Iterator::chain(self.few.get(..self.nfew).unwrap_or(&[]).iter(), self.more.iter())
    }

    /// Calls `f` with the slices covering `offset..offset + len`.
    fn for_range<'a>(&'a self, offset: u32, len: u32, mut f: impl FnMut(&'a [u8])) -> bool {
        let mut skip = offset as usize;
        let mut left = len as usize;
        for &(kva, n) in self.ranges() {
            if left == 0 {
                break;
            }
            if skip >= n {
                skip -= n;
                continue;
            }
            let take = (n - skip).min(left);
            // SAFETY: every range was resolved through a registered region
            // that `self` holds: a process's region keeps its pages pinned
            // while referenced; a kernel consumer keeps its memory valid
            // until the work request completes (the verbs contract). Inline
            // data lives in the transmitter's buffer, which is rewritten
            // only when the next WQE is taken, after this message is sent.
            f(unsafe { kmem::slice(kva + skip as u64, take) });
            left -= take;
            skip = 0;
        }
        left == 0
    }
}

impl PayloadSource for Segs {
    fn update_crc(
        &mut self,
        offset: u32,
        len: u32,
        crc: &mut dyn crate::iwarp::crc32c::CrcEngine,
    ) -> core::result::Result<(), TxError> {
        if self.for_range(offset, len, |s| crc.update(s)) {
            Ok(())
        } else {
            Err(TxError::PayloadUnavailable { offset, len })
        }
    }
}

/// Calls `f` with the pending octets of `batch` as slices, in wire order
/// (payload pieces through `segs`), and whether each is payload (else
/// framing octets), until it returns false. Returns whether every payload
/// piece it reached resolved.
fn pending_slices<'a>(batch: &'a TxBatch, segs: &'a Segs, mut f: impl FnMut(&'a [u8], bool) -> bool) -> bool {
    let mut resolved = true;
    for chunk in batch.chunks() {
        let more = match chunk {
            Chunk::Bytes(b) => f(b, false),
            Chunk::Payload { offset, len, .. } => {
                let mut more = true;
                resolved &= segs.for_range(offset, len, |p| more = more && f(p, true));
                more
            }
        };
        if !more {
            break;
        }
    }
    resolved
}

/// Copies the pending octets of `batch` (payload through `segs`) into
/// `out`; returns how many. `EINVAL` if they do not fit or a payload piece
/// does not resolve.
fn gather(batch: &TxBatch, segs: &Segs, out: &mut [u8]) -> Result<usize> {
    let mut at = 0usize;
    let mut fits = true;
    let resolved = pending_slices(batch, segs, |p, _| match out.get_mut(at..at + p.len()) {
        Some(dst) => {
            dst.copy_from_slice(p);
            at += p.len();
            true
        }
        None => {
            fits = false;
            false
        }
    });
    if resolved && fits {
        Ok(at)
    } else {
        Err(EINVAL)
    }
}

/// The pending octets of `batch` as slices (payload through `segs`), as
/// many as `parts` holds; returns how many.
fn collect_parts<'a>(batch: &'a TxBatch, segs: &'a Segs, parts: &mut [&'a [u8]]) -> Result<usize> {
    let mut n = 0usize;
    pending_slices(batch, segs, |p, _| match parts.get_mut(n) {
        Some(slot) => {
            *slot = p;
            n += 1;
            true
        }
        None => false,
    });
    if n == 0 {
        return Err(EINVAL);
    }
    Ok(n)
}

/// The pending octets of `batch` as zero-copy parts: framing octets and
/// payload slices (through `segs`, in registered regions), as many as
/// `parts` holds. Returns how many, and whether more are pending.
fn collect_zc_parts<'a>(batch: &'a TxBatch, segs: &'a Segs, parts: &mut [ZcPart<'a>]) -> Result<(usize, bool)> {
    let mut n = 0usize;
    let mut more = false;
    let resolved = pending_slices(batch, segs, |bytes, payload| match parts.get_mut(n) {
        Some(slot) => {
            *slot = ZcPart { bytes, payload };
            n += 1;
            true
        }
        None => {
            more = true;
            false
        }
    });
    if !resolved || n == 0 {
        return Err(EINVAL);
    }
    Ok((n, more))
}

/// What [`Conn::send_small`] did with a job.
///
/// The job stays in the caller's place throughout (a WQE is about 150
/// octets, and each move of one is a call to memcpy).
enum Small {
    /// Staged (and sent, unless gathering) and completed; the place holds
    /// the next job, taken with its completion.
    Sent,
    /// Not a small Send or Write, or no room for it: the general path's.
    Not,
    /// The stage could not be sent: the stream ends. The job, not sent
    /// and not completed, is left in place.
    Failed(Error),
}

/// What one transmit run did.
#[derive(Default)]
struct RunStats {
    /// Messages started (WQEs and responses).
    msgs: u32,
    /// A batch too large for the stage went to the socket.
    large: bool,
}

/// What a doorbell knows of the last transmit runs (a worker's, or a
/// quiet doorbell's: see [`Conn::tx_work`]), to tell a process that
/// streams small work requests from one that waits between posts
/// ([`Conn::doorbell`]). Heuristics only, hence relaxed: a stale value
/// costs one worker wake-up, or one message sent without company.
struct Pace {
    /// When the last run that sent something ended, and how long it took
    /// (ns).
    end: AtomicU64,
    span: AtomicU64,
    /// That run sent small messages only (all through the stage).
    small: AtomicBool,
}

impl Pace {
    fn new() -> Self {
        Pace { end: AtomicU64::new(0), span: AtomicU64::new(0), small: AtomicBool::new(false) }
    }

    /// Whether the process streams small messages: it rang sooner after
    /// the last run ended than half that run took, and that run's
    /// messages were small. (There is nothing to gather among large ones,
    /// and 64 KiB Writes handed to the worker reached about half the rate
    /// of those sent from the calling thread.)
    fn streaming(&self) -> bool {
        let since = now_ns().saturating_sub(self.end.load(Ordering::Relaxed));
        since.saturating_mul(2) < self.span.load(Ordering::Relaxed) && self.small.load(Ordering::Relaxed)
    }

    /// A transmit run from `start` to `end` (ns) did `stats`. A run that
    /// found nothing to send (a worker after the process stopped posting)
    /// says nothing of the process and leaves the record alone.
    fn ran(&self, start: u64, end: u64, stats: &RunStats) {
        if stats.msgs == 0 {
            return;
        }
        self.end.store(end, Ordering::Relaxed);
        self.span.store(end.saturating_sub(start), Ordering::Relaxed);
        self.small.store(!stats.large, Ordering::Relaxed);
    }
}

/// The connection manager's id of a connection, and what the CM knows.
struct CmLink {
    /// Until CLOSE is delivered (or the CM is to hear nothing).
    id: Option<CmId>,
    /// CONNECT_REPLY or ESTABLISHED has been delivered ([`Conn::up`]).
    up: bool,
    /// The teardown ran before that; `up` delivers its CLOSE.
    close_held: bool,
}

/// One connection.
#[pin_data]
pub(crate) struct Conn {
    qp: QpPtr,
    sock: Socket,
    neg: Negotiated,
    /// Local and peer address, read once (reading them takes the socket
    /// lock, which the softirq paths cannot).
    local: crate::net::SockAddr,
    remote: crate::net::SockAddr,
    #[pin]
    attached: Mutex<Option<Attached<Conn>>>,
    /// The connection manager's id, until CLOSE is delivered, and what
    /// the CM has been told. An interrupt-safe lock: the peer-closed path
    /// runs in softirq context.
    #[pin]
    cm: crate::sync::IrqSpinLock<CmLink>,
    /// Receive state. Only the receive path takes this lock, and it runs
    /// under the socket lock (the stack calls data-ready either in softirq
    /// when no one owns the socket, or in process context from
    /// `release_sock`), so it is never contended. It disables bottom halves
    /// (the process-context path must not be interrupted by another
    /// connection's softirq path holding the same lock class, as far as
    /// lockdep knows) but not interrupts: `tcp_read_sock` may re-enable
    /// bottom halves, which must not happen with interrupts off.
    #[pin]
    rx: crate::sync::BhSpinLock<Rx>,
    #[pin]
    tx: Mutex<Tx>,
    /// A TERMINATE to send before closing.
    #[pin]
    term: crate::sync::IrqSpinLock<Option<TerminateRepr>>,
    /// The link of zero-copy sends' notifications to the QP.
    zc: Arc<ZcTrack>,
    tx_busy: AtomicBool,
    tx_again: AtomicBool,
    /// The last transmit run stopped at a send refused for want of memory
    /// (see [`Conn::tx_work`]).
    starved: AtomicBool,
    /// What the doorbell knows of the last transmit runs.
    pace: Pace,
    closing: AtomicBool,
    /// The consumer asked for a graceful close (QP to SQD).
    graceful: AtomicBool,
    /// Responder in RFC 6581 peer-to-peer mode: nothing is sent until the
    /// initiator's RTR message has begun to arrive (see [`Conn::start`]).
    await_rtr: AtomicBool,
    /// The connection ended in error (TERMINATE sent or received): the QP
    /// reports a fatal (or access) error event.
    failed: AtomicBool,
    /// The error was the peer's access violation.
    access_error: AtomicBool,
    /// The teardown's work item, part of the connection so that closing
    /// never allocates: a teardown that could not be queued would never
    /// run, and the QP's destroy would wait for it forever.
    #[pin]
    teardown_work: workqueue::Work<Conn, TEARDOWN>,
    /// The transmit work item, queued by `kick` when no transmit runs
    /// (`tx_busy`): part of the connection, so a kick from softirq context
    /// neither allocates nor can fail for want of memory.
    #[pin]
    tx_work_item: workqueue::Work<Conn, TRANSMIT>,
}

/// The work item id of [`Conn::teardown_work`].
const TEARDOWN: u64 = 1;
/// The work item id of [`Conn::tx_work_item`].
const TRANSMIT: u64 = 2;

kernel::impl_has_work! {
    impl HasWork<Self, TEARDOWN> for Conn { self.teardown_work }
    impl HasWork<Self, TRANSMIT> for Conn { self.tx_work_item }
}

impl workqueue::WorkItem<TRANSMIT> for Conn {
    type Pointer = Arc<Conn>;

    fn run(this: Arc<Conn>) {
        this.tx_work(true, true);
    }
}

impl workqueue::WorkItem<TEARDOWN> for Conn {
    type Pointer = Arc<Conn>;

    fn run(this: Arc<Conn>) {
        this.teardown();
    }
}

/// Octets up to which a received tagged segment is placed under the region
/// table's lock (see [`TaggedSeg`]): as much as a small send copies under
/// it ([`crate::uwqe::MAX_INLINE`]), a short hold with interrupts off.
const SMALL_TAGGED: u32 = crate::uwqe::MAX_INLINE;

/// Octets up to which a transmit batch is copied into one piece before it is
/// handed to TCP (a 256-octet inline send with its headers and CRC fits).
const SMALL_SEND: usize = 384;

/// Octets of small batches a worker gathers before it sends them: about
/// fifty 64-octet Writes, or three full-size TCP segments.
const STAGE: usize = 4096;

/// Nanoseconds since boot (monotonic).
pub(crate) fn now_ns() -> u64 {
    u64::try_from(Ktime::ktime_get().to_ns()).unwrap_or(0)
}

/// Largest ULPDU (DDP segment) this side sends to a peer that expects
/// FPDUs aligned to TCP segments: one that fits a typical Ethernet MSS.
const MULPDU: u16 = 1448 - 6 - 2;

/// Largest ULPDU sent to a peer that accepts FPDUs spanning many TCP
/// segments (its MPA frame carries `RES_LARGE_FPDUS`, as siw_rs's does and
/// upstream siw's does with its `try_gso`): the largest ULPDU_Length that
/// keeps the FPDU a multiple of four octets. TCP then sends each FPDU as
/// one GSO super-packet, and both ends handle one header per ~64 KiB
/// instead of one per segment. Not with markers, whose every-512-octet
/// pieces would not fit one transmit batch.
const MULPDU_LARGE: u16 = u16::MAX - 3;

/// The ULPDU size for a connection.
fn mulpdu_for(neg: &Negotiated) -> u16 {
    if neg.peer_reserved & RES_LARGE_FPDUS != 0 && !neg.markers_tx {
        MULPDU_LARGE
    } else {
        MULPDU
    }
}

impl Conn {
    /// Creates the connection for `qp` over `sock` with the outcome of the
    /// MPA handshake, and attaches the socket callbacks; `responder`: this
    /// side sent the MPA Reply.
    ///
    /// A responder in peer-to-peer mode (RFC 6581: the initiator asked for
    /// it, and the Reply named the RTR message it is to send) transmits
    /// nothing until the initiator's first octets after the Reply have
    /// arrived: FPDUs that reached the initiator before it had processed
    /// the Reply could be taken for part of it (upstream siw as initiator
    /// fails the connection then). The initiator sends the RTR first, so
    /// the wait ends; meanwhile work requests wait in the send queue.
    /// Without peer-to-peer mode RFC 5044 leaves the initiator's ULP to
    /// send first, and a server that sends first is served at once, as
    /// upstream siw does (waiting would hang it).
    pub(crate) fn start(
        qp: &Qp<SiwRs>,
        sock: Socket,
        neg: Negotiated,
        cm: CmId,
        responder: bool,
    ) -> Result<Arc<Conn>> {
        // RFC 7306 Atomics and Immediate Data are accepted from any peer;
        // they are sent only when a consumer posts them (upstream siw
        // answers them with a TERMINATE, Unexpected OpCode).
        let rxc = RxConfig::from_negotiated(&neg, Extensions::ALL);
        let receiver = KBox::new(Receiver::new(rxc, Crc32c::new()), GFP_KERNEL)?;
        let txc = TxConfig::from_negotiated(&neg, mulpdu_for(&neg), Extensions::ALL);
        let batch = KBox::new(TxBatch::new(), GFP_KERNEL)?;
        let inline = KBox::new([0u8; crate::uwqe::MAX_INLINE as usize], GFP_KERNEL)?;
        let sqe = KBox::new([0u64; crate::uverbs::SQE_WORDS], GFP_KERNEL)?;
        let stage = KBox::new([0u8; STAGE], GFP_KERNEL)?;
        let (local, remote) = (sock.local_addr(), sock.peer_addr());
        let zc = Arc::new(
            ZcTrack { qp: QpPtr::new(qp), users: AtomicU32::new(0), knobs: qp.device().data().knobs().clone() },
            GFP_KERNEL,
        )?;
        let conn = Arc::pin_init(
            pin_init!(Conn {
                qp: QpPtr::new(qp),
                sock,
                neg,
                local,
                remote,
                attached <- new_mutex!(None),
                cm <- crate::sync::new_irq_spinlock!(CmLink { id: Some(cm), up: false, close_held: false }),
                rx <- crate::sync::new_bh_spinlock!(Rx {
                    receiver,
                    recv: None,
                    filling: None,
                    ended: false,
                    tagged: None,
                    inbound: None,
                    write_len: 0,
                    resp_off: 0,
                    peer_terminated: false,
                    peer_code: None,
                }),
                tx <- new_mutex!(Tx {
                    transmitter: Transmitter::new(txc),
                    batch,
                    cur: None,
                    segs: Segs::empty(),
                    stage,
                    staged: 0,
                    stage_sent: 0,
                    crc: Crc32c::new(),
                    atomic_id: 0,
                    zc_seq: 0,
                    inline,
                    sqe,
                }),
                term <- crate::sync::new_irq_spinlock!(None),
                zc,
                tx_busy: AtomicBool::new(false),
                tx_again: AtomicBool::new(false),
                starved: AtomicBool::new(false),
                pace: Pace::new(),
                closing: AtomicBool::new(false),
                graceful: AtomicBool::new(false),
                await_rtr: AtomicBool::new(responder && neg.p2p),
                failed: AtomicBool::new(false),
                access_error: AtomicBool::new(false),
                teardown_work <- workqueue::new_work!("siw_rs_conn_teardown"),
                tx_work_item <- workqueue::new_work!("siw_rs_conn_transmit"),
            }),
            GFP_KERNEL,
        )?;
        if let (false, Some(rtr)) = (responder, neg.rtr) {
            conn.send_rtr(rtr)?;
        }
        Ok(conn)
    }

    /// The initiator's RTR message in peer-to-peer mode (RFC 6581), its
    /// first FPDU: a zero-length RDMA Write, which names no memory (STag
    /// 1, as upstream siw sends it: a responder may treat STag 0 as
    /// special). Sent before the QP is established, so before any work
    /// request can be; the responder sends nothing until it has it.
    /// siw_rs offers only this type (`cm::mpa_config`), and the core
    /// refuses a Reply that names another.
    fn send_rtr(&self, rtr: Rtr) -> Result {
        if rtr != Rtr::Write {
            return Err(net::ffi_err(crate::ffi::EPROTO));
        }
        let mut tx = self.tx.lock();
        let Tx { transmitter, stage, crc, .. } = &mut *tx;
        let msg = Message::RdmaWrite { len: 0, stag: 1, to: 0 };
        let n = transmitter.emit_message(&msg, &[], crc, &mut stage[..]).map_err(|_| EINVAL)?;
        self.sock.send_all(&[stage.get(..n).unwrap_or(&[])])
    }

    /// The CM has been told the connection is up (CONNECT_REPLY or
    /// ESTABLISHED delivered): a CLOSE held back until then is delivered
    /// now, else the socket callbacks are attached.
    ///
    /// iw_cm BUG()s on a CLOSE that comes before the event that made the
    /// connection up, and the consumer may close the QP (ERROR, destroy)
    /// from another thread from the moment `qp::establish` links it, which
    /// is before that event can be delivered. The teardown reports CLOSE
    /// only once the CM knows the connection; a teardown that came first
    /// leaves it to this call.
    pub(crate) fn up(self: &Arc<Self>) {
        let held = {
            let mut link = self.cm.lock();
            link.up = true;
            if link.close_held { link.id.take() } else { None }
        };
        if let Some(cm) = held {
            self.report(&cm, CmEventKind::Close);
        }
        self.attach();
    }

    /// Installs the socket callbacks; data that arrived meanwhile is read
    /// at once.
    fn attach(self: &Arc<Self>) {
        {
            // The CM already knows the connection, so the consumer may
            // have closed it meanwhile; `close` sets `closing` before its
            // teardown takes this slot, so either teardown finds the
            // callbacks here or they are never attached.
            let mut slot = self.attached.lock();
            if self.closing.load(Ordering::Acquire) {
                return;
            }
            *slot = Some(self.sock.attach(self.clone()));
        }
        let me = self.clone();
        let _ = self.sock.with_lock(|sk| me.receive(sk));
        // A peer that closed before the callbacks were there: its state
        // change is past, so notice it now.
        if !self.sock.is_established() {
            self.peer_closed();
            return;
        }
        // The consumer may have posted (and found the socket full) before
        // the write-space callback was there: transmit once now.
        self.kick();
    }

    /// The connection manager is not to hear from this connection (its
    /// setup failed before the CM was told it is up).
    pub(crate) fn forget_cm(&self) {
        let _ = self.cm.lock().id.take();
    }

    /// Local and peer addresses.
    pub(crate) fn addrs(&self) -> (crate::net::SockAddr, crate::net::SockAddr) {
        (self.local, self.remote)
    }

    fn qp(&self) -> &Qp<SiwRs> {
        self.qp.qp()
    }

    /// Sends `bytes` before the data path starts (the MPA Reply).
    pub(crate) fn send_raw(&self, bytes: &[u8]) -> Result {
        self.sock.send_all(&[bytes])
    }

    /// Queues the transmit work.
    pub(crate) fn kick(self: &Arc<Self>) {
        self.kick_with(|c| {
            let _ = crate::wq::tx().enqueue::<_, TRANSMIT>(c);
        });
    }

    /// Queues the transmit work on the high-priority queue: the socket has
    /// room again for a stream that filled it ([`crate::wq::tx_hi`]).
    fn kick_stream(self: &Arc<Self>) {
        self.kick_with(|c| {
            let _ = crate::wq::tx_hi().enqueue::<_, TRANSMIT>(c);
        });
    }

    /// Records the work and, unless a transmit runs or is queued already,
    /// hands the transmit to `enqueue`.
    fn kick_with(self: &Arc<Self>, enqueue: impl FnOnce(Arc<Self>)) {
        if !self.claim_tx() {
            return;
        }
        // Winning `tx_busy` means no transmit runs and the item is not
        // queued: `tx_work` clears `tx_busy` only as it returns, after the
        // workqueue took the item off its queue. So the enqueue succeeds;
        // were the item queued after all, that run would do this work.
        // The same goes across the two transmit queues, whose
        // non-reentrancy the workqueue does not give: a run queued on one
        // may start while the last run, on the other, is still returning,
        // which after giving `tx_busy` up only reads the two flags and drops
        // its reference.
        enqueue(self.clone());
    }

    /// A process rang its send queue's doorbell (a system call, where
    /// sleeping is allowed); `quiet`: the newest WQE it posted is
    /// unsignalled.
    ///
    /// Transmits on the calling thread, unless a transmit is already
    /// running (which then picks the new work up). Saves the hand-over to
    /// a worker (a wake-up and a context switch), which dominates
    /// small-message latency; a large burst is sent until the socket is
    /// full, after which the write-space callback continues in a worker.
    ///
    /// Except for a process that streams small unsignalled work requests
    /// ([`Pace::streaming`]): sent from here, each would go to TCP alone,
    /// one doorbell and one segment per message, all on the process's CPU.
    /// Its transmit goes to a worker on another CPU instead, a neighbour of
    /// the process's ([`crate::wq::enqueue_beside`]), so that the two run
    /// side by side. While the worker runs the send ring
    /// is not marked idle, so the process goes on posting without system
    /// calls, and the worker gathers the small messages it finds queued
    /// into few socket sends. The process awaits no completion of what it
    /// posted last, so the worker's wake-up delays nothing it waits for.
    /// (A process that waits for each completion of its own would wait for
    /// a wake-up per message.)
    pub(crate) fn doorbell(self: &Arc<Self>, quiet: bool) {
        if quiet && self.pace.streaming() {
            let hint = self.qp().qp_num();
            self.kick_with(|c| {
                let _ = crate::wq::enqueue_beside::<_, TRANSMIT>(hint, c);
            });
            return;
        }
        if self.claim_tx() {
            self.clone().tx_work(false, quiet);
        }
    }

    /// Records that there is work to transmit; true if the caller is to
    /// run (or queue) the transmit, false if one is running or queued and
    /// will pick the work up.
    fn claim_tx(&self) -> bool {
        // SeqCst, here and in `tx_work`: a store-then-load on each side
        // (Dekker); with weaker orders the finishing worker can read a
        // stale `tx_again` while the claimant reads a stale `tx_busy`, and
        // the new work is never sent.
        self.tx_again.store(true, Ordering::SeqCst);
        !self.tx_busy.swap(true, Ordering::SeqCst)
    }

    /// Runs the transmitter until no work is left; `worker`: this is the
    /// work item's run, which gathers small messages until no more work is
    /// queued (see [`Conn::tx_run`]) and may sleep, rather than a
    /// doorbell's on the calling thread; `timed`: the run is recorded in
    /// [`Conn::pace`]. Only a quiet doorbell consults that record, so a
    /// signalled doorbell's run is not timed: reading the clock twice is
    /// a measurable part of a small message's way through the driver.
    ///
    /// A send the stack refused for want of memory, with room in the
    /// socket's buffer, is not retried at once: TCP calls write-space
    /// straight away when nothing is in flight, and retrying on that
    /// would spin (on the calling thread, inside the process's system
    /// call) for as long as memory is short. The retry is left to a
    /// worker, which pauses first, 1 ms doubling up to 64 ms while the
    /// refusals go on (blocking TCP senders wait in the same way).
    fn tx_work(self: Arc<Self>, worker: bool, timed: bool) {
        let start = if timed { now_ns() } else { 0 };
        let mut stats = RunStats::default();
        let mut pause = 0u32;
        loop {
            self.tx_again.store(false, Ordering::Release);
            if let Err(e) = self.tx_run(worker, &mut stats) {
                pr_debug!("qp {}: transmit failed: {:?}\n", self.qp().qp_num(), e);
                self.close(None);
            }
            if timed {
                self.pace.ran(start, now_ns(), &stats);
            }
            if self.starved.swap(false, Ordering::Relaxed) && !self.closing.load(Ordering::Acquire) {
                if !worker {
                    // This holds `tx_busy`, so the item is not queued (see
                    // `kick_with`) and the enqueue succeeds; the worker holds
                    // `tx_busy` from here.
                    let _ = crate::wq::tx().enqueue::<_, TRANSMIT>(self);
                    return;
                }
                pause = pause.saturating_mul(2).clamp(1000, 64_000);
                pr_debug!("qp {}: send refused for memory; retry in {} us\n", self.qp().qp_num(), pause);
                crate::wq::sleep_us(pause);
                continue;
            }
            pause = 0;
            self.tx_busy.store(false, Ordering::SeqCst);
            if !self.tx_again.load(Ordering::SeqCst) || self.tx_busy.swap(true, Ordering::SeqCst) {
                break;
            }
        }
    }

    /// Hands `parts` to the socket; `Ok(None)` when it is full (a
    /// write-space callback will re-queue us) or refused them for want of
    /// memory (`starved`: `tx_work` retries).
    fn send_some(&self, parts: &[&[u8]]) -> Result<Option<usize>> {
        self.send_some_with(|| self.sock.send(parts, true))
    }

    /// [`Conn::send_some`] with `send` (a non-blocking send returning the
    /// octets taken).
    fn send_some_with(&self, mut send: impl FnMut() -> Result<usize>) -> Result<Option<usize>> {
        let mut retried = false;
        loop {
            let sent = send()?;
            if sent > 0 {
                return Ok(Some(sent));
            }
            self.sock.want_write_space();
            if !self.sock.writeable() {
                return Ok(None);
            }
            // Room may have freed up between the send and the flag: try
            // once more then. A second refusal with room in the buffer is
            // the stack's want of memory: `tx_work` retries after a pause
            // (the write-space call TCP makes for it is no sign of memory).
            if retried {
                self.starved.store(true, Ordering::Relaxed);
                return Ok(None);
            }
            retried = true;
        }
    }

    /// Sends what the stage holds; `Ok(false)` when the socket is full.
    fn flush_stage(&self, tx: &mut Tx) -> Result<bool> {
        while tx.stage_sent < tx.staged {
            let rest = tx.stage.get(tx.stage_sent..tx.staged).unwrap_or(&[]);
            let Some(sent) = self.send_some(&[rest])? else {
                return Ok(false);
            };
            tx.stage_sent += sent;
        }
        tx.staged = 0;
        tx.stage_sent = 0;
        Ok(true)
    }

    /// Sends what the batch still holds, small batches through the stage
    /// (left there when `gathering`); `Ok(false)` when the socket is full.
    fn flush_batch(&self, tx: &mut Tx, gathering: bool, stats: &mut RunStats) -> Result<bool> {
        while !tx.batch.is_done() {
            // A small batch (headers, a few payload pieces, CRCs) goes to
            // the stack as one piece, gathered straight from its chunks:
            // tcp_sendmsg costs per piece about what copying a few hundred
            // octets here does.
            let pending = tx.batch.pending_len();
            if pending <= SMALL_SEND {
                if tx.staged + pending > STAGE && !self.flush_stage(tx)? {
                    return Ok(false);
                }
                let Tx { batch, segs, stage, staged, .. } = &mut *tx;
                let n = gather(batch, segs, stage.get_mut(*staged..).unwrap_or(&mut []))?;
                *staged += n;
                batch.advance(n).map_err(|_| EINVAL)?;
                continue;
            }
            // What is staged goes first: it is older.
            if !self.flush_stage(tx)? {
                return Ok(false);
            }
            stats.large = true;
            if let Some((note, _)) = tx.cur.as_ref().and_then(|c| c.zc.as_ref()) {
                let mut parts = [ZcPart::default(); crate::net::MAX_SEND_PARTS];
                let (n, more) = collect_zc_parts(&tx.batch, &tx.segs, &mut parts)?;
                match self.send_some_with(|| self.sock.send_zcopy(&parts[..n], note, more)) {
                    Ok(Some(sent)) => {
                        tx.batch.advance(sent).map_err(|_| EINVAL)?;
                        continue;
                    }
                    Ok(None) => return Ok(false),
                    // Nothing could go by reference: copied below.
                    Err(e) if e.to_errno() == -(crate::ffi::EOPNOTSUPP as i32) => {}
                    Err(e) => return Err(e),
                }
            }
            let mut parts: [&[u8]; crate::net::MAX_SEND_PARTS] = [&[]; crate::net::MAX_SEND_PARTS];
            let n = collect_parts(&tx.batch, &tx.segs, &mut parts)?;
            let Some(sent) = self.send_some(&parts[..n])? else {
                return Ok(false);
            };
            tx.batch.advance(sent).map_err(|_| EINVAL)?;
        }
        if !gathering {
            return self.flush_stage(tx);
        }
        Ok(true)
    }

    /// Transmits queued work until none is left or the socket is full.
    ///
    /// With `gathering`, small batches collect in the stage until no more
    /// work is queued (or the stage is full, or a large batch follows),
    /// and go to the socket in one send: TCP then carries many small
    /// messages in one segment, and the peer handles them in one receive.
    /// A WQE completes once its message is in the stage (its payload is
    /// copied, nothing refers to it), as it does once the socket took it.
    fn tx_run(self: &Arc<Self>, gathering: bool, stats: &mut RunStats) -> Result {
        let qp = self.qp();
        let mut tx = self.tx.lock();
        loop {
            if self.closing.load(Ordering::Acquire) {
                return Ok(());
            }
            if self.await_rtr.load(Ordering::Acquire) {
                // The receive path kicks the transmitter once the RTR
                // arrives. A graceful close meanwhile closes at once: what
                // is queued could not be sent yet, and is flushed.
                if self.graceful.load(Ordering::Acquire) {
                    drop(tx);
                    self.close(None);
                }
                return Ok(());
            }
            if !self.flush_batch(&mut tx, gathering, stats)? {
                return Ok(());
            }
            // The next job when it was taken with the last one's completion.
            let mut taken = None;
            if tx.cur.as_ref().is_some_and(|c| c.planned) {
                // The batch is sent or staged (either way copied), so
                // nothing refers to the message's payload any more.
                let Tx { transmitter, cur, segs, inline, sqe, .. } = &mut *tx;
                segs.clear();
                if let Some(next) = cur.as_mut().and_then(|c| c.then.take()) {
                    let Some(c) = cur.as_mut() else { continue };
                    c.msg = transmitter.start(&next).map_err(|_| EINVAL)?;
                    c.planned = false;
                } else if let Some(Cur { wqe: Some(w), zc, .. }) = cur.take() {
                    taken = Some(match zc {
                        // It completes when the stack releases the pages,
                        // which dropping the note allows.
                        Some((note, seq)) => {
                            qp::sent_zcopy(qp, w, seq);
                            drop(note);
                            qp::next_job(qp, qp::TakeBufs { inline, sqe })
                        }
                        None => qp::sent_then_next(qp, w, qp::TakeBufs { inline, sqe }),
                    });
                }
            }
            if tx.cur.is_none() {
                let mut job = match taken {
                    Some(job) => job,
                    None => qp::next_job(qp, tx.take_bufs()),
                };
                // Small Sends and Writes, one after the other, go to the
                // stage without being planned.
                while job.is_some() {
                    if self.closing.load(Ordering::Acquire) {
                        break;
                    }
                    match self.send_small(&mut tx, &mut job, gathering) {
                        Small::Sent => stats.msgs = stats.msgs.saturating_add(1),
                        Small::Not => break,
                        Small::Failed(e) => {
                            // The job is parked as the message in flight:
                            // the teardown flushes it in order.
                            if let Some(j) = job.take() {
                                if let Err(Some((w, status))) = self.begin(&mut tx, j) {
                                    qp::complete_send(qp, w, status);
                                }
                            }
                            return Err(e);
                        }
                    }
                }
                let Some(job) = job else {
                    if !self.flush_stage(&mut tx)? {
                        return Ok(());
                    }
                    if self.graceful.load(Ordering::Acquire) && qp::sq_empty(qp) {
                        drop(tx);
                        self.close(None);
                    }
                    return Ok(());
                };
                match self.begin(&mut tx, job) {
                    Ok(()) => stats.msgs = stats.msgs.saturating_add(1),
                    Err(Some((w, status))) => {
                        qp::complete_send(qp, w, status);
                        drop(tx);
                        self.close(Some(local_catastrophic()));
                        return Ok(());
                    }
                    Err(None) => {
                        drop(tx);
                        self.close(Some(local_catastrophic()));
                        return Ok(());
                    }
                }
                if tx.cur.is_none() {
                    // A local operation, executed and completed.
                    continue;
                }
            }
            let Tx { transmitter, batch, cur, crc, segs, .. } = &mut *tx;
            let Some(c) = cur.as_mut() else { continue };
            let r = transmitter
                .plan(batch, &mut c.msg, 0, segs, crc, usize::MAX)
                .map_err(|_| EINVAL)?;
            if r.status == PlanStatus::MessageDone {
                c.planned = true;
            } else if r.fpdus == 0 {
                return Err(EINVAL);
            }
        }
    }

    /// Sends a small Send or RDMA Write (up to [`crate::uwqe::MAX_INLINE`]
    /// octets, inline or not) without planning it: its payload is copied
    /// (the SGEs' into the inline buffer), the whole message is framed
    /// straight into the stage (one FPDU, at most [`SMALL_SEND`] octets),
    /// and the WQE completes there, as one that went through
    /// [`Conn::flush_batch`] does. Skips what the general
    /// path costs per message (the message cursor, its payload ranges,
    /// the batch and gathering it into the stage), which is most of a
    /// small message's latency in the driver. Other jobs, and a stage
    /// too full for the message, take the general path (`Small::Not`).
    fn send_small(&self, tx: &mut Tx, job: &mut Option<Job>, gathering: bool) -> Small {
        let Some(Job::Wqe(w)) = job.as_ref() else { return Small::Not };
        let msg = match w.op {
            _ if w.len > crate::uwqe::MAX_INLINE => None,
            WqeOp::Send => Some(Message::send(w.len, w.solicited, None)),
            WqeOp::SendInv(stag) => Some(Message::send(w.len, w.solicited, Some(stag))),
            WqeOp::Write { remote_addr, rkey } => Some(Message::RdmaWrite { len: w.len, stag: rkey, to: remote_addr }),
            _ => None,
        };
        let Some(msg) = msg else { return Small::Not };
        if tx.staged.saturating_add(SMALL_SEND) > STAGE {
            match self.flush_stage(tx) {
                Ok(true) => {}
                Ok(false) => return Small::Not,
                Err(e) => return Small::Failed(e),
            }
        }
        let Tx { transmitter, stage, staged, crc, inline, .. } = &mut *tx;
        let len = w.len as usize;
        if !w.inline {
            // The SGEs' octets, copied into the inline buffer (free: it
            // holds a WQE's inline data only while that WQE is in flight).
            // Any access error takes the general path, which reports it.
            let copied = match (w.sges.get(..usize::from(w.nsge)), inline.get_mut(..len)) {
                (Some(sges), Some(dst)) => copy_local(self.qp(), sges, 0, dst).is_ok(),
                _ => false,
            };
            if !copied {
                return Small::Not;
            }
        }
        let payload = inline.get(..len).unwrap_or(&[]);
        let out = stage.get_mut(*staged..).unwrap_or(&mut []);
        // An error (the extension is off, the MULPDU too small, ...) left
        // nothing behind; the general path reports it.
        let Ok(n) = transmitter.emit_message(&msg, payload, crc, out) else {
            return Small::Not;
        };
        *staged += n;
        // On a doorbell the message goes to the socket before the WQE
        // completes, as on the general path: the completion is not on the
        // way to the peer. A send that failed ends the stream; the WQE
        // has not left and is flushed with the rest, not completed.
        if !gathering {
            if let Err(e) = self.flush_stage(tx) {
                return Small::Failed(e);
            }
        }
        qp::sent_then_next_in(self.qp(), job, tx.take_bufs());
        Small::Sent
    }

    /// Checks again, as its response starts, the region an inbound Read
    /// or Atomic Request was checked against when it arrived: since then
    /// the region may have been invalidated (by the peer's own Send with
    /// Invalidate, or locally) and a kernel consumer may have reused its
    /// pages. A failed check ends the connection with the TERMINATE the
    /// request would have had on arrival; `Err(None)` (as from
    /// [`Conn::begin`]) then, whose caller's close finds it decided.
    fn refuse_response(&self, r: core::result::Result<(), AccessError>) -> core::result::Result<(), Option<(SendWqe, WcStatus)>> {
        let Err(e) = r else { return Ok(()) };
        if net::peer_log_allowed() {
            pr_info!("qp {}: request's region no longer valid for its response: {:?}\n", self.qp().qp_num(), e);
        }
        self.access_error.store(true, Ordering::Release);
        self.failed.store(true, Ordering::Release);
        self.close(Some(TerminateRepr::new(read_source_code(e))));
        Err(None)
    }

    /// Turns a job into a message being planned, resolving its local
    /// memory, or executes a local operation. On failure returns the WQE
    /// with its completion status.
    fn begin(&self, tx: &mut Tx, job: Job) -> core::result::Result<(), Option<(SendWqe, WcStatus)>> {
        let qp = self.qp();
        // Empty already (cleared as the last message finished); an error
        // below leaves what it added for the teardown to release.
        tx.segs.clear();
        let wqe = match job {
            Job::Response(Inbound::Read(ReadJob { req, mem })) => {
                let msg = Message::read_response(&req);
                if let Some(m) = mem {
                    let r = m.check(req.source_stag, qp.pd().id(), req.source_to, u64::from(req.read_size), Access::REMOTE_READ);
                    self.refuse_response(r)?;
                    tx.segs.add(m, req.source_to, u64::from(req.read_size)).map_err(|_| None)?;
                }
                let msg = tx.transmitter.start(&msg).map_err(|_| None)?;
                // By reference too when large and from a process's region;
                // nothing completes when the stack releases it.
                let zc = self.zcopy_note(tx, false, req.read_size, RESPONSE_SEQ);
                tx.cur = Some(Cur { msg, wqe: None, planned: false, then: None, zc });
                return Ok(());
            }
            Job::Response(Inbound::Atomic(AtomicJob { req, mem })) => {
                // Executed now, in order with the Read Requests before it.
                let r = mem.check(req.remote_stag, qp.pd().id(), req.remote_to, 8, Access::REMOTE_ATOMIC);
                self.refuse_response(r)?;
                let original = execute_atomic(&mem, &req).map_err(|_| None)?;
                let msg = Message::AtomicResponse(AtomicResponse { request_id: req.request_id, original_value: original });
                let msg = tx.transmitter.start(&msg).map_err(|_| None)?;
                tx.cur = Some(Cur { msg, wqe: None, planned: false, then: None, zc: None });
                return Ok(());
            }
            Job::Wqe(w) => w,
        };
        let mut wqe = wqe;
        let sges = &wqe.sges[..usize::from(wqe.nsge)];
        let mut then = None;
        let mut atomic_id = None;
        let msg = match wqe.op {
            WqeOp::RegMr { .. } | WqeOp::LocalInv(_) => {
                let status = match qp::execute_local(qp, &wqe) {
                    Ok(()) => WcStatus::Success,
                    Err(_) => WcStatus::LocProtErr,
                };
                if status != WcStatus::Success {
                    return Err(Some((wqe, status)));
                }
                qp::sent(qp, wqe);
                return Ok(());
            }
            WqeOp::Send => Message::send(wqe.len, wqe.solicited, None),
            WqeOp::SendInv(stag) => Message::send(wqe.len, wqe.solicited, Some(stag)),
            WqeOp::Write { remote_addr, rkey } => Message::RdmaWrite { len: wqe.len, stag: rkey, to: remote_addr },
            WqeOp::WriteImm { remote_addr, rkey, imm } => {
                let [write, immediate] =
                    Message::write_with_immediate(wqe.len, rkey, remote_addr, immediate_of(imm), wqe.solicited);
                then = Some(immediate);
                write
            }
            WqeOp::Atomic { op, remote_addr, rkey, data, compare, .. } => {
                let sink = sges.first().copied().unwrap_or_default();
                if check_remote(qp, sink.lkey, sink.addr, 8, Access::LOCAL_WRITE).is_err() {
                    return Err(Some((wqe, WcStatus::LocProtErr)));
                }
                let id = tx.atomic_id;
                tx.atomic_id = id.wrapping_add(1);
                atomic_id = Some(id);
                Message::AtomicRequest(match op {
                    AtomicOp::CmpSwap => AtomicRequest::cmp_swap(id, rkey, remote_addr, compare, data),
                    _ => AtomicRequest::fetch_add(id, rkey, remote_addr, data),
                })
            }
            WqeOp::Read { remote_addr, rkey } | WqeOp::ReadInv { remote_addr, rkey, .. } => {
                let sink = sges.first().copied().unwrap_or_default();
                if wqe.len > 0 && check_remote(qp, sink.lkey, sink.addr, wqe.len, Access::LOCAL_WRITE).is_err() {
                    return Err(Some((wqe, WcStatus::LocProtErr)));
                }
                Message::ReadRequest(crate::iwarp::rdmap::ReadRequest {
                    sink_stag: sink.lkey,
                    sink_to: sink.addr,
                    read_size: wqe.len,
                    source_stag: rkey,
                    source_to: remote_addr,
                })
            }
        };
        let no_payload = matches!(msg, Message::ReadRequest(_) | Message::AtomicRequest(_));
        if !no_payload {
            if wqe.inline {
                // Copied at post time; the buffer is the transmitter's, kept
                // until the message is sent.
                let Tx { segs, inline, .. } = &mut *tx;
                segs.set_inline(inline.get(..wqe.len as usize).unwrap_or(&[]));
            } else if resolve_local(qp, sges, 0, &mut tx.segs).is_err() {
                return Err(Some((wqe, WcStatus::LocProtErr)));
            }
        }
        if let (Some(id), WqeOp::Atomic { id: slot, .. }) = (atomic_id, &mut wqe.op) {
            // The response is matched against it.
            *slot = id;
        }
        match tx.transmitter.start(&msg) {
            Ok(msg) => {
                // A Read or Atomic Request awaits its response before its
                // first octet leaves: over a fast link the response can be
                // received before the send call returns.
                let zc = if no_payload || then.is_some() {
                    None
                } else {
                    let seq = tx.zc_seq;
                    tx.zc_seq = seq.wrapping_add(1) % RESPONSE_SEQ;
                    self.zcopy_note(tx, wqe.inline, wqe.len, seq)
                };
                let wqe = if no_payload {
                    qp::await_response(qp, wqe).map_err(|w| Some((w, WcStatus::WrFlushErr)))?;
                    None
                } else {
                    Some(wqe)
                };
                tx.cur = Some(Cur { msg, wqe, planned: false, then, zc });
                Ok(())
            }
            Err(_) => Err(Some((wqe, WcStatus::LocLenErr))),
        }
    }

    /// A notification (numbered `seq`) for sending the payload of the
    /// message just resolved into `tx.segs`, `len` octets, by reference,
    /// if it goes that way: the device's `zcopy` setting is on, the
    /// payload is at least [`ZCOPY_MIN`] octets, not `inline`, in
    /// registered regions, and no markers cut it into 512-octet pieces.
    /// (An RDMA Write with Immediate Data, whose WQE spans two messages,
    /// is copied.) The regions may be a process's (pinned pages) or a
    /// kernel consumer's (a block layer's or nvmet's pages, but also slab
    /// memory, which skbs must not reference): the socket takes a page by
    /// reference only where the stack allows it (`sendpage_ok`, in
    /// `helpers.c`), and [`Conn::flush_batch`] copies the rest. With CRC
    /// on, only a process's regions go by reference: a kernel consumer's
    /// page may change in flight (page cache under writeback), which
    /// without CRC tears data the consumer writes again anyway, but would
    /// make the CRC computed at framing wrong and end the connection.
    fn zcopy_note(&self, tx: &Tx, inline: bool, len: u32, seq: u64) -> Option<(Note, u64)> {
        if inline || len < ZCOPY_MIN || self.neg.markers_tx || !self.zc.knobs.zcopy() || !tx.segs.in_regions() {
            return None;
        }
        if self.neg.crc && !tx.segs.all_user() {
            return None;
        }
        let note = Note::new(&self.zc, seq)?;
        self.zc.knobs.count_zcopy();
        Some((note, seq))
    }

    /// Reads and processes what the socket holds; returns whether the
    /// transmitter has new work (a Read to answer, a fence lifted).
    fn receive(&self, sk: &SockRef) -> bool {
        if self.closing.load(Ordering::Acquire) {
            return false;
        }
        let mut failed = None;
        let mut kick = false;
        // What TCP will act on when the read ends (see
        // `SockRef::set_ack_pushed`): a prompt ACK only where the octets
        // read end a message. Touched only when that changes.
        let pushed = sk.ack_pushed();
        let mut shown = pushed;
        let (peer_term, peer_code) = {
            let mut rx = self.rx.lock();
            Socket::read_sk(sk, &mut |piece: &[u8]| {
                if failed.is_some() || rx.peer_terminated || rx.ended {
                    return piece.len();
                }
                // The initiator has processed the MPA Reply (see
                // `Conn::start`): this side may send, once the receive path
                // has queued what these octets ask for (a Read RTR's
                // response). A plain load first: the swap is for the first
                // piece only, not for every piece of the stream.
                if !piece.is_empty()
                    && self.await_rtr.load(Ordering::Relaxed)
                    && self.await_rtr.swap(false, Ordering::AcqRel)
                {
                    kick = true;
                }
                if let Err(e) = self.rx_piece(&mut rx, piece, &mut kick) {
                    failed = Some(e);
                }
                if pushed && shown != rx.receiver.at_message_end() {
                    shown = !shown;
                    sk.set_ack_pushed(shown);
                }
                piece.len()
            });
            (rx.peer_terminated, rx.peer_code)
        };
        if peer_term {
            // The peer refused one of our requests: it fails with the
            // remote error, and the QP reports a fatal error.
            let status = match peer_code {
                Some(TermCode::RdmapRemoteProtection(_)) | Some(TermCode::DdpTagged(_)) => WcStatus::RemAccessErr,
                _ => WcStatus::RemOpErr,
            };
            qp::fail_oldest(self.qp(), status);
            self.failed.store(true, Ordering::Release);
            self.close(None);
            return false;
        }
        if let Some(e) = failed {
            if net::peer_log_allowed() {
                pr_info!("qp {}: {}\n", self.qp().qp_num(), e);
            }
            let term = e.should_send_terminate().then_some(e.terminate);
            let access = matches!(
                e.code(),
                TermCode::RdmapRemoteProtection(_) | TermCode::DdpTagged(_)
            );
            self.access_error.store(access, Ordering::Release);
            self.failed.store(true, Ordering::Release);
            self.close(term);
            return false;
        }
        kick
    }

    fn rx_piece(&self, rx: &mut Rx, piece: &[u8], kick: &mut bool) -> core::result::Result<(), RxError> {
        let qp = self.qp();
        let mut rest = piece;
        loop {
            // Matched where it lies: moving it out costs two copies.
            let r = Self::rx_poll(qp, rx, &mut rest);
            let polled = match &r {
                Ok(Some(p)) => p,
                Ok(None) => return Ok(()),
                Err(e) => return Err(*e),
            };
            let whole = matches!(polled, Polled::Segment(_));
            match polled {
                // A segment that came whole (the common case: one call,
                // its CRC already checked): its header, payload and
                // completion in the order its events would have come.
                Polled::Segment(w) => {
                    let h = &w.done.header;
                    self.rx_header(rx, h)?;
                    if !w.data.is_empty() {
                        self.rx_data(rx, Placement { target: h.target, data: w.data })?;
                    }
                    self.rx_done(rx, &w.done, kick)?;
                }
                Polled::Event(RxEvent::Header(h)) => self.rx_header(rx, h)?,
                Polled::Event(RxEvent::Data(p)) => self.rx_data(rx, *p)?,
                Polled::Event(RxEvent::Done(d)) => self.rx_done(rx, d, kick)?,
            }
            // The peer's TERMINATE ends the stream.
            if rx.peer_terminated {
                return Ok(());
            }
            // A whole segment leaves the receiver between FPDUs, where an
            // empty input has nothing to report: polling again would only
            // find that out (at a piece's end, the usual case: one FPDU
            // per TCP segment).
            if whole && rest.is_empty() {
                return Ok(());
            }
        }
    }

    /// The receiver's next segment or event from `rest`. Out of line: the
    /// result (a segment, or an error with its Terminate) then stays in one
    /// place in memory, which the handlers read by reference, rather than
    /// being split into registers and put back together for each call.
    #[inline(never)]
    fn rx_poll<'a>(qp: &Qp<SiwRs>, rx: &mut Rx, rest: &mut &'a [u8]) -> core::result::Result<Option<Polled<'a>>, RxError> {
        // Queue 0: a receive WQE (its length bounds a Send; Immediate
        // Data only needs one), taken now for the message's header to
        // use (the core asks again only if the segment is not yet whole,
        // and then gets the same one); queue 1: room within the IRD;
        // queue 3: an outstanding Atomic Request.
        let Rx { recv, filling, receiver, .. } = rx;
        let mut posted = |qn: u32, _msn: u32, _op: Opcode| match qn {
            // (Not while a message fills `recv`; see `Rx::filling`.)
            0 if filling.is_none() => {
                if recv.is_none() {
                    *recv = qp::claim_recv(qp);
                }
                recv.as_ref().map(|w| w.len)
            }
            1 if qp::inbound_room(qp) => Some(u32::MAX),
            3 if qp::atomic_sink(qp).is_some() => Some(u32::MAX),
            _ => None,
        };
        receiver.poll_segment(rest, &mut posted)
    }

    /// A segment's header is in: find what it goes to (the receive WQE, the
    /// region, the inbound request's target), or refuse it.
    fn rx_header(&self, rx: &mut Rx, h: &SegmentHeader) -> core::result::Result<(), RxError> {
        let qp = self.qp();
        match h.opcode {
            Opcode::Send | Opcode::SendSe | Opcode::SendInvalidate | Opcode::SendSeInvalidate => {
                if h.first {
                    let (Some(w), None) = (&rx.recv, &rx.filling) else {
                        return Err(rx.receiver.reject(TermCode::DdpUntagged(
                            crate::iwarp::terminate::UntaggedCode::MsnNoBuffer,
                        )));
                    };
                    match resolve_recv(qp, w) {
                        Ok(mems) => rx.filling = Some(mems),
                        Err(_) => {
                            if let Some(wr_id) = rx.take_recv() {
                                qp::complete_recv(qp, wr_id, WcStatus::LocProtErr, 0, false, RecvKind::Send { invalidated: None });
                            }
                            return Err(rx.receiver.reject(TermCode::RdmapLocalCatastrophic(0xff)));
                        }
                    }
                }
            }
            Opcode::RdmaWrite | Opcode::RdmaReadResponse => {
                if let Target::Tagged { stag, to } = h.target {
                    let rights = if h.opcode == Opcode::RdmaWrite {
                        Access::REMOTE_WRITE
                    } else {
                        // The sink must be the oldest outstanding
                        // Read's, a local buffer.
                        let (addr, len) = match qp::read_sink(qp) {
                            Some((lkey, addr, len, _)) if lkey == stag || h.payload_len == 0 => (addr, len),
                            _ => {
                                return Err(rx.receiver.reject(TermCode::RdmapRemoteOperation(
                                    crate::iwarp::terminate::RemoteOperationCode::UnexpectedOpcode,
                                )))
                            }
                        };
                        // Its segments fill the sink in order and
                        // never past the size the Read asked for
                        // (RFC 5040 section 4.4).
                        let end = rx.resp_off.checked_add(h.payload_len).filter(|&e| e <= len);
                        let at = addr.wrapping_add(u64::from(rx.resp_off));
                        match end {
                            Some(e) if h.payload_len == 0 || to == at => rx.resp_off = e,
                            _ => return Err(rx.receiver.reject(TermCode::DdpTagged(TaggedCode::BaseBounds))),
                        }
                        Access::LOCAL_WRITE
                    };
                    // Every segment is checked, as its pieces are
                    // placed: each names its own range. A zero-length
                    // one names no memory (RFC 6581 RTR messages).
                    // The region an earlier segment of this message
                    // found through the same STag is kept rather than
                    // looked up again (see `TaggedSeg`).
                    let prev = rx.tagged.take().and_then(|t| t.mem.filter(|_| t.stag == stag));
                    if h.payload_len > 0 {
                        let mem = if h.payload_len <= SMALL_TAGGED {
                            None
                        } else if prev.is_some() {
                            prev
                        } else {
                            let Some(mem) = mem::lookup(qp::stags(qp), stag) else {
                                return Err(rx.receiver.reject(remote_code(AccessError::InvalidStag)));
                            };
                            Some(mem)
                        };
                        rx.tagged = Some(TaggedSeg { mem, stag, to, len: h.payload_len, rights });
                    }
                }
            }
            Opcode::RdmaReadRequest => {
                if let Some(&FixedPayload::ReadRequest(req)) = rx.receiver.fixed_payload() {
                    match check_remote(qp, req.source_stag, req.source_to, req.read_size, Access::REMOTE_READ) {
                        Ok(m) => rx.inbound = Some(Inbound::Read(ReadJob { req, mem: m })),
                        Err(e) => return Err(rx.receiver.reject(read_source_code(e))),
                    }
                }
            }
            Opcode::AtomicRequest => {
                if let Some(&FixedPayload::AtomicRequest(req)) = rx.receiver.fixed_payload() {
                    match check_atomic_target(qp, &req) {
                        Ok(mem) => rx.inbound = Some(Inbound::Atomic(AtomicJob { req, mem })),
                        Err(code) => return Err(rx.receiver.reject(code)),
                    }
                }
            }
            Opcode::ImmediateData | Opcode::ImmediateDataSe => {
                // It takes a receive WQE of its own, like a Send,
                // but places nothing in it.
                let (Some(_), None) = (&rx.recv, &rx.filling) else {
                    return Err(rx.receiver.reject(TermCode::DdpUntagged(
                        crate::iwarp::terminate::UntaggedCode::MsnNoBuffer,
                    )));
                };
                rx.filling = Some([const { None }; qp::NSGE]);
            }
            // Matched against the outstanding request when
            // complete.
            Opcode::AtomicResponse | Opcode::Terminate => {}
        }
        Ok(())
    }

    /// Places a piece of a segment's payload.
    fn rx_data(&self, rx: &mut Rx, p: Placement<'_>) -> core::result::Result<(), RxError> {
        let qp = self.qp();
        match p.target {
            Target::Untagged { mo, .. } => {
                if let (Some(w), Some(mems)) = (&rx.recv, &rx.filling) {
                    place_recv(w, mems, mo, p.data);
                }
            }
            Target::Tagged { to, .. } => {
                if let Some(t) = &rx.tagged {
                    let seg = (t.to, u64::from(t.len));
                    let place = |m: &Mem| m.place(t.stag, qp.pd().id(), seg, t.rights, to, p.data);
                    let placed = match &t.mem {
                        Some(m) => place(m),
                        None => mem::with(qp::stags(qp), t.stag, place),
                    };
                    if let Err(e) = placed {
                        return Err(rx.receiver.reject(remote_code(e)));
                    }
                }
            }
        }
        Ok(())
    }

    /// A segment is complete and verified: completions, responses, the
    /// peer's TERMINATE.
    fn rx_done(&self, rx: &mut Rx, d: &SegmentDone, kick: &mut bool) -> core::result::Result<(), RxError> {
        let qp = self.qp();
        match d.header.opcode {
            Opcode::Send | Opcode::SendSe | Opcode::SendInvalidate | Opcode::SendSeInvalidate => {
                if let Some(len) = d.message_len {
                    if let Some(w) = rx.take_filled() {
                        let se = matches!(d.header.opcode, Opcode::SendSe | Opcode::SendSeInvalidate);
                        let inv = d.header.invalidate_stag;
                        if let Some(stag) = inv {
                            let r = mem::lookup(qp::stags(qp), stag)
                                .ok_or(AccessError::InvalidStag)
                                .and_then(|m| m.remote_invalidate(stag, qp.pd().id()));
                            if let Err(e) = r {
                                // The data is placed, but the receive
                                // fails and the stream ends.
                                let kind = RecvKind::Send { invalidated: None };
                                qp::complete_recv(qp, w, WcStatus::RemInvReqErr, len as u32, se, kind);
                                return Err(rx.receiver.reject(TermCode::RdmapRemoteProtection(match e {
                                    AccessError::InvalidStag | AccessError::Invalidated => RemoteProtectionCode::InvalidStag,
                                    AccessError::WrongPd => RemoteProtectionCode::StagNotAssociated,
                                    _ => RemoteProtectionCode::CannotInvalidate,
                                })));
                            }
                        }
                        let kind = RecvKind::Send { invalidated: inv };
                        qp::complete_recv(qp, w, WcStatus::Success, len as u32, se, kind);
                    }
                }
            }
            Opcode::RdmaWrite => {
                if let Some(len) = d.message_len {
                    rx.tagged = None;
                    rx.write_len = u32::try_from(len).unwrap_or(u32::MAX);
                }
            }
            Opcode::ImmediateData | Opcode::ImmediateDataSe => {
                let imm = match rx.receiver.fixed_payload() {
                    Some(&FixedPayload::ImmediateData(imm)) => Some(imm),
                    _ => None,
                };
                if let (Some(w), Some(imm)) = (rx.take_filled(), imm) {
                    let se = d.header.opcode == Opcode::ImmediateDataSe;
                    let v = imm_of(&imm);
                    let len = core::mem::take(&mut rx.write_len);
                    qp::complete_recv(qp, w, WcStatus::Success, len, se, RecvKind::Immediate(v));
                }
            }
            Opcode::AtomicResponse => {
                let Some(&FixedPayload::AtomicResponse(resp)) = rx.receiver.fixed_payload() else { return Ok(()) };
                // Responses come in request order: this one must
                // answer the oldest outstanding request, an Atomic.
                let unexpected = || {
                    TermCode::RdmapRemoteOperation(
                        crate::iwarp::terminate::RemoteOperationCode::UnexpectedOpcode,
                    )
                };
                let Some((id, lkey, addr)) = qp::atomic_sink(qp) else {
                    return Err(rx.receiver.reject(unexpected()));
                };
                if id != resp.request_id {
                    return Err(rx.receiver.reject(unexpected()));
                }
                // The sink was checked when the request was sent; a
                // sink deregistered since then fails the request.
                let placed = check_remote(qp, lkey, addr, 8, Access::LOCAL_WRITE).is_ok_and(|m| {
                    m.is_some_and(|m| {
                        m.translate(addr, 8, |kva, n| {
                            let v = resp.original_value.to_ne_bytes();
                            // SAFETY: `kva` was resolved through the
                            // sink region just checked.
                            unsafe { kmem::copy_to(kva, v.get(..n).unwrap_or(&[])) };
                        })
                        .is_ok()
                    })
                });
                if !placed {
                    qp::fail_oldest(qp, WcStatus::LocProtErr);
                    return Err(rx.receiver.reject(TermCode::RdmapLocalCatastrophic(0xff)));
                }
                qp::response_done(qp);
                *kick = true;
            }
            Opcode::RdmaReadResponse => {
                if d.message_len.is_some() {
                    rx.tagged = None;
                    // A last segment short of the size asked for
                    // leaves the sink partly unwritten.
                    let got = core::mem::take(&mut rx.resp_off);
                    let sink = qp::read_sink(qp);
                    if sink.is_some_and(|(_, _, len, _)| got != len) {
                        return Err(rx.receiver.reject(TermCode::DdpTagged(TaggedCode::BaseBounds)));
                    }
                    if let Some((_, _, _, Some(inv))) = sink {
                        if let Some(m) = mem::lookup(qp::stags(qp), inv) {
                            let _ = m.invalidate(inv);
                        }
                    }
                    qp::response_done(qp);
                    *kick = true;
                }
            }
            Opcode::RdmaReadRequest | Opcode::AtomicRequest => {
                if let Some(job) = rx.inbound.take() {
                    if qp::queue_response(qp, job).is_err() {
                        return Err(rx.receiver.reject(TermCode::DdpUntagged(
                            crate::iwarp::terminate::UntaggedCode::MsnNoBuffer,
                        )));
                    }
                    *kick = true;
                }
            }
            Opcode::Terminate => {
                if let Some(&FixedPayload::Terminate(t)) = rx.receiver.fixed_payload() {
                    match t {
                        Ok(t) => {
                            if net::peer_log_allowed() {
                                pr_info!("qp {}: peer sent TERMINATE {:?}\n", qp.qp_num(), t.code.wire());
                            }
                            rx.peer_code = Some(t.code);
                        }
                        Err(_) => {
                            if net::peer_log_allowed() {
                                pr_info!("qp {}: peer sent a malformed TERMINATE\n", qp.qp_num());
                            }
                        }
                    }
                }
                // The stream ends here; no TERMINATE goes back.
                rx.peer_terminated = true;
                return Ok(());
            }
        }
        Ok(())
    }

    /// Starts teardown (idempotent): `term` is sent first if given.
    pub(crate) fn close(&self, term: Option<TerminateRepr>) {
        if let Some(t) = term {
            let mut slot = self.term.lock();
            if slot.is_none() {
                *slot = Some(t);
            }
        }
        if self.closing.swap(true, Ordering::AcqRel) {
            return;
        }
        pr_debug!("qp {}: closing\n", self.qp().qp_num());
        // The connection keeps itself alive through the QP's link to it
        // until `teardown` unlinks it; find that reference.
        let Some(me) = qp::conn_of(self.qp()) else { return };
        // `closing` makes this the only time the item is queued.
        if crate::wq::cm().enqueue::<_, TEARDOWN>(me).is_err() {
            pr_err!("qp {}: connection teardown queued twice\n", self.qp().qp_num());
        }
    }

    /// The QP failed locally (a process's malformed work request): the
    /// connection ends with a TERMINATE (RDMAP, local catastrophic error,
    /// as upstream siw sends for it) and the QP reports a fatal error.
    pub(crate) fn close_local_error(&self) {
        self.failed.store(true, Ordering::Release);
        self.close(Some(local_catastrophic()));
    }

    /// Graceful close: send what is queued, then close.
    pub(crate) fn close_graceful(self: &Arc<Self>) {
        self.graceful.store(true, Ordering::Release);
        self.kick();
    }

    fn teardown(self: Arc<Self>) {
        let qp = self.qp();
        if let Some(a) = self.attached.lock().take() {
            self.sock.detach(a);
        }
        // Hold the transmitter off for good: once this wins `tx_busy`, no
        // transmit runs or is queued (a queued one runs, finds `closing` and
        // clears it), and none can start, since `claim_tx` fails from then
        // on. So no transmit of this connection touches the QP after
        // `conn_closed` below lets its destroy go on. Sleeping lets a queued
        // item run on another worker of this CPU.
        while self.tx_busy.swap(true, Ordering::SeqCst) {
            crate::wq::sleep_us(100);
        }
        let term = self.term.lock().take();
        if let Some(t) = term {
            let mut buf = [0u8; 128];
            let mut tx = self.tx.lock();
            let mut crc = Crc32c::new();
            if let Ok(n) = tx.transmitter.emit_message(&Message::Terminate(t), &[], &mut crc, &mut buf) {
                self.sock.set_timeouts(1000, 1000);
                // Staged FPDUs go first: the TERMINATE must start where an
                // FPDU would.
                let staged = tx.stage.get(tx.stage_sent..tx.staged).unwrap_or(&[]);
                let _ = self.sock.send_all(&[staged, buf.get(..n).unwrap_or(&[])]);
            }
        }
        self.sock.shutdown();
        // A receive the stream was filling when it ended (a Send cut short,
        // refused for its CRC, ...), or one taken for the message after it,
        // is out of the receive queue: flush it first, it is older than
        // those still queued. A receive running
        // meanwhile (it passed the `closing` check before `close`) is done
        // once the lock is had; `ended` stops any later one from taking
        // another.
        let taken = {
            let mut rx = self.rx.lock();
            rx.ended = true;
            rx.take_recv()
        };
        if let Some(w) = taken {
            qp::complete_recv(qp, w, WcStatus::WrFlushErr, 0, false, RecvKind::Send { invalidated: None });
        }
        // Zero-copy sends still in flight get a moment for the peer's
        // acknowledgement (the FIN or TERMINATE follows them): flushed,
        // their buffers would be the consumer's again while the stack may
        // still send from them. A peer that does not answer in time is
        // not waited for.
        let mut waited = 0;
        while waited < ZC_TEARDOWN_WAIT_MS && qp::releases_pending(qp) {
            crate::wq::sleep_us(1000);
            waited += 1;
        }
        // Releases complete nothing from now on: the QP is flushed below
        // and may go once the connection unlinks.
        self.zc.close();
        // The message in flight is flushed too (its memory references go),
        // in order between the requests awaiting responses and the queue.
        let cur = {
            let mut tx = self.tx.lock();
            tx.segs.clear();
            tx.cur.take()
        };
        qp::to_error(qp, cur.and_then(|c| c.wqe));
        if self.failed.load(Ordering::Acquire) {
            let ev = if self.access_error.load(Ordering::Acquire) {
                AsyncEvent::QpAccessErr
            } else {
                AsyncEvent::QpFatal
            };
            qp.event(ev);
        }
        // The receive path gave back its SRQ entries above, and the QP is
        // in ERROR now: it takes no more.
        qp::srq_released(qp);
        // CLOSE only after the event that made the connection up (see
        // `up`), which delivers it if this came first.
        let cm = {
            let mut link = self.cm.lock();
            if link.up {
                link.id.take()
            } else {
                link.close_held = true;
                None
            }
        };
        if let Some(cm) = cm {
            self.report(&cm, CmEventKind::Close);
        }
        qp::conn_closed(qp);
    }

    /// The peer closed or reset the connection.
    fn peer_closed(&self) {
        if self.closing.load(Ordering::Acquire) {
            return;
        }
        // (The callbacks that call this are attached only once the CM
        // knows the connection is up; `up` is checked all the same.)
        let cm = {
            let link = self.cm.lock();
            if link.up { link.id.clone() } else { None }
        };
        if let Some(cm) = cm {
            self.report(&cm, CmEventKind::Disconnect);
        }
        self.close(None);
    }

    /// Reports a connection event (no private data) to the CM.
    fn report(&self, cm: &CmId, kind: CmEventKind) {
        let (local, remote) = self.addrs();
        cm.deliver(&CmEvent {
            kind,
            status: 0,
            local,
            remote,
            private_data: &[],
            provider_data: 0,
            ird: 0,
            ord: 0,
        });
    }
}

impl SockHandler for Conn {
    fn data_ready(this: ArcBorrow<'_, Self>, sk: &SockRef) {
        if this.receive(sk) {
            let me: Arc<Conn> = this.into();
            me.kick();
        }
    }

    fn write_space(this: ArcBorrow<'_, Self>) {
        let me: Arc<Conn> = this.into();
        me.kick_stream();
    }

    fn state_change(this: ArcBorrow<'_, Self>, established: bool) {
        if !established {
            this.peer_closed();
        }
    }
}

fn local_catastrophic() -> TerminateRepr {
    TerminateRepr::new(TermCode::RdmapLocalCatastrophic(0xff))
}

/// Validates the target of an inbound Atomic Request: 8 aligned bytes of
/// a region the peer may run atomics on. Like a Read Request's source, the
/// Remote STag is RDMAP's to check (RFC 7306 follows RFC 5040 here), so a
/// violation is an RDMAP Remote Protection error.
fn check_atomic_target(qp: &Qp<SiwRs>, req: &AtomicRequest) -> core::result::Result<Arc<Mem>, TermCode> {
    if !req.is_aligned() {
        return Err(TermCode::RdmapRemoteOperation(
            crate::iwarp::terminate::RemoteOperationCode::Unspecified,
        ));
    }
    match check_remote(qp, req.remote_stag, req.remote_to, 8, Access::REMOTE_ATOMIC) {
        Ok(Some(m)) => Ok(m),
        Ok(None) => Err(read_source_code(AccessError::Bounds)),
        Err(e) => Err(read_source_code(e)),
    }
}

/// Runs an Atomic Request on its (checked) target; returns the original
/// value. The update is one atomic read-modify-write of the word, so
/// concurrent Atomics from any QP, and the CPU's own atomics, see it whole.
fn execute_atomic(mem: &Mem, req: &AtomicRequest) -> core::result::Result<u64, AccessError> {
    let mut original = None;
    mem.translate(req.remote_to, 8, |kva, n| {
        if original.is_none() && n == 8 && kva % 8 == 0 {
            // SAFETY: `kva` was resolved through the region checked when
            // the request arrived (which the job holds), is 8-byte aligned,
            // and siw_rs touches a word only this way while running an
            // Atomic.
            original = Some(unsafe { kmem::update_u64(kva, |cur| req.apply(cur)) });
        }
    })?;
    original.ok_or(AccessError::Bounds)
}

/// The RFC 7306 Immediate Data of a verbs immediate value (network order
/// in memory): its four octets, then four zero octets.
fn immediate_of(imm: u32) -> ImmediateData {
    let mut data = [0u8; 8];
    data[..4].copy_from_slice(&imm.to_ne_bytes());
    ImmediateData { data }
}

/// The verbs immediate value (network order in memory) of received
/// Immediate Data: its first four octets.
fn imm_of(imm: &ImmediateData) -> u32 {
    u32::from_ne_bytes([imm.data[0], imm.data[1], imm.data[2], imm.data[3]])
}

/// The TERMINATE code for a refused remote access to a tagged buffer.
fn remote_code(e: AccessError) -> TermCode {
    match e {
        AccessError::InvalidStag | AccessError::Invalidated => TermCode::DdpTagged(TaggedCode::InvalidStag),
        AccessError::WrongPd => TermCode::DdpTagged(TaggedCode::StagNotAssociated),
        AccessError::Bounds => TermCode::DdpTagged(TaggedCode::BaseBounds),
        AccessError::Rights => TermCode::RdmapRemoteProtection(RemoteProtectionCode::AccessRights),
    }
}

/// The TERMINATE code for a refused RDMA Read Request: RFC 5040 section
/// 4.4 has RDMAP, not DDP, validate the Data Source STag and TO, so these
/// are RDMAP Remote Protection errors (layer 0, type 1).
fn read_source_code(e: AccessError) -> TermCode {
    TermCode::RdmapRemoteProtection(match e {
        AccessError::InvalidStag | AccessError::Invalidated => RemoteProtectionCode::InvalidStag,
        AccessError::WrongPd => RemoteProtectionCode::StagNotAssociated,
        AccessError::Bounds => RemoteProtectionCode::BaseBounds,
        AccessError::Rights => RemoteProtectionCode::AccessRights,
    })
}

/// Checks a remote access of `len` bytes at (`stag`, `to`). A zero-length
/// access names no memory and is not checked (RFC 6581 RTR messages).
fn check_remote(qp: &Qp<SiwRs>, stag: u32, to: u64, len: u32, rights: u32) -> core::result::Result<Option<Arc<Mem>>, AccessError> {
    if len == 0 {
        return Ok(None);
    }
    let m = mem::lookup(qp::stags(qp), stag).ok_or(AccessError::InvalidStag)?;
    m.check(stag, qp.pd().id(), to, u64::from(len), rights)?;
    Ok(Some(m))
}

/// Resolves local SGEs (send sources) into kernel virtual ranges, added to
/// `segs`.
fn resolve_local(qp: &Qp<SiwRs>, sges: &[Sge], rights: u32, segs: &mut Segs) -> core::result::Result<(), AccessError> {
    for s in sges {
        if s.length == 0 {
            continue;
        }
        let m = mem::lookup(qp::stags(qp), s.lkey).ok_or(AccessError::InvalidStag)?;
        m.check(s.lkey, qp.pd().id(), s.addr, u64::from(s.length), rights)?;
        segs.add(m, s.addr, u64::from(s.length))?;
    }
    Ok(())
}

/// Copies the octets of local SGEs (a small send's payload) into `dst`,
/// in order, checking each access as [`resolve_local`] does.
fn copy_local(qp: &Qp<SiwRs>, sges: &[Sge], rights: u32, dst: &mut [u8]) -> core::result::Result<(), AccessError> {
    let mut off = 0usize;
    for s in sges.iter().filter(|s| s.length > 0) {
        let end = off.saturating_add(s.length as usize);
        let part = dst.get_mut(off..end).ok_or(AccessError::Bounds)?;
        // At most MAX_INLINE octets in all: copied under the table's lock.
        mem::with(qp::stags(qp), s.lkey, |m| m.copy_out(s.lkey, qp.pd().id(), s.addr, rights, part))?;
        off = end;
    }
    Ok(())
}

/// Appends the kernel virtual ranges of `len` bytes at `addr` in `m` to
/// `v`, allocating room first (the translation runs under a spinlock).
fn push_ranges(v: &mut KVec<(u64, usize)>, m: &Mem, addr: u64, len: u64) -> core::result::Result<(), AccessError> {
    v.reserve(m.max_ranges(len), GFP_KERNEL).map_err(|_| AccessError::Bounds)?;
    let mut err = false;
    m.translate(addr, len, |kva, n| {
        // Never allocates: the room was reserved above.
        if v.push((kva, n), GFP_NOWAIT).is_err() {
            err = true;
        }
    })?;
    if err {
        Err(AccessError::Bounds)
    } else {
        Ok(())
    }
}

/// Checks a receive WQE's SGEs and returns their regions.
fn resolve_recv(qp: &Qp<SiwRs>, w: &RecvWqe) -> core::result::Result<[Option<Arc<Mem>>; qp::NSGE], AccessError> {
    let mut mems: [Option<Arc<Mem>>; qp::NSGE] = Default::default();
    for (slot, s) in mems.iter_mut().zip(w.sges.iter().take(usize::from(w.nsge))) {
        if s.length == 0 {
            continue;
        }
        let m = mem::lookup(qp::stags(qp), s.lkey).ok_or(AccessError::InvalidStag)?;
        m.check(s.lkey, qp.pd().id(), s.addr, u64::from(s.length), Access::LOCAL_WRITE)?;
        *slot = Some(m);
    }
    Ok(mems)
}

/// Copies `data` to message offset `mo` of a receive WQE's buffers. The
/// protocol core has checked `mo + data.len()` against the WQE's length.
fn place_recv(w: &RecvWqe, mems: &[Option<Arc<Mem>>; qp::NSGE], mo: u32, data: &[u8]) {
    let mut skip = mo as u64;
    let mut src = data;
    for (s, m) in w.sges.iter().zip(mems.iter()).take(usize::from(w.nsge)) {
        if src.is_empty() {
            break;
        }
        let len = u64::from(s.length);
        if skip >= len {
            skip -= len;
            continue;
        }
        let n = (len - skip).min(src.len() as u64);
        let (now, later) = src.split_at(n as usize);
        if let Some(m) = m {
            let mut off = 0usize;
            let _ = m.translate(s.addr + skip, n, |kva, k| {
                let part = now.get(off..off + k).unwrap_or(&[]);
                // SAFETY: `kva` lies in the SGE's registered range, checked
                // for local write in `resolve_recv`.
                unsafe { kmem::copy_to(kva, part) };
                off += k;
            });
        }
        src = later;
        skip = 0;
    }
}
